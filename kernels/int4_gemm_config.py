"""Launch settings for ``kernels.int4_gemm``: one fixed table per shape bucket.

No autotuning at run time: a config depends only on (M bucket, N, K, group size, device
multiprocessor count), so the same launch is replayed inside a CUDA graph. The table was
chosen from the sweep in ``benchmarks/bench_int4_gemm.py --sweep`` on an H200 (see
BENCHMARKS.md, "INT4 GEMM").
"""

from __future__ import annotations

import functools
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
    magic-number trick, instead of unpacking to K order. ``swap`` (tiled, nibble): compute
    the transposed tile so the codes are the tensor cores' register operand.
    """

    strategy: str
    block_m: int = 16
    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    nibble: bool = False
    swap: bool = False

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 8 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 8, got {v}")
        if self.split_k < 1:
            raise ValueError(f"split_k must be >= 1, got {self.split_k}")


@functools.lru_cache(maxsize=1)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _pow2_split(target: int, k: int, block_k: int, cap: int) -> int:
    """The smallest power of two >= target, capped, keeping >= block_k of K per split."""
    split = 1
    while split < target and split < cap and k // (2 * split) >= block_k:
        split *= 2
    return split


def choose_config(m: int, n: int, k: int, group_size: int, device: torch.device) -> Int4GemmConfig:
    """The table: strategy and tiles from the number of rows M and the weight's shape.

    From the H200 sweep (2026-11-29, Llama-3-8B shapes, group 128): M = 1 gemv, 64 outputs
    per program, about 24 programs per multiprocessor through split-K; M <= 16 tiled 16 x 128
    with split-K 8, or 16 with the nibble kernel for narrow weights; M <= 64 tiled for large
    weights, dequantize + cuBLAS for small ones; above, dequantize + cuBLAS was fastest.
    """
    num_sms = _num_sms(device.index or 0) if device.type == "cuda" else 132
    block_k = 128 if group_size >= 128 or group_size == k else group_size
    if m == 1:
        tiles = -(-n // 64)
        split = _pow2_split(-(-24 * num_sms // tiles), k, block_k, 16)
        return Int4GemmConfig(
            "gemv", block_n=64, block_k=block_k, split_k=split, num_warps=2, num_stages=3
        )
    if m <= 16:
        # 16 splits with the nibble kernel where that keeps <= 4 programs per multiprocessor
        # (N = 4096: 11-16% faster than unpacking with 8 splits); else unpacking, 8 splits.
        wide = -(-n // 128) * 16 <= 4 * num_sms
        return Int4GemmConfig(
            "tiled",
            block_m=16,
            block_n=128,
            block_k=block_k,
            split_k=_pow2_split(16 if wide else 8, k, block_k, 16),
            num_warps=4,
            num_stages=3,
            nibble=wide,
        )
    if m <= 64 and n * k >= 32 * 2**20:
        block_n = 128 if n >= 128 * num_sms else 64
        tiles = -(-m // 64) * -(-n // block_n)
        split = _pow2_split(-(-num_sms // tiles), k, block_k, 4)
        return Int4GemmConfig(
            "tiled",
            block_m=64,
            block_n=block_n,
            block_k=block_k,
            split_k=split,
            num_warps=4,
            num_stages=4,
        )
    return Int4GemmConfig("dequant")
