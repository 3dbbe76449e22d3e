"""rotary_embedding (Triton; interpreter on CPU) against rotary_embedding_ref, and the
reference against the rotate-half formula of Llama written out here."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernels' import (jit decoration)

from kernels.rotary_embedding import rotary_embedding, rotary_embedding_ref  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (atol, rtol) per dtype; both compute in fp32 and round once.
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}
DTYPES = [torch.float32, torch.float16]


def cos_sin_cache(max_position: int, rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()  # [max_position, rotary_dim]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim, rotary_dim",
    [(3, 3, 64, 64), (12, 3, 80, 80), (8, 1, 128, 128), (5, 1, 64, 32)],
)
def test_matches_reference(num_heads, num_kv_heads, head_dim, rotary_dim, dtype):
    num_tokens = 11
    # q and k as strided views of one fused QKV output, rotated in place.
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(num_tokens, width, device=DEVICE).to(dtype)
    query = qkv[:, : num_heads * head_dim].unflatten(-1, (num_heads, head_dim))
    key = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim]
    key = key.unflatten(-1, (num_kv_heads, head_dim))
    positions = torch.randint(0, 4000, (num_tokens,), device=DEVICE)
    cache = cos_sin_cache(4096, rotary_dim).to(DEVICE)
    ref_qkv = qkv.clone()
    ref_query = ref_qkv[:, : num_heads * head_dim].unflatten(-1, (num_heads, head_dim))
    ref_key = ref_qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim]
    ref_key = ref_key.unflatten(-1, (num_kv_heads, head_dim))
    before = qkv.clone()

    rotary_embedding(positions, query, key, cache)
    rotary_embedding_ref(positions, ref_query, ref_key, cache)

    atol, rtol = TOLERANCE[dtype]
    bad = (qkv.double() - ref_qkv.double()).abs() > atol + rtol * ref_qkv.double().abs()
    bad = bad.nonzero()
    assert len(bad) == 0, f"{len(bad)} mismatches, first [token, column] {bad[:4].tolist()}"
    # The V part of the buffer and the unrotated channels stay as they were.
    v_start = (num_heads + num_kv_heads) * head_dim
    assert torch.equal(qkv[:, v_start:], before[:, v_start:])
    assert torch.equal(query[..., rotary_dim:], before[:, : num_heads * head_dim].unflatten(
        -1, (num_heads, head_dim))[..., rotary_dim:])  # fmt: skip


def test_reference_matches_rotate_half_formula():
    num_tokens, num_heads, head_dim = 6, 4, 64
    query = torch.randn(num_tokens, num_heads, head_dim)
    key = torch.randn(num_tokens, 2, head_dim)
    positions = torch.tensor([0, 1, 5, 17, 300, 2047])
    cache = cos_sin_cache(2048, head_dim)
    expected = []
    for t in (query, key):
        angles = positions[:, None].double() / 10000.0 ** (
            torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
        )
        cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None, :]
        sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None, :]
        x = t.double()
        rotated_half = torch.cat([-x[..., head_dim // 2 :], x[..., : head_dim // 2]], -1)
        expected.append(x * cos + rotated_half * sin)
    rotary_embedding_ref(positions, query, key, cache)
    torch.testing.assert_close(query.double(), expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(key.double(), expected[1], atol=1e-5, rtol=1e-5)


def test_rejects_bad_input():
    query = torch.randn(2, 4, 64, device=DEVICE)
    key = torch.randn(2, 2, 64, device=DEVICE)
    positions = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="rotary_dim"):
        rotary_embedding(positions, query, key, torch.randn(16, 66, device=DEVICE))
    with pytest.raises(ValueError, match="positions"):
        rotary_embedding(positions[:1], query, key, torch.randn(16, 64, device=DEVICE))
