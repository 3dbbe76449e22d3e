"""Integer scratch that kernels leave all zero: counters and tickets, allocated once.

A kernel that counts arrivals with atomics (the decode attention's fused merge, the sampler's
persistent threshold search) needs zeros at every launch. Zeroing per call is a launch of its
own; instead each such kernel resets what it used before it ends, and its buffer is allocated
zeroed once per (device, owner) and reused.
"""

from __future__ import annotations

import torch

_BUFFERS: dict[tuple[torch.device, str], list[torch.Tensor]] = {}


def zeroed_int32(device: torch.device, size: int, owner: str) -> torch.Tensor:
    """An int32 buffer of at least ``size`` zeros on ``device`` for ``owner``'s kernels, which
    must leave it all zero after every launch. A buffer that grew is kept alive: captured CUDA
    graphs still point at it. Launches that share an owner's buffer must not overlap in time
    (one stream). During a CUDA graph capture a new buffer's zeroing is only recorded, so it is
    handed to that capture alone."""
    buffers = _BUFFERS.setdefault((device, owner), [])
    if buffers and buffers[-1].numel() >= size:
        return buffers[-1]
    zeros = torch.zeros(max(size, 4096), dtype=torch.int32, device=device)
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return zeros
    buffers.append(zeros)
    return zeros
