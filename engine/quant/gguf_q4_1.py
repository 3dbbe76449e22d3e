"""GGUF / ggml Q4_1 blocks -> the canonical INT4 form, without dequantizing.

A Q4_1 block covers 32 consecutive weights of one row: fp16 ``d``, fp16 ``m``, then 16 bytes
whose byte j holds weight j in its low nibble and weight j + 16 in its high nibble;
value = q * d + m. That is the canonical form with group 32, scale d and offset m.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.quant.packing import make_int4_weight
from kernels.int4_gemm import Int4Weight

Q4_1_BLOCK_SIZE = 32
Q4_1_BLOCK_BYTES = 20


def q4_1_to_int4(
    data: np.ndarray | torch.Tensor, shape: tuple[int, int], dtype: torch.dtype = torch.float16
) -> Int4Weight:
    """Raw Q4_1 bytes of a weight with logical shape (N, K) (rows of K weights) -> Int4Weight.

    ``data`` is uint8 with N * K / 32 * 20 bytes (any shape). The scales keep fp16 exactly
    unless ``dtype`` says otherwise.
    """
    n, k = shape
    if k % Q4_1_BLOCK_SIZE:
        raise ValueError(f"Q4_1 rows must be a multiple of 32 weights, got K={k}")
    if isinstance(data, np.ndarray):
        # GGUF readers hand out read-only memory maps; torch needs writable memory.
        array = np.ascontiguousarray(data)
        raw = torch.from_numpy(array if array.flags.writeable else array.copy())
    else:
        raw = data
    if raw.dtype != torch.uint8:
        raise ValueError(f"Q4_1 data must be uint8 bytes, got {raw.dtype}")
    num_blocks = k // Q4_1_BLOCK_SIZE
    if raw.numel() != n * num_blocks * Q4_1_BLOCK_BYTES:
        raise ValueError(
            f"Q4_1 data of shape {(n, k)} needs {n * num_blocks * 20} bytes, got {raw.numel()}"
        )
    blocks = raw.reshape(n, num_blocks, Q4_1_BLOCK_BYTES)
    d = blocks[..., 0:2].contiguous().view(torch.float16).reshape(n, num_blocks)
    m = blocks[..., 2:4].contiguous().view(torch.float16).reshape(n, num_blocks)
    qs = blocks[..., 4:].to(torch.int32)  # [N, num_blocks, 16]
    codes = torch.cat([qs & 0xF, qs >> 4], dim=-1).reshape(n, k)
    return make_int4_weight(codes, d.t().to(dtype), m.t().to(dtype), Q4_1_BLOCK_SIZE)
