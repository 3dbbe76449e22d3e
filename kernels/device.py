"""Facts about a CUDA device the launchers size their grids by, looked up once per device."""

from __future__ import annotations

import functools

import torch


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _multiprocessors(index)
