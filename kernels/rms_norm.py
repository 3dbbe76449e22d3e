"""RMSNorm with an optional fused residual add."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.launch import FastLaunch
from kernels.pdl import chain_launch, has_pdl


@triton.jit
def _rms_norm_kernel(
    out_ptr,
    new_residual_ptr,
    x_ptr,
    residual_ptr,
    weight_ptr,
    hidden,
    eps,
    stride_x_t,
    stride_r_t,
    stride_o_t,
    stride_nr_t,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    TRIGGER: tl.constexpr,
    WAIT: tl.constexpr,
):
    if WAIT:  # launched as a programmatic dependent: the previous kernel must finish first
        tl.extra.cuda.gdc_wait()
    if TRIGGER:  # a programmatic dependent (the INT4 GEMM that follows) may launch now
        tl.extra.cuda.gdc_launch_dependents()
    token = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + token * stride_x_t + offs, mask=mask, other=0.0)
    h = x.to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + token * stride_r_t + offs, mask=mask, other=0.0)
        h = h + r.to(tl.float32)
        tl.store(new_residual_ptr + token * stride_nr_t + offs, h.to(x.dtype), mask=mask)
    rstd = tl.rsqrt(tl.sum(h * h, 0) / hidden + eps)
    # Round the normalized value to x's dtype before the weight, as the reference does.
    normed = (h * rstd).to(x.dtype).to(tl.float32)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(
        out_ptr + token * stride_o_t + offs, (normed * w).to(out_ptr.dtype.element_ty), mask=mask
    )


_RMS_NORM = FastLaunch(_rms_norm_kernel)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`rms_norm_ref`: same arguments, same results (new tensors).

    The output dtype follows torch's promotion of ``x`` and ``weight``, as the reference's.
    Leading dimensions of ``x`` are flattened into tokens; rows may be strided.
    """
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise ValueError(f"weight must be [{hidden}] (x's last dim), got {tuple(weight.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual must match x {tuple(x.shape)}, got {tuple(residual.shape)}")
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    weight = weight.contiguous()
    if residual is not None:
        r2 = residual.reshape(-1, hidden)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        new_residual = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    else:
        r2 = new_residual = x2  # never read or written by the kernel
    num_tokens = x2.shape[0]
    if num_tokens > 0:
        block = triton.next_power_of_2(hidden)
        num_warps = 4 if block <= 1024 else (8 if block <= 4096 else 16)
        wait = chain_launch(x.device)
        _RMS_NORM[(num_tokens,)](
            out, new_residual, x2, r2, weight, hidden, eps,
            x2.stride(0), r2.stride(0), out.stride(0), new_residual.stride(0),
            HAS_RESIDUAL=residual is not None, BLOCK=block, TRIGGER=has_pdl(x.device),
            WAIT=wait, num_warps=num_warps, **({"launch_pdl": True} if wait else {}),
        )  # fmt: skip
    out = out.view(x.shape)
    if residual is not None:
        return out, new_residual.view(x.shape)
    return out


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dimension, computed in fp32.

    x: [num_tokens, hidden]; weight: [hidden]; residual: [num_tokens, hidden] or None.
    Without ``residual``: returns ``norm(x) * weight``.
    With ``residual``: ``h = x + residual``; returns ``(norm(h) * weight, h)``, the second being
    the new residual stream (what the next layer adds to).
    """
    if residual is not None:
        h = x.float() + residual.float()
        new_residual = h.to(x.dtype)
    else:
        h = x.float()
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        y = F.rms_norm(h, (h.shape[-1],), weight, eps)  # the same formula, fused
    else:
        var = h.pow(2).mean(dim=-1, keepdim=True)
        y = (h * torch.rsqrt(var + eps)).to(x.dtype) * weight
    if residual is not None:
        return y, new_residual
    return y
