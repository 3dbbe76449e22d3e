"""Split-K outputs of the INT4 kernels: the epilogue modes of ``int4_tiles._epilogue``.

MODE 0 stores (one split); MODE 2 adds each split into a self-cleaning fp32 workspace, and the
last split of a tile (a ticket from its lock) writes the output and zeroes both again; MODE 1,
inside a CUDA graph capture that would have to grow the workspace, adds into a zeroed fp32
output that is cast afterwards.
"""

from __future__ import annotations

import torch

_WORKSPACES: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def workspace(device: torch.device, num_floats: int, num_locks: int):
    """The self-cleaning split-K workspace of a device (zeros between calls), or None when it
    would have to grow inside a CUDA graph capture (the caller then uses MODE 1)."""
    ws, locks = _WORKSPACES.get(device, (None, None))
    if ws is not None and ws.numel() >= num_floats and locks.numel() >= num_locks:
        return ws, locks
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    size = max(num_floats, 0 if ws is None else ws.numel(), 1 << 16)
    lock_size = max(num_locks, 0 if locks is None else locks.numel(), 1 << 12)
    _WORKSPACES[device] = (
        torch.zeros(size, dtype=torch.float32, device=device),
        torch.zeros(lock_size, dtype=torch.int32, device=device),
    )
    return _WORKSPACES[device]


def split_k_output(x: torch.Tensor, m: int, n: int, num_splits: int, num_tiles: int):
    """(mode, out, workspace, locks) for the epilogue: MODE 0 stores, MODE 2 reduces splits in
    the self-cleaning workspace, MODE 1 (inside a capture that would grow it) adds atomically
    into a zeroed fp32 output that is cast afterwards."""
    if num_splits == 1:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        return 0, out, out, out
    found = workspace(x.device, m * n, num_tiles)
    if found is None:
        out = torch.zeros((m, n), dtype=torch.float32, device=x.device)
        return 1, out, out, out
    return 2, torch.empty((m, n), dtype=x.dtype, device=x.device), *found
