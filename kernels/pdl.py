"""Programmatic dependent launch (PDL, sm_90+): a kernel launched as a programmatic dependent
may start while the previous kernel on the stream is still running, and must call
``gdc_wait`` before touching any memory that kernel (or one before it) may write.

A kernel that calls ``gdc_launch_dependents`` on entry lets such a dependent be scheduled as
soon as all of its own programs have started; for a kernel whose successor is not a
programmatic dependent, the call does nothing.

The per-layer kernels (``chain_launch``: norms, rotary, cache writes, activation, and the
decode attention kernel when its grid is one wave or, reading K/V by TMA, when its splits go
to the merge kernel) are such dependents: each waits on entry and
only then lets its own dependent launch, so the launches of a decode step overlap the kernel
before them while at most one grid at a time waits early (the register mma INT4 kernels let
theirs launch on entry, the swapped kernel's weights-first form after its main loop; what
follows them waits).

Weights are read-only once built. The INT4 kernels' ``weights_first`` form
(``Int4GemmConfig.weights_first``) issues its first loads of a weight's words and scales
before ``gdc_wait``, so they stream in while the previous kernel finishes; only x, the output
and the split-K workspace wait. So a weight must never be written by a kernel that lets its
dependents start early (one that calls ``gdc_launch_dependents``: tidal's norms, attention,
activation and INT4 kernels, none of which writes a weight). Writes by torch's own kernels
and copies (``weight.copy_``) are safe: they never let a dependent start before they end.
"""

from __future__ import annotations

import functools
import os

import torch


@functools.cache
def _capability_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def is_sm90(device: torch.device) -> bool:
    """Whether ``device`` is a CUDA device of compute capability 9.0 or up (Hopper: wgmma,
    TMA, PDL); the capability is looked up once per device, as launchers ask on every call."""
    if device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _capability_major(index) >= 9


@functools.cache
def _multi_processors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """The number of multiprocessors of CUDA ``device``, looked up once per device (grid sizes
    of persistent and split launches follow from it)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _multi_processors(index)


def has_pdl(device: torch.device) -> bool:
    """Whether kernels on ``device`` can use PDL: CUDA devices of compute capability 9.0 up."""
    return is_sm90(device)


@functools.cache
def _chain_enabled() -> bool:
    return os.environ.get("TIDAL_PDL_CHAIN", "1") != "0"


def chain_launch(device: torch.device) -> bool:
    """Whether the per-layer kernels (norms, rotary, cache writes, activation, and the decode
    attention kernel where its grid fits one wave or its TMA splits go to the merge kernel)
    are launched as programmatic dependents:
    each waits for the previous kernel on entry and only then lets its own dependent launch,
    so every launch overlaps the kernel before it and no more than one grid waits early. On
    sm_90+, unless ``TIDAL_PDL_CHAIN=0`` (read once per process). On the H200 this took an
    8B-shaped INT4 model's batch-1 decode step from 2152-2164 to 2028 us of GPU time
    (BENCHMARKS.md, "Engine end to end", seventeenth session)."""
    return has_pdl(device) and _chain_enabled()
