"""GPTQ checkpoint tensors <-> the canonical INT4 form.

GPTQ (AutoGPTQ / GPTQModel / transformers' GPTQ integration), 4 bits:

- ``qweight`` int32 [K // 8, N]: packed along K, input row k in bits 4*(k%8) of row k//8.
- ``qzeros`` int32 [G, N // 8]: packed along N the same way.
- ``scales`` fp16 [G, N]; ``g_idx`` int32 [K]: the group of each input row (act-order
  checkpoints have a non-monotone ``g_idx``).
- value = scale * (q - zero). In the original ("v1", ``checkpoint_format="gptq"``) format the
  stored zero is ``zero - 1`` and readers add the 1 back; ``gptq_v2`` stores ``zero`` itself.

Act-order is handled once at load: input rows are sorted by group (``in_perm``), so groups
are contiguous for the kernel, and activations are gathered with the same permutation.
"""

from __future__ import annotations

import math

import torch

from engine.quant.packing import make_int4_weight
from kernels.int4_gemm import Int4Weight

CHECKPOINT_FORMATS = ("gptq", "gptq_v2")


def unpack_along_rows(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R // 8, C] -> int32 [R, C]: row r from bits 4*(r%8) of packed row r//8."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    codes = (packed.unsqueeze(1) >> shifts.view(1, 8, 1)) & 0xF
    return codes.reshape(-1, packed.shape[1])


def unpack_along_cols(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C // 8] -> int32 [R, C]: column c from bits 4*(c%8) of packed column c//8."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    return ((packed.unsqueeze(-1) >> shifts) & 0xF).reshape(packed.shape[0], -1)


def pack_along_rows(codes: torch.Tensor) -> torch.Tensor:
    """int [R, C] 0..15 -> int32 [R // 8, C] (inverse of ``unpack_along_rows``)."""
    r, c = codes.shape
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=codes.device).view(1, 8, 1)
    return (codes.to(torch.int32).reshape(r // 8, 8, c) << shifts).sum(1, dtype=torch.int32)


def pack_along_cols(codes: torch.Tensor) -> torch.Tensor:
    """int [R, C] 0..15 -> int32 [R, C // 8] (inverse of ``unpack_along_cols``)."""
    r, c = codes.shape
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=codes.device)
    return (codes.to(torch.int32).reshape(r, c // 8, 8) << shifts).sum(-1, dtype=torch.int32)


def gptq_to_int4(
    qweight: torch.Tensor,
    qzeros: torch.Tensor | None,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None = None,
    *,
    bits: int = 4,
    checkpoint_format: str = "gptq",
    group_size: int | None = None,
    dtype: torch.dtype | None = None,
) -> Int4Weight:
    """Convert one GPTQ linear layer to the canonical form.

    qweight int32 [K // 8, N]; qzeros int32 [G, N // 8] or None (symmetric, zero 8);
    scales [G, N]; g_idx [K] or None (rows in group order). ``group_size`` (the checkpoint's,
    -1 for per-channel) is needed only when it does not divide K: GPTQ's last group is then
    shorter, and the canonical form uses gcd(group_size, K)-sized groups with repeated scales.
    ``dtype`` of the scales and offsets defaults to the checkpoint's scales dtype.
    """
    if bits != 4:
        raise ValueError(f"only 4-bit GPTQ is supported, got bits={bits}")
    if checkpoint_format not in CHECKPOINT_FORMATS:
        raise ValueError(
            f"checkpoint_format must be one of {CHECKPOINT_FORMATS}, got {checkpoint_format!r}"
        )
    if qweight.dtype != torch.int32 or qweight.dim() != 2:
        raise ValueError(f"GPTQ qweight must be int32 [K // 8, N], got {qweight.dtype}")
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    num_groups = scales.shape[0]
    if group_size is None or group_size == -1 or group_size >= k:
        group_size = k // num_groups if num_groups and k % num_groups == 0 else -1
    if group_size <= 0 or group_size % 8 or -(-k // group_size) != num_groups:
        raise ValueError(
            f"GPTQ scales {tuple(scales.shape)} do not match K={k}, N={n} and group_size "
            f"{group_size}: expected [ceil(K / group_size), N]"
        )
    if tuple(scales.shape) != (num_groups, n):
        raise ValueError(f"GPTQ scales must be [G, {n}], got {tuple(scales.shape)}")
    codes = unpack_along_rows(qweight)  # [K, N]
    if qzeros is None:
        zeros = torch.full((num_groups, n), 8, dtype=torch.int32, device=qweight.device)
    else:
        zeros = unpack_along_cols(qzeros)[:, :n]
        if tuple(zeros.shape) != (num_groups, n):
            raise ValueError(
                f"GPTQ qzeros must be [{num_groups}, {n} // 8], got {tuple(qzeros.shape)}"
            )
        if checkpoint_format == "gptq":
            zeros = zeros + 1
    natural = torch.arange(k, device=qweight.device) // group_size
    in_perm = None
    if g_idx is not None:
        g_idx = g_idx.to(torch.int64)
        if tuple(g_idx.shape) != (k,):
            raise ValueError(f"GPTQ g_idx must have shape [{k}], got {tuple(g_idx.shape)}")
        sorted_idx, perm = torch.sort(g_idx, stable=True)
        if not torch.equal(sorted_idx, natural):
            raise ValueError(
                f"GPTQ g_idx must put {group_size} input rows in each group (the last may be "
                "shorter); this checkpoint's groups have unequal sizes"
            )
        if not torch.equal(perm, torch.arange(k, device=perm.device)):
            in_perm = perm
            codes = codes.index_select(0, perm)
    # Canonical groups of gcd(group_size, K) rows; each maps to one checkpoint group.
    sub = math.gcd(group_size, k)
    source_group = natural[::sub]
    out_dtype = dtype or scales.dtype
    s = scales.float().index_select(0, source_group)
    offsets = (-zeros.float().index_select(0, source_group) * s).to(out_dtype)
    return make_int4_weight(codes.t(), s.to(out_dtype), offsets, sub, in_perm)
