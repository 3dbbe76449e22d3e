"""SwiGLU activation: silu(gate) * up."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.launch import FastLaunch
from kernels.pdl import chain_launch, has_pdl


@triton.jit
def _silu_and_mul_kernel(
    out_ptr,
    x_ptr,
    d,
    stride_x_t,
    stride_o_t,
    BLOCK: tl.constexpr,
    TRIGGER: tl.constexpr,
    WAIT: tl.constexpr,
):
    if WAIT:  # launched as a programmatic dependent: the previous kernel must finish first
        tl.extra.cuda.gdc_wait()
    if TRIGGER:  # a programmatic dependent (the down projection's INT4 GEMM) may launch now
        tl.extra.cuda.gdc_launch_dependents()
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < d
    gate = tl.load(x_ptr + token * stride_x_t + offs, mask=mask, other=0.0)
    up = tl.load(x_ptr + token * stride_x_t + d + offs, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    # silu is rounded to x's dtype before the product, as the reference's two torch ops do.
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    y = act * up.to(tl.float32)
    tl.store(out_ptr + token * stride_o_t + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


_SILU_AND_MUL = FastLaunch(_silu_and_mul_kernel)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Triton version of :func:`silu_and_mul_ref`: [..., 2 * d] -> [..., d] in x's dtype.

    Leading dimensions are flattened into tokens; rows may be strided.
    """
    if x.dim() == 0 or x.shape[-1] % 2 != 0:
        raise ValueError(f"x's last dimension must be even (gate then up), got {tuple(x.shape)}")
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty((x2.shape[0], d), dtype=x.dtype, device=x.device)
    if x2.shape[0] > 0 and d > 0:
        block = min(triton.next_power_of_2(d), 1024)
        wait = chain_launch(x.device)
        _SILU_AND_MUL[(x2.shape[0], triton.cdiv(d, block))](
            out, x2, d, x2.stride(0), out.stride(0), BLOCK=block, TRIGGER=has_pdl(x.device),
            WAIT=wait, **({"launch_pdl": True} if wait else {}),
        )  # fmt: skip
    return out.view(*x.shape[:-1], d)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, 2 * intermediate] (gate first, then up) -> [num_tokens, intermediate]."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]
