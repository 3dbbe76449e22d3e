"""Dense linear layers on the CPU through oneDNN, the weight packed once at load.

``F.linear`` on a CPU calls the BLAS (MKL) on the plain row-major weight every time. At the
row counts of a decode step (a few to a few hundred tokens) and the narrow hidden sizes of
small models, that wastes much of the machine: on a 2-core AVX2 machine a [64, 576] x
[576, 3072] product ran at 61 GFLOP/s through ``F.linear`` with two threads and at 111 GFLOP/s
through oneDNN with the weight reordered once into its blocked layout
(``benchmarks/bench_cpu_linear.py``; BENCHMARKS.md, "Engine end to end"). This is what
PyTorch's own CPU compiler (inductor's ``mkldnn`` weight packing) and IPEX do for inference.

``pack_linear_weight`` returns the reordered weight (an opaque ``torch._mkldnn`` tensor) or
None where this PyTorch build or CPU cannot run it for that dtype, or where a one-time check
against ``F.linear`` on random data fails; callers then keep the dense weight.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)


@functools.cache
def packed_linear_supported(dtype: torch.dtype) -> bool:
    """Whether oneDNN linear runs here for ``dtype`` and agrees with ``F.linear``."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    if dtype not in (torch.float32, torch.bfloat16):
        return False
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 40, generator=gen).to(dtype)
    bias = torch.randn(48, generator=gen).to(dtype)
    x = torch.randn(7, 40, generator=gen).to(dtype)
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        got = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    except (RuntimeError, AttributeError) as exc:
        log.warning("oneDNN linear is unavailable (%s); using F.linear", exc)
        return False
    want = F.linear(x.float(), weight.float(), bias.float())
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    if got.shape != want.shape or not torch.allclose(got.float(), want, rtol=tol, atol=tol):
        log.warning("oneDNN linear disagrees with F.linear on this machine; using F.linear")
        return False
    return True


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` [out_features, in_features] reordered for ``packed_linear``, or None."""
    if weight.device.type != "cpu" or weight.dim() != 2:
        return None
    if not packed_linear_supported(weight.dtype):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with the weight from ``pack_linear_weight``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
