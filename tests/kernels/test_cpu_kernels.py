"""The C++ CPU kernels: paged attention (every query row in C++) against dense attention
written from the definition; rotary embeddings and RMSNorm against formulas written
here; the cache writes against explicit per-token copies; the build cache, and the fallback
when no C++ compiler is available."""

from __future__ import annotations

import logging

import pytest
import torch

from kernels import cpu_kernels
from kernels.cpu_kernels import (
    load_library,
    paged_attention_cpu,
    paged_attention_rows_cpu,
    reshape_and_cache_cpu,
    rms_norm_cpu,
    rotary_embedding_cpu,
    silu_and_mul_cpu,
)
from kernels.paged_attention import paged_attention_ref
from kernels.rms_norm import rms_norm_ref
from kernels.rotary_embedding import rotary_embedding_ref
from kernels.silu_and_mul import silu_and_mul_ref
from tests.kernels.test_paged_attention import (
    MIXED_SEQS,
    MIXED_SHARED,
    assert_close,
    dense_attention,
    make_batch,
)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU kernels, CPU tensors")

# (num_heads, num_kv_heads, head_dim): head sizes 64 and 128 (compiled specially) and 80 (the
# generic loop), GQA groups 1, 3, 4 and 8.
HEAD_SHAPES = [(3, 3, 64), (12, 3, 80), (16, 2, 128), (9, 3, 64), (8, 2, 64)]
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    assert load_library() is not None, "the C++ kernel must build here (g++ is part of set-up)"


def check(batch, dtype, what: str, sliding_window: int | None = None) -> None:
    scale = batch.query.shape[-1] ** -0.5
    out = paged_attention_cpu(*batch.args(scale, sliding_window))
    assert_close(out, dense_attention(batch, scale, sliding_window), dtype, what)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", HEAD_SHAPES, ids=str)
