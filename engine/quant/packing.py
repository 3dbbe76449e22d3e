"""Pack and unpack 4-bit codes in the canonical layout (``kernels.int4_gemm.Int4Weight``)."""

from __future__ import annotations

import torch

from kernels.int4_gemm import Int4Weight
from kernels.int4_weight import pack_words, unpack_words


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] integers 0..15 -> int32 [N, K // 8], code k in bits 4*(k%8) of word k//8."""
    n, k = codes.shape
    if k % 8:
        raise ValueError(f"K must be a multiple of 8, got {k}")
    c = codes.to(torch.int32).reshape(n, k // 8, 8)
    if c.numel() and (int(c.min()) < 0 or int(c.max()) > 15):
        raise ValueError("4-bit codes must lie in 0..15")
    return pack_words(c)


def unpack_codes(qweight: torch.Tensor) -> torch.Tensor:
    """int32 [N, K // 8] -> codes int32 [N, K] (inverse of ``pack_codes``)."""
    return unpack_words(qweight).reshape(qweight.shape[0], -1)


def make_int4_weight(
    codes: torch.Tensor,
    scales: torch.Tensor,
    offsets: torch.Tensor,
    group_size: int,
    in_perm: torch.Tensor | None = None,
) -> Int4Weight:
    """Canonical weight from codes [N, K] (0..15, columns in stored order), scales and offsets
    [K // group_size, N], and the optional act-order permutation in_perm [K]."""
    return Int4Weight(
        pack_codes(codes).contiguous(),
        scales.contiguous(),
        offsets.contiguous(),
        group_size,
        None if in_perm is None else in_perm.to(torch.int64),
    )
