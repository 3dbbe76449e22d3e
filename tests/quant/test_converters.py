"""GPTQ, AWQ and GGUF Q4_1 converters against each format's own dequantization formula.

The packers here are written from the formats' descriptions, independently of
engine/quant's own packing code.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.quant.awq_format import awq_to_int4
from engine.quant.gguf_q4_1 import q4_1_to_int4
from engine.quant.gptq_format import gptq_to_int4
from kernels.int4_gemm import dequantize_int4, int4_gemm, int4_gemm_ref


def to_int32(words: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(words.astype(np.uint32).view(np.int32))


def pack_k_major(codes: np.ndarray) -> np.ndarray:
    """GPTQ qweight: [K, N] -> [K/8, N], row k goes to bits 4*(k%8) of row k//8."""
    k, n = codes.shape
    out = np.zeros((k // 8, n), dtype=np.uint64)
    for row in range(k):
        out[row // 8] |= codes[row].astype(np.uint64) << np.uint64(4 * (row % 8))
    return out


def pack_n_major(codes: np.ndarray, order=tuple(range(8))) -> np.ndarray:
    """[R, C] -> [R, C/8]; nibble slot i of word c holds column 8*c + order[i]."""
    r, c = codes.shape
    out = np.zeros((r, c // 8), dtype=np.uint64)
    for col in range(c // 8):
        for i in range(8):
            out[:, col] |= codes[:, 8 * col + order[i]].astype(np.uint64) << np.uint64(4 * i)
    return out


def check_against(weight, dense_kn: np.ndarray, tol: float) -> None:
    """dense_kn [K, N] is the format's dequantized weight; the converter's must match."""
    ours = dequantize_int4(weight).numpy().T
    np.testing.assert_allclose(ours, dense_kn, rtol=tol, atol=tol)
    x = torch.randn(3, dense_kn.shape[0])
    expected = x.numpy() @ dense_kn
    np.testing.assert_allclose(int4_gemm(x, weight).numpy(), expected, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(int4_gemm_ref(x, weight).numpy(), expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("checkpoint_format", ["gptq", "gptq_v2"])
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("k,group_size", [(256, 32), (256, 128), (256, -1), (160, 64)])
def test_gptq(checkpoint_format, act_order, k, group_size):
    rng = np.random.default_rng(k + abs(group_size) + 7 * act_order)
    n = 48
    g = k if group_size == -1 else group_size
    num_groups = -(-k // g)  # GPTQ's last group is shorter when g does not divide K
    codes = rng.integers(0, 16, (k, n))
    # v1 stores zero - 1, so a stored zero must be >= 0: real zeros are 1..15 there.
    zeros = rng.integers(1 if checkpoint_format == "gptq" else 0, 16, (num_groups, n))
    scales = (rng.random((num_groups, n)) * 0.02 + 0.001).astype(np.float16)
    if act_order:
        order = rng.permutation(k)  # the order GPTQ quantized the rows in
        g_idx = np.empty(k, dtype=np.int32)
        g_idx[order] = np.arange(k) // g
    else:
        g_idx = (np.arange(k) // g).astype(np.int32)
    stored_zeros = zeros - 1 if checkpoint_format == "gptq" else zeros
    weight = gptq_to_int4(
        to_int32(pack_k_major(codes)),
        to_int32(pack_n_major(stored_zeros)),
        torch.from_numpy(scales),
        torch.from_numpy(g_idx),
        checkpoint_format=checkpoint_format,
        group_size=group_size,
        dtype=torch.float32,
    )
    # GPTQ's formula: w[k, n] = scale[g_idx[k], n] * (q[k, n] - zero[g_idx[k], n]).
    dense = scales.astype(np.float32)[g_idx] * (codes - zeros[g_idx])
    check_against(weight, dense, 1e-6)
    assert (weight.in_perm is not None) == (act_order and num_groups > 1)


def test_gptq_symmetric_without_qzeros_and_fp16_offsets():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (128, 16))
    scales = (rng.random((4, 16)) * 0.02).astype(np.float16)
    weight = gptq_to_int4(to_int32(pack_k_major(codes)), None, torch.from_numpy(scales))
    assert weight.scales.dtype == torch.float16
    g_idx = np.arange(128) // 32
    dense = scales.astype(np.float32)[g_idx] * (codes - 8)
    check_against(weight, dense, 1e-3)  # offsets rounded to fp16


def test_gptq_rejects_bad_input():
    qweight = torch.zeros(4, 16, dtype=torch.int32)
    with pytest.raises(ValueError, match="bits"):
        gptq_to_int4(qweight, None, torch.ones(1, 16), bits=3)
    with pytest.raises(ValueError, match="checkpoint_format"):
        gptq_to_int4(qweight, None, torch.ones(1, 16), checkpoint_format="marlin")
    with pytest.raises(ValueError, match="unequal"):
        gptq_to_int4(qweight, None, torch.ones(2, 16), torch.zeros(32, dtype=torch.int32))


@pytest.mark.parametrize("group_size", [64, 128])
def test_awq(group_size):
    rng = np.random.default_rng(group_size)
    k, n = 256, 40
    num_groups = k // group_size
    codes = rng.integers(0, 16, (k, n))
    zeros = rng.integers(0, 16, (num_groups, n))
    scales = (rng.random((num_groups, n)) * 0.02 + 0.001).astype(np.float16)
    order = (0, 2, 4, 6, 1, 3, 5, 7)
    weight = awq_to_int4(
        to_int32(pack_n_major(codes, order)),
        to_int32(pack_n_major(zeros, order)),
        torch.from_numpy(scales),
        dtype=torch.float32,
    )
    g_idx = np.arange(k) // group_size
    dense = scales.astype(np.float32)[g_idx] * (codes - zeros[g_idx])  # AWQ: (q - z) * s
    check_against(weight, dense, 1e-6)


def pack_q4_1(codes: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """ggml block_q4_1: fp16 d, fp16 m, qs[16]; qs[j] = code[j] | code[j + 16] << 4."""
    n, k = codes.shape
    out = bytearray()
    for row in range(n):
        for b in range(k // 32):
            block = codes[row, 32 * b : 32 * b + 32]
            out += np.float16(d[row, b]).tobytes() + np.float16(m[row, b]).tobytes()
            out += bytes(int(block[j]) | (int(block[j + 16]) << 4) for j in range(16))
    return np.frombuffer(bytes(out), dtype=np.uint8)


def test_gguf_q4_1():
    gguf_quants = pytest.importorskip("gguf.quants")
    from gguf.constants import GGMLQuantizationType

    rng = np.random.default_rng(1)
    n, k = 13, 96
    codes = rng.integers(0, 16, (n, k))
    d = (rng.random((n, k // 32)) * 0.05).astype(np.float16)
    m = (rng.standard_normal((n, k // 32)) * 0.1).astype(np.float16)
    raw = pack_q4_1(codes, d, m)
    weight = q4_1_to_int4(raw, (n, k))
    # Q4_1's formula: value = q * d + m.
    dense = codes * np.repeat(d.astype(np.float32), 32, 1) + np.repeat(m.astype(np.float32), 32, 1)
    check_against(weight, dense.T, 1e-6)
    # And the gguf package's own dequantizer on the same bytes.
    theirs = gguf_quants.dequantize(raw.reshape(n, -1), GGMLQuantizationType.Q4_1)
    np.testing.assert_allclose(dequantize_int4(weight).numpy(), theirs, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="bytes"):
        q4_1_to_int4(raw[:-1], (n, k))