def test_mixed_batch(heads, dtype):
    """Prefill, extend, decodes at several lengths, and a decode over a shared cached prefix."""
    batch = make_batch(MIXED_SEQS, *heads, dtype, shared=MIXED_SHARED)
    check(batch, dtype, f"mixed batch {heads}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_only_long_contexts(dtype):
    """The all-decode step (one C++ call), contexts across many blocks and a partial last one."""
    seqs = [(n, 1) for n in (1, 15, 16, 17, 300, 257, 64, 129)]
    check(make_batch(seqs, 9, 3, 64, dtype), dtype, "decode only")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_long_prefill_and_extend_chunks(dtype):
    """Prefill chunks over many blocks (causal within the chunk), extends over a cached prefix
    and decodes in one step."""
    seqs = [(300, 300), (257, 40), (33, 1), (129, 129), (200, 17)]
    check(make_batch(seqs, 9, 3, 64, dtype), dtype, "long prefill and extend")


@pytest.mark.parametrize("block_size", [1, 8, 32])
def test_other_block_sizes(block_size):
    batch = make_batch(MIXED_SEQS, 8, 2, 64, torch.float32, block_size=block_size)
    check(batch, torch.float32, f"block size {block_size}")


@pytest.mark.parametrize("window", [1, 7, 40])
def test_sliding_window(window):
    seqs = [(60, 1), (33, 1), (5, 1), (45, 11)]
    check(make_batch(seqs, 8, 2, 64, torch.float32), torch.float32, "window", window)


def test_strided_query_rows():
    """The q slice of a fused qkv projection: rows strided, heads contiguous within a row."""
    batch = make_batch([(40, 1), (70, 1), (25, 1)], 9, 3, 64, torch.float32)
    num_tokens = batch.query.shape[0]
    fused = torch.randn(num_tokens, 9 * 64 + 2 * 3 * 64)
    fused[:, : 9 * 64] = batch.query.reshape(num_tokens, -1)
    batch.query = fused[:, : 9 * 64].view(num_tokens, 9, 64)
    assert not batch.query.is_contiguous()
    check(batch, torch.float32, "strided query")


def test_writes_only_the_given_rows():
    """``paged_attention_rows_cpu`` fills exactly the rows it is given, each over its length."""
    batch = make_batch([(30, 1), (20, 5), (50, 1)], 8, 2, 64, torch.float32)
    out = torch.full_like(batch.query, float("nan"))
    scale = 0.125
    # Token 0 is sequence 0's decode row; tokens 1..5 are sequence 1's chunk (20 positions in
    # all, so its rows see 16..20); token 6 is sequence 2's decode row. Ask for tokens 6 and 3.
    paged_attention_rows_cpu(
        batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
        torch.tensor([6, 3]), torch.tensor([2, 1]), torch.tensor([50, 18]), scale, None, out,
    )  # fmt: skip
    want = dense_attention(batch, scale, None)
    assert_close(out[[6, 3]], want[[6, 3]], torch.float32, "given rows")
    others = [0, 1, 2, 4, 5]
    assert out[others].isnan().all(), "a row not asked for was written"


def test_rows_beyond_the_block_table_are_rejected():
    batch = make_batch([(30, 1)], 8, 2, 64, torch.float32)
    capacity = batch.block_tables.shape[1] * batch.key_cache.shape[1]
    with pytest.raises(ValueError, match="more positions than its block table holds"):
        paged_attention_rows_cpu(
            batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
            torch.tensor([0]), torch.tensor([0]), torch.tensor([capacity + 1]), 0.125, None,
            torch.empty_like(batch.query),
        )  # fmt: skip


def test_rejects_mismatched_dtypes():
    batch = make_batch([(30, 1)], 8, 2, 64, torch.float32)
    with pytest.raises(ValueError, match="share one dtype"):
        paged_attention_rows_cpu(
            batch.query.bfloat16(), batch.key_cache, batch.value_cache, batch.block_tables,
            torch.tensor([0]), torch.tensor([0]), torch.tensor([30]), 0.125, None,
            torch.empty_like(batch.query),
        )  # fmt: skip


def test_float16_goes_through_the_reference():
    batch = make_batch(MIXED_SEQS, 8, 2, 64, torch.float16)
    check(batch, torch.float16, "float16")


def cos_sin_cache(max_position: int, rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    """[max_position, rotary_dim] float32: cos of each position's angles, then sin."""
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


def rotated(x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """NeoX rotary from its definition, in float64: pairs (i, i + rotary_dim / 2) rotate."""
    half = cache.shape[1] // 2
    out = x.double().clone()
    cos = cache.double()[positions][:, None, :half]
    sin = cache.double()[positions][:, None, half:]
    x1, x2 = x.double()[..., :half], x.double()[..., half : 2 * half]
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half : 2 * half] = x2 * cos + x1 * sin
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rotary_dim", [64, 32])
@pytest.mark.parametrize("num_tokens", [1, 5, 130])
def test_rotary_embedding(dtype, rotary_dim, num_tokens):
    """q and k as strided views of a fused qkv output, rotated in place; v left alone."""
    num_heads, num_kv_heads, head_dim = 9, 3, 64
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size).to(dtype)
    before = qkv.clone()
    q = qkv[:, :q_size].view(num_tokens, num_heads, head_dim)
    k = qkv[:, q_size : q_size + kv_size].view(num_tokens, num_kv_heads, head_dim)
    positions = torch.randint(0, 4096, (num_tokens,))
    cache = cos_sin_cache(4096, rotary_dim)
    rotary_embedding_cpu(positions, q, k, cache)
    want_q = rotated(before[:, :q_size].view(num_tokens, num_heads, head_dim), positions, cache)
    want_k = rotated(
        before[:, q_size : q_size + kv_size].view(num_tokens, num_kv_heads, head_dim),
        positions, cache,
    )  # fmt: skip
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(q.double(), want_q.to(dtype).double(), atol=tol, rtol=tol)
    torch.testing.assert_close(k.double(), want_k.to(dtype).double(), atol=tol, rtol=tol)
    assert torch.equal(qkv[:, q_size + kv_size :], before[:, q_size + kv_size :]), "v changed"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("num_tokens", [1, 3, 100])
def test_rms_norm(dtype, with_residual, num_tokens):
    """norm(x + residual) * weight from the definition, and the new residual stream."""
    hidden, eps = 576, 1e-5
    x = (torch.randn(num_tokens, hidden) * 3).to(dtype)
    weight = (torch.rand(hidden) + 0.5).to(dtype)
    residual = torch.randn(num_tokens, hidden).to(dtype) if with_residual else None
    got = rms_norm_cpu(x, weight, eps, residual)
    h = x.double() + (residual.double() if with_residual else 0)
    want = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
    out = got[0] if with_residual else got
    # bf16: the normalized value and the product are each rounded (as in the reference)
    tol = {torch.float32: 2e-6, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)
    if with_residual:
        assert torch.equal(got[1], (x.float() + residual.float()).to(dtype)), "residual stream"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reshape_and_cache(dtype):
    """K/V rows (strided views of a fused qkv) land in their slots; slot -1 writes nothing."""
    num_tokens, num_kv_heads, head_dim, block_size, num_blocks = 7, 3, 64, 16, 5
    qkv = torch.randn(num_tokens, 9 * 64 + 2 * num_kv_heads * head_dim).to(dtype)
    key = qkv[:, 576 : 576 + 192].view(num_tokens, num_kv_heads, head_dim)
    value = qkv[:, 576 + 192 :].view(num_tokens, num_kv_heads, head_dim)
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    value_cache = torch.randn_like(key_cache)
    want_k, want_v = key_cache.clone(), value_cache.clone()
    slots = torch.tensor([17, 0, -1, 79, 40, 41, -1])
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            want_k[slot // block_size, slot % block_size] = key[t]
            want_v[slot // block_size, slot % block_size] = value[t]
    reshape_and_cache_cpu(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, want_k) and torch.equal(value_cache, want_v)
    with pytest.raises(ValueError, match="beyond the cache"):
        reshape_and_cache_cpu(key, value, key_cache, value_cache, torch.full((7,), 80))


def test_rms_norm_and_rotary_match_their_references():
    """Agreement with the references to fp32 rounding (the engine may run either)."""
    x, r, w = torch.randn(40, 576), torch.randn(40, 576), torch.rand(576) + 0.5
    for a, b in zip(rms_norm_cpu(x, w, 1e-6, r), rms_norm_ref(x, w, 1e-6, r), strict=True):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=2e-6)
    q, k = torch.randn(40, 9, 64), torch.randn(40, 3, 64)
    q2, k2 = q.clone(), k.clone()
    positions, cache = torch.randint(0, 512, (40,)), cos_sin_cache(512, 64)
    rotary_embedding_cpu(positions, q, k, cache)
    rotary_embedding_ref(positions, q2, k2, cache)
    torch.testing.assert_close(q, q2, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(k, k2, atol=1e-6, rtol=1e-6)


def test_without_a_compiler_falls_back_to_the_reference(tmp_path, monkeypatch, caplog):
    """No C++ compiler: one warning that says what to install, and the same results."""
    monkeypatch.setenv("TIDAL_KERNEL_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    load_library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=cpu_kernels.__name__):
            assert load_library() is None
            batch = make_batch(MIXED_SEQS, 8, 2, 64, torch.float32)
            check(batch, torch.float32, "fallback")
            x, w = torch.randn(4, 64), torch.rand(64)
            torch.testing.assert_close(rms_norm_cpu(x, w, 1e-6), rms_norm_ref(x, w, 1e-6))
        assert "C++ compiler" in caplog.text and "no-such-compiler" in caplog.text
    finally:
        load_library.cache_clear()


def test_builds_into_the_kernel_cache(tmp_path, monkeypatch):
    """A fresh cache directory gets one compiled library, reused by the next load."""
    monkeypatch.setenv("TIDAL_KERNEL_CACHE", str(tmp_path))
    load_library.cache_clear()
    try:
        assert load_library() is not None
        built = sorted(tmp_path.glob("cpu_kernels-*.so"))
        assert len(built) == 1, f"expected one library in {tmp_path}, found {built}"
        mtime = built[0].stat().st_mtime_ns
        load_library.cache_clear()
        assert load_library() is not None
        assert built[0].stat().st_mtime_ns == mtime, "the cached library was rebuilt"
        assert sorted(tmp_path.iterdir()) == built, "temporary build files were left behind"
    finally:
        load_library.cache_clear()


def silu_and_mul_f64(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation from its definition in float64: gate * sigmoid(gate) * up."""
    g, u = x.double().chunk(2, dim=-1)
    return g / (1.0 + torch.exp(-g)) * u


@pytest.mark.parametrize("shape", [(1, 2 * 1536), (37, 2 * 80), (3, 5, 2 * 7), (0, 64)], ids=str)
def test_silu_and_mul_float32(shape):
    x = torch.randn(shape) * 6  # well into both tails of the sigmoid
    out = silu_and_mul_cpu(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), silu_and_mul_f64(x), rtol=2e-6, atol=1e-6)


def test_silu_and_mul_bfloat16_rounds_like_the_reference():
    """bf16: the silu is rounded to bf16 before the product, as the reference's two ops do, so
    the results agree to one bf16 rounding."""
    x = (torch.randn(64, 2 * 576) * 4).bfloat16()
    out = silu_and_mul_cpu(x)
    want = silu_and_mul_ref(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want.float(), rtol=2**-8, atol=1e-5)


def test_silu_and_mul_strided_rows():
    """The rows of a wider tensor (row stride > 2 * d), as a slice of a fused projection."""
    wide = torch.randn(9, 3 * 96)
    x = wide[:, : 2 * 96]
    assert not x.is_contiguous()
    torch.testing.assert_close(silu_and_mul_cpu(x).double(), silu_and_mul_f64(x), rtol=2e-6,
                               atol=1e-6)  # fmt: skip


def test_rows_follow_changed_metadata():
    """The per-step row table is reused across layers, never across different metadata: the
    same tensors changed in place, and new ones of equal size, both give fresh results (checked
    against the PyTorch reference, which reads the metadata afresh)."""
    batch = make_batch([(40, 1), (30, 6), (9, 1)], 8, 2, 64, torch.float32)
    scale = 0.125

    def agrees(what: str) -> None:
        want = paged_attention_ref(*batch.args(scale))
        assert_close(paged_attention_cpu(*batch.args(scale)), want, torch.float32, what)

    agrees("first call")
    batch.seq_lens[0] = 17  # in place: sequence 0 now sees fewer positions
    agrees("seq_lens changed in place")
    batch.query_start_loc = torch.tensor([0, 3, 4, 8], dtype=torch.int32)  # 3, 1, 4 rows
    batch.seq_lens = torch.tensor([40, 30, 9], dtype=torch.int32)
    batch.max_query_len = 4
    agrees("new chunk boundaries")
