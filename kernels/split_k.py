"""Split-K outputs of the INT4 kernels: the epilogue modes of ``int4_tiles._epilogue``.

MODE 0 stores (one split); MODE 3 stores each split's partial tile in its own slot of an fp32
workspace ([split, M, N], plain stores), and the last split of a tile (a ticket from its lock)
adds the slots in split order and writes the output; MODE 2 adds each split into a
self-cleaning fp32 workspace with atomics, and the last split writes the output and zeroes
both again; MODE 1, inside a CUDA graph capture that would have to grow the workspace, adds
into a zeroed fp32 output that is cast afterwards.

The tiled kernels use MODE 3: at M = 16-64 the scalar fp32 atomics of MODE 2 took up to half
the time of a split-K call on the H200 (BENCHMARKS.md, "INT4 GEMM", seventh session). The gemv
(one row per program) keeps MODE 2, whose last split reads one sum instead of every slot.
"""

from __future__ import annotations

import torch

_WORKSPACES: dict[tuple[torch.device, bool], tuple[torch.Tensor, torch.Tensor]] = {}
# Workspaces that a bigger one replaced. A CUDA graph captured before the growth still holds
# their addresses, so they are kept alive: freed, the caching allocator would hand their
# memory to other tensors, and each replay of that graph would write into them.
_RETIRED: list[tuple[torch.Tensor, torch.Tensor]] = []


def workspace(device: torch.device, num_floats: int, num_locks: int, slots: bool = False):
    """The self-cleaning split-K workspace of a device (zeros between calls; with ``slots`` the
    slot workspace of MODE 3, whose values are left behind, only its locks reset), or None
    when it would have to grow inside a CUDA graph capture (the caller then uses MODE 1).
    It grows at least twofold, and the one it replaces stays allocated (``_RETIRED``)."""
    ws, locks = _WORKSPACES.get((device, slots), (None, None))
    if ws is not None and ws.numel() >= num_floats and locks.numel() >= num_locks:
        return ws, locks
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    size, lock_size = max(num_floats, 1 << 16), max(num_locks, 1 << 12)
    if ws is not None:  # at least twice what is short, and never less than before
        _RETIRED.append((ws, locks))
        size = max(size, ws.numel() * (2 if ws.numel() < num_floats else 1))
        lock_size = max(lock_size, locks.numel() * (2 if locks.numel() < num_locks else 1))
    _WORKSPACES[device, slots] = (
        torch.zeros(size, dtype=torch.float32, device=device),
        torch.zeros(lock_size, dtype=torch.int32, device=device),
    )
    return _WORKSPACES[device, slots]


def split_k_output(
    x: torch.Tensor, m: int, n: int, num_splits: int, num_tiles: int, slots: bool = False
):
    """(mode, out, workspace, locks) for the epilogue: MODE 0 stores, MODE 2 reduces splits in
    the self-cleaning workspace, MODE 3 (``slots``: kernels whose epilogue has it) stores each
    split in its own slot of the workspace and the last split adds them, MODE 1 (inside a
    capture that would grow the workspace) adds atomically into a zeroed fp32 output that is
    cast afterwards."""
    if num_splits == 1:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        return 0, out, out, out
    found = workspace(x.device, m * n * (num_splits if slots else 1), num_tiles, slots)
    if found is None:
        out = torch.zeros((m, n), dtype=torch.float32, device=x.device)
        return 1, out, out, out
    return 3 if slots else 2, torch.empty((m, n), dtype=x.dtype, device=x.device), *found
