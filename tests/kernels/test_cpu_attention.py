"""The CPU paged attention (C++ decode rows, reference for the rest) against dense attention
written from the definition, and its fallback when no C++ compiler is available."""

from __future__ import annotations

import logging

import pytest
import torch

from kernels import cpu_attention
from kernels.cpu_attention import load_library, paged_attention_cpu, paged_decode_cpu
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
    """``paged_decode_cpu`` fills exactly the rows of the sequences it is given."""
    batch = make_batch([(30, 1), (20, 1), (50, 1)], 8, 2, 64, torch.float32)
    out = torch.full_like(batch.query, float("nan"))
    scale = 0.125
    paged_decode_cpu(
        batch.query, batch.key_cache, batch.value_cache, batch.query_start_loc, batch.seq_lens,
        batch.block_tables, torch.tensor([2, 0]), scale, None, out,
    )  # fmt: skip
    want = dense_attention(batch, scale, None)
    assert_close(out[[0, 2]], want[[0, 2]], torch.float32, "given rows")
    assert out[1].isnan().all(), "a row of a sequence not asked for was written"


def test_rejects_mismatched_dtypes():
    batch = make_batch([(30, 1)], 8, 2, 64, torch.float32)
    with pytest.raises(ValueError, match="share one dtype"):
        paged_decode_cpu(
            batch.query.bfloat16(), batch.key_cache, batch.value_cache, batch.query_start_loc,
            batch.seq_lens, batch.block_tables, torch.tensor([0]), 0.125, None,
            torch.empty_like(batch.query),
        )  # fmt: skip


def test_float16_goes_through_the_reference():
    batch = make_batch(MIXED_SEQS, 8, 2, 64, torch.float16)
    check(batch, torch.float16, "float16")


def test_without_a_compiler_falls_back_to_the_reference(tmp_path, monkeypatch, caplog):
    """No C++ compiler: one warning that says what to install, and the same results."""
    monkeypatch.setenv("TIDAL_KERNEL_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    load_library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=cpu_attention.__name__):
            assert load_library() is None
            batch = make_batch(MIXED_SEQS, 8, 2, 64, torch.float32)
            check(batch, torch.float32, "fallback")
        assert "C++ compiler" in caplog.text and "no-such-compiler" in caplog.text
    finally:
        load_library.cache_clear()


def test_builds_into_the_kernel_cache(tmp_path, monkeypatch):
    """A fresh cache directory gets one compiled library, reused by the next load."""
    monkeypatch.setenv("TIDAL_KERNEL_CACHE", str(tmp_path))
    load_library.cache_clear()
    try:
        assert load_library() is not None
        built = sorted(tmp_path.glob("paged_decode_cpu-*.so"))
        assert len(built) == 1, f"expected one library in {tmp_path}, found {built}"
        mtime = built[0].stat().st_mtime_ns
        load_library.cache_clear()
        assert load_library() is not None
        assert built[0].stat().st_mtime_ns == mtime, "the cached library was rebuilt"
        assert sorted(tmp_path.iterdir()) == built, "temporary build files were left behind"
    finally:
        load_library.cache_clear()
