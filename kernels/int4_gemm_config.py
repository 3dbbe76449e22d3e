"""Launch settings for ``kernels.int4_gemm``: one fixed table per shape bucket.

No autotuning at run time: a config depends only on (M bucket, N, K, group size), so the
same launch is replayed inside a CUDA graph. The table was
chosen from the sweep in ``benchmarks/bench_int4_gemm.py --sweep`` on an H200 (see
BENCHMARKS.md, "INT4 GEMM").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

STRATEGIES = ("gemv", "tiled", "mm", "dequant")


@dataclass(frozen=True)
class Int4GemmConfig:
    """How to run one INT4 GEMM.

    strategy: ``gemv`` (M small, reduction in registers, ``block_k`` K values per loop step
    across quantization groups), ``tiled`` (``tl.dot`` on raw codes, scale and offset per
    group tile; ``block_k`` capped at the group size), ``mm`` (large M: each weight tile
    dequantized in registers, one accumulating ``tl.dot`` chain) or ``dequant`` (dequantize,
    then cuBLAS). ``split_k`` > 1 splits K across programs and reduces with fp32 atomics.
    ``nibble`` (tiled): multiply each nibble position of the packed words by the matching
    slice of x (read as int32 pairs for 16-bit x) with codes as 16-bit floats by the
    magic-number trick, instead of unpacking to K order.
    """

    strategy: str
    block_m: int = 16
    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    nibble: bool = False

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        for name, least in (("block_m", 8), ("block_n", 4), ("block_k", 8)):
            v = getattr(self, name)
            if v < least or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= {least}, got {v}")
        if self.split_k < 1:
            raise ValueError(f"split_k must be >= 1, got {self.split_k}")


def _pow2_split(target: int, k: int, block_k: int, cap: int) -> int:
    """The smallest power of two >= target, capped, keeping >= block_k of K per split."""
    split = 1
    while split < target and split < cap and k // (2 * split) >= block_k:
        split *= 2
    return split


def choose_config(m: int, n: int, k: int, group_size: int, device: torch.device) -> Int4GemmConfig:
    """The table: strategy and tiles from the number of rows M and the weight's shape.

    From the H200 sweeps of 2026-11-29 (Llama-3-8B shapes, group 128; BENCHMARKS.md, "INT4
    GEMM"): M = 1 gemv with many one-warp programs of 32 outputs (split-K 8 for the wide
    gate_up weight, 32 for the deep down weight, else 16); M <= 16 the mm kernel 16 x 64 with
    split-K 4 for small weights, the nibble tiled kernel 16 x 256 for the two large ones;
    M <= 64 the mm kernel 64 x 32/64 with split-K 4 (64 x 128 unsplit for wide weights);
    above, dequantize + cuBLAS was fastest.
    """
    block_k = 128 if group_size >= 128 or group_size == k else group_size
    if m == 1:
        target = 8 if n >= 16384 else 32 if k >= 8192 else 16
        split = _pow2_split(target, k, 256, 32)
        return Int4GemmConfig(
            "gemv", block_n=32, block_k=256, split_k=split, num_warps=1, num_stages=2
        )
    small = n <= 8192
    if m <= 16:
        if small and k <= 8192:
            return Int4GemmConfig(
                "mm", 16, 64, block_k, _pow2_split(4, k, block_k, 4), num_warps=4, num_stages=3
            )
        split = _pow2_split(16 if small else 8, k, block_k, 16)
        return Int4GemmConfig("tiled", 16, 256, block_k, split, 4, 3, nibble=True)
    if m <= 64:
        if small:
            block_n = 32 if n <= 4096 else 64
            return Int4GemmConfig("mm", 64, block_n, block_k, _pow2_split(4, k, block_k, 4), 4, 3)
        return Int4GemmConfig("mm", 64, 128, block_k, 1, 4, 3)
    return Int4GemmConfig("dequant")
