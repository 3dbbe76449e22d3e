"""The per-layer operations, bound once per device: Triton kernels on CUDA, references on CPU.

On CPU: the C++ kernels of ``kernels.cpu_kernels`` (paged attention whose decode rows read the
cache blocks in place, and one-pass versions of the other ops), each falling back to its
PyTorch reference where it cannot be built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from kernels.cpu_kernels import (
    paged_attention_cpu,
    reshape_and_cache_cpu,
    rms_norm_cpu,
    rotary_embedding_cpu,
    silu_and_mul_cpu,
)
from kernels.paged_attention import paged_attention_ref
from kernels.reshape_and_cache import reshape_and_cache_ref
from kernels.rms_norm import rms_norm_ref
from kernels.rotary_embedding import rotary_embedding_ref
from kernels.silu_and_mul import silu_and_mul_ref


@dataclass(frozen=True)
class Ops:
    """One implementation of every layer op; all share the reference signatures."""

    name: str
    paged_attention: Callable
    reshape_and_cache: Callable
    rms_norm: Callable
    rotary_embedding: Callable
    silu_and_mul: Callable


REFERENCE_OPS = Ops(
    name="torch-reference",
    paged_attention=paged_attention_ref,
    reshape_and_cache=reshape_and_cache_ref,
    rms_norm=rms_norm_ref,
    rotary_embedding=rotary_embedding_ref,
    silu_and_mul=silu_and_mul_ref,
)


CPU_OPS = replace(
    REFERENCE_OPS,
    name="cpu",
    paged_attention=paged_attention_cpu,
    reshape_and_cache=reshape_and_cache_cpu,
    rms_norm=rms_norm_cpu,
    rotary_embedding=rotary_embedding_cpu,
    silu_and_mul=silu_and_mul_cpu,
)


def triton_ops() -> Ops:
    """The Triton kernels (imported only when asked for, so CPU-only installs never compile)."""
    from kernels.paged_attention import paged_attention
    from kernels.reshape_and_cache import reshape_and_cache
    from kernels.rms_norm import rms_norm
    from kernels.rotary_embedding import rotary_embedding
    from kernels.silu_and_mul import silu_and_mul

    return Ops(
        name="triton",
        paged_attention=paged_attention,
        reshape_and_cache=reshape_and_cache,
        rms_norm=rms_norm,
        rotary_embedding=rotary_embedding,
        silu_and_mul=silu_and_mul,
    )


def ops_for_device(device: torch.device) -> Ops:
    """Triton on CUDA, the CPU ops elsewhere."""
    return triton_ops() if device.type == "cuda" else CPU_OPS
