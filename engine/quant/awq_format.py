"""AWQ (AutoAWQ GEMM format) checkpoint tensors -> the canonical INT4 form.

- ``qweight`` int32 [K, N // 8] and ``qzeros`` int32 [G, N // 8]: packed along N, with the
  interleaved order [0, 2, 4, 6, 1, 3, 5, 7]: the nibble in bits 4*i of packed column c holds
  column 8*c + AWQ_ORDER[i].
- ``scales`` fp16 [G, N]; value = scale * (q - zero), no "+1" convention.
"""

from __future__ import annotations

import torch

from engine.quant.packing import make_int4_weight
from kernels.int4_gemm import Int4Weight

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C // 8] in AWQ order -> int32 [R, C] in natural column order."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    slots = (packed.unsqueeze(-1) >> shifts) & 0xF  # [R, C // 8, 8], slot i
    inverse = torch.argsort(torch.tensor(AWQ_ORDER, device=packed.device))
    return slots[..., inverse].reshape(packed.shape[0], -1)


def awq_to_int4(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    *,
    bits: int = 4,
    dtype: torch.dtype | None = None,
) -> Int4Weight:
    """Convert one AWQ linear layer: qweight [K, N // 8], qzeros [G, N // 8], scales [G, N]."""
    if bits != 4:
        raise ValueError(f"only 4-bit AWQ is supported, got bits={bits}")
    if qweight.dtype != torch.int32 or qweight.dim() != 2:
        raise ValueError(f"AWQ qweight must be int32 [K, N // 8], got {qweight.dtype}")
    k, n = qweight.shape[0], qweight.shape[1] * 8
    num_groups = scales.shape[0]
    if tuple(scales.shape) != (num_groups, n) or k % num_groups:
        raise ValueError(
            f"AWQ scales must be [G, {n}] with G dividing K={k}, got {tuple(scales.shape)}"
        )
    if tuple(qzeros.shape) != (num_groups, n // 8):
        raise ValueError(f"AWQ qzeros must be [{num_groups}, {n // 8}], got {tuple(qzeros.shape)}")
    codes = unpack_awq(qweight)  # [K, N]
    zeros = unpack_awq(qzeros)  # [G, N]
    out_dtype = dtype or scales.dtype
    s = scales.float()
    offsets = (-zeros.float() * s).to(out_dtype)
    return make_int4_weight(codes.t(), s.to(out_dtype), offsets, k // num_groups)
