"""paged_attention (Triton; interpreter on CPU) against paged_attention_ref, and the reference
against a dense causal attention written here from the definition."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernels' import (jit decoration)

from kernels.paged_attention import (  # noqa: E402
    DecodeConfig,
    _launch_decode,
    _pick_decode_config,
    _tma_applies,
    _tma_block,
    paged_attention,
    paged_attention_ref,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (atol, rtol) per dtype: outputs are convex combinations of N(0, 1) value rows, computed in
# fp32 in both; fp16 adds the rounding of the probabilities fed to the P @ V product.
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float16: (4e-3, 4e-3), torch.bfloat16: (3e-2, 3e-2)}
# (num_heads, num_kv_heads, head_dim): odd head counts, GQA ratios 1, 4 and 8, a group of 3.
HEAD_SHAPES = [(3, 3, 64), (12, 3, 80), (16, 2, 128), (6, 2, 64)]
DTYPES = [torch.float32, torch.float16]


@dataclass
class Batch:
    """One step's attention inputs plus each sequence's dense (unpaged) K/V."""

    query: torch.Tensor  # [num_tokens, num_heads, head_dim]
    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    max_query_len: int
    max_seq_len: int
    dense_keys: list[torch.Tensor]  # per sequence [seq_len, num_kv_heads, head_dim]
    dense_values: list[torch.Tensor]

    def args(self, scale: float, sliding_window: int | None = None) -> tuple:
        return (
            self.query, self.key_cache, self.value_cache, self.query_start_loc, self.seq_lens,
            self.block_tables, scale, self.max_query_len, self.max_seq_len, sliding_window,
        )  # fmt: skip


def make_batch(
    seqs: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    block_size: int = 16,
    shared: tuple[int, int, int] | None = None,
) -> Batch:
    """Random batch of ``(seq_len, q_len)`` sequences in randomly placed cache blocks.

    ``shared = (src, dst, num_blocks)``: ``dst`` reuses the first ``num_blocks`` physical blocks
    of ``src`` (a cached prefix), so the two sequences see the same keys there. The whole cache
    and the unused block-table entries hold random data, so a wrong read changes the result.
    """
    blocks_per_seq = [-(-seq_len // block_size) for seq_len, _ in seqs]
    num_blocks = sum(blocks_per_seq) + 3
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    free = torch.randperm(num_blocks).tolist()
    max_blocks = max(blocks_per_seq) + 2
    block_tables = torch.randint(0, num_blocks, (len(seqs), max_blocks), dtype=torch.int32)
    dense_keys, dense_values = [], []
    for i, ((seq_len, _), num_seq_blocks) in enumerate(zip(seqs, blocks_per_seq, strict=True)):
        num_reused = 0
        if shared is not None and shared[1] == i:
            num_reused = shared[2]
            block_tables[i, :num_reused] = block_tables[shared[0], :num_reused]
        for j in range(num_reused, num_seq_blocks):
            block_tables[i, j] = free.pop()
        table = block_tables[i, :num_seq_blocks].long()
        dense_keys.append(key_cache[table].flatten(0, 1)[:seq_len])
        dense_values.append(value_cache[table].flatten(0, 1)[:seq_len])
    q_lens = [q_len for _, q_len in seqs]
    query_start_loc = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    query = torch.randn(sum(q_lens), num_heads, head_dim).to(dtype)
    seq_lens = torch.tensor([seq_len for seq_len, _ in seqs], dtype=torch.int32)
    return Batch(
        query.to(DEVICE), key_cache.to(DEVICE), value_cache.to(DEVICE),
        query_start_loc.to(DEVICE), seq_lens.to(DEVICE), block_tables.to(DEVICE),
        max(q_lens), max(seq_len for seq_len, _ in seqs), dense_keys, dense_values,
    )  # fmt: skip


def dense_attention(batch: Batch, scale: float, sliding_window: int | None) -> torch.Tensor:
    """Causal GQA attention in float64, one sequence and one query token at a time."""
    query = batch.query.double().cpu()
    out = torch.empty_like(query)
    starts = batch.query_start_loc.tolist()
    num_heads = query.shape[1]
    for i, (keys, values) in enumerate(zip(batch.dense_keys, batch.dense_values, strict=True)):
        group = num_heads // keys.shape[1]
        keys = keys.double().cpu().repeat_interleave(group, dim=1)  # [seq_len, num_heads, d]
        values = values.double().cpu().repeat_interleave(group, dim=1)
        q_len = starts[i + 1] - starts[i]
        for t in range(q_len):
            pos = keys.shape[0] - q_len + t
            lo = 0 if sliding_window is None else max(0, pos - sliding_window + 1)
            scores = torch.einsum("hd,khd->hk", query[starts[i] + t], keys[lo : pos + 1]) * scale
            probs = torch.softmax(scores, dim=-1)
            out[starts[i] + t] = torch.einsum("hk,khd->hd", probs, values[lo : pos + 1])
    return out


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """Elementwise |out - ref| <= atol + rtol |ref|; on failure name the worst [token, head, d]."""
    atol, rtol = TOLERANCE[dtype]
    out64, ref64 = out.double().cpu(), ref.double().cpu()
    assert torch.isfinite(out64).all(), (
        f"{what}: non-finite values at {(~torch.isfinite(out64)).nonzero()[:5].tolist()}"
    )  # noqa: E501
    bad = (out64 - ref64).abs() > atol + rtol * ref64.abs()
    if bad.any():
        worst = int((out64 - ref64).abs().argmax())
        index = [int(i) for i in torch.unravel_index(torch.tensor(worst), out.shape)]
        got, want = float(out64.flatten()[worst]), float(ref64.flatten()[worst])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements off (atol {atol}, rtol {rtol});"
            f" first bad [token, head, d] {bad.nonzero()[:4].tolist()}; worst at "
            f"{index}: {got:.6f} vs {want:.6f}"
        )


def check_against_reference(batch: Batch, dtype: torch.dtype, what: str, **kwargs) -> None:
    scale = batch.query.shape[-1] ** -0.5
    window = kwargs.pop("sliding_window", None)
    ref = paged_attention_ref(*batch.args(scale, window))
    out = paged_attention(*batch.args(scale, window), **kwargs)
    assert_close(out, ref, dtype, what)


# Prefill with an empty prefix, an extend over a 34-token prefix, decodes at 50, 1 and 32
# positions, and a decode sharing the extend's first two (prefix-cached) blocks.
MIXED_SEQS = [(21, 21), (45, 11), (50, 1), (1, 1), (32, 1), (40, 1)]
MIXED_SHARED = (1, 5, 2)


@pytest.mark.parametrize("num_kv_splits", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", HEAD_SHAPES, ids=lambda h: "h{}-kv{}-d{}".format(*h))
def test_mixed_batch(heads, dtype, num_kv_splits):
    batch = make_batch(MIXED_SEQS, *heads, dtype, shared=MIXED_SHARED)
    check_against_reference(batch, dtype, f"{heads} {dtype}", num_kv_splits=num_kv_splits)


@pytest.mark.parametrize("num_kv_splits", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sliding_window(dtype, num_kv_splits):
    batch = make_batch([(30, 30), (53, 9), (70, 1), (5, 1)], 8, 2, 64, dtype)
    check_against_reference(
        batch, dtype, f"window 13 {dtype}", sliding_window=13, num_kv_splits=num_kv_splits
    )


@pytest.mark.parametrize("block_size", [8, 32])
def test_other_block_sizes(block_size):
    batch = make_batch([(37, 37), (70, 5), (33, 1)], 4, 1, 64, torch.float16, block_size)
    check_against_reference(batch, torch.float16, f"block_size {block_size}")


DECODE_SEQS = [(1, 1), (17, 1), (100, 1), (64, 1), (23, 1)]


@pytest.mark.parametrize("num_kv_splits", [None, 1, 8])
def test_decode_only(num_kv_splits):
    # 8 splits of 1 to 7 tiles: some splits see no key at all and must weigh nothing.
    batch = make_batch(DECODE_SEQS, 8, 2, 64, torch.float32)
    check_against_reference(batch, torch.float32, f"decode splits {num_kv_splits}",
                            num_kv_splits=num_kv_splits)  # fmt: skip


@pytest.mark.parametrize("num_kv_splits", [1, 3, 8])
def test_decode_whole_tiles(num_kv_splits):
    """The unpredicated loop over whole tiles, then the partial tile (``whole_tiles``): 16-
    position tiles over lengths that end on, before and past a tile boundary, with splits
    that start after the last whole tile."""
    batch = make_batch(DECODE_SEQS + [(32, 1), (48, 1)], 8, 2, 64, torch.float16)
    scale = 64**-0.5
    out = torch.empty_like(batch.query)
    _launch_decode(
        batch.query, batch.key_cache, batch.value_cache, batch.seq_lens, batch.block_tables,
        scale, None, out, num_kv_splits, DecodeConfig(16, 4, 1, 8, whole_tiles=True),
    )  # fmt: skip
    ref = paged_attention_ref(*batch.args(scale))
    assert_close(out, ref, torch.float16, f"whole tiles, splits {num_kv_splits}")


# (block_size, BLOCK_N, splits, fused merge): tiles of one, two and four cache blocks, splits
# that see no key, and the merge kernel or the fused one.
TMA_CASES = [(16, 16, 1, False), (16, 32, 3, False), (16, 64, 8, False), (16, 32, 3, True),
             (32, 32, 2, True), (32, 64, 1, False)]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sliding_window", [None, 21])
@pytest.mark.parametrize("block_size, block_n, splits, fused", TMA_CASES)
def test_decode_tma(block_size, block_n, splits, fused, sliding_window, dtype):
    """``DecodeConfig.tma``: each cache block's K and V rows of a KV head by TMA (tensor
    descriptors), over lengths that end inside a block and inside a tile, so a tile's last
    blocks lie past the sequence (their table entries are random)."""
    seqs = DECODE_SEQS + [(33, 1), (96, 1)]
    batch = make_batch(seqs, 8, 2, 64, dtype, block_size=block_size)
    scale = 64**-0.5
    config = DecodeConfig(block_n, 4, 2, 8, fused_merge=fused, tma=True)
    assert _tma_applies(batch.query, batch.key_cache, batch.value_cache, config, 1)
    out = torch.empty_like(batch.query)
    for _ in range(2):  # the fused merge's tickets are left at 0 for the next launch
        _launch_decode(
            batch.query, batch.key_cache, batch.value_cache, batch.seq_lens,
            batch.block_tables, scale, sliding_window, out, splits, config,
        )  # fmt: skip
        ref = paged_attention_ref(*batch.args(scale, sliding_window))
        assert_close(out, ref, dtype, f"tma {block_size}/{block_n} x{splits} w{sliding_window}")


@pytest.mark.parametrize("tma", [True, False])
def test_decode_ignores_stale_nan_past_the_sequence(tma):
    """Cache rows past each sequence's length (in its last block, and whole blocks its table
    names past it) hold NaN, as a freed block may after a request whose activations
    overflowed: they must not reach any output (P @ V weighs them by 0, and 0 x NaN is NaN)."""
    seqs = [(1, 1), (17, 1), (33, 1), (100, 1), (64, 1)]
    batch = make_batch(seqs, 8, 2, 64, torch.float16)
    scale = 64**-0.5
    ref = paged_attention_ref(*batch.args(scale))
    live = torch.zeros(batch.key_cache.shape[:2], dtype=torch.bool, device=DEVICE)
    for i, (seq_len, _) in enumerate(seqs):
        for pos in range(seq_len):
            live[batch.block_tables[i, pos // 16], pos % 16] = True
    for cache in (batch.key_cache, batch.value_cache):
        cache[~live] = float("nan")
    out = torch.empty_like(batch.query)
    for splits in (1, 3):
        config = DecodeConfig(32, 4, 2, 8, fused_merge=splits > 1, tma=tma)
        _launch_decode(
            batch.query, batch.key_cache, batch.value_cache, batch.seq_lens,
            batch.block_tables, scale, None, out, splits, config,
        )  # fmt: skip
        assert_close(out, ref, torch.float16, f"tma {tma} x{splits}")


def test_decode_tma_falls_back_where_it_does_not_apply():
    """Head size 80 (padded to 128), two KV heads per program, a strided cache: the pointer
    loads run instead, with the same result."""
    batch = make_batch(DECODE_SEQS, 12, 3, 80, torch.float16)
    scale = 80**-0.5
    config = DecodeConfig(32, 4, 2, 8, tma=True)
    assert not _tma_applies(batch.query, batch.key_cache, batch.value_cache, config, 1)
    out = torch.empty_like(batch.query)
    _launch_decode(
        batch.query, batch.key_cache, batch.value_cache, batch.seq_lens, batch.block_tables,
        scale, None, out, 3, config,
    )  # fmt: skip
    assert_close(out, paged_attention_ref(*batch.args(scale)), torch.float16, "head 80")
    batch = make_batch(DECODE_SEQS, 8, 4, 64, torch.float16)
    wide = torch.randn(*batch.key_cache.shape[:3], 128, dtype=torch.float16, device=DEVICE)
    wide[..., :64] = batch.key_cache
    key_cache = wide[..., :64]  # rows 256 bytes apart: not contiguous
    out = torch.empty_like(batch.query)
    for kv_heads, cache in ((2, batch.key_cache), (1, key_cache)):
        config = DecodeConfig(32, 4, 2, 8, kv_heads=kv_heads, tma=True)
        assert not _tma_applies(batch.query, cache, batch.value_cache, config, kv_heads)
        _launch_decode(
            batch.query, cache, batch.value_cache, batch.seq_lens, batch.block_tables,
            64**-0.5, None, out, 2, config,
        )  # fmt: skip
        ref = paged_attention_ref(*batch.args(64**-0.5))
        assert_close(out, ref, torch.float16, f"kv_heads {kv_heads}")


# (tiles, splits, fused merge): the shipped TMA launches first (merge kernel, fused, unsplit)
TMA_GPU_CASES = [
    ((16, 1, 6), 32, False), ((16, 1, 6), 4, True), ((32, 1, 6), 1, False),
    ((32, 4, 6), 2, True), ((64, 4, 3), 1, False), ((16, 4, 8), 16, False),
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("tiles, splits, fused", TMA_GPU_CASES)
def test_decode_tma_llama_heads_in_a_graph(tiles, splits, fused, dtype):
    """The TMA form compiled at Llama-3-8B heads (sm_90+, the pointer loads elsewhere), eagerly
    and replayed from a CUDA graph of two layers whose caches are rewritten after capture."""
    seqs = [(1, 1), (17, 1), (2047, 1), (3001, 1), (512, 1), (90, 1)]
    config = DecodeConfig(*tiles, 4, fused_merge=fused, pdl=not fused, tma=True)
    check_two_layers_in_a_graph(seqs, dtype, config, splits, f"{tiles} x{splits}", True)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [16, 32, 64])
def test_decode_default_split_launch_in_a_graph(splits):
    """The launch ``paged_attention`` picks at Llama-3-8B heads with the merge kernel (by TMA
    on sm_90+: a dependent launch that waits, the merge's columns sliced past 32 splits),
    eagerly and from a CUDA graph of two layers."""
    seqs = [(1, 1), (17, 1), (2047, 1), (3001, 1), (512, 1), (90, 1)]
    probe = make_batch(seqs[:1], 32, 8, 128, torch.bfloat16)
    config = _pick_decode_config(
        probe.query.device, torch.bfloat16, 32, 8, 128, splits, len(seqs),
        _tma_block(probe.key_cache, probe.value_cache),
    )  # fmt: skip
    check_two_layers_in_a_graph(seqs, torch.bfloat16, config, splits, f"{config} x{splits}", True)


def check_two_layers_in_a_graph(
    seqs: list[tuple[int, int]],
    dtype: torch.dtype,
    config: DecodeConfig,
    splits: int,
    what: str,
    new_caches: bool = False,
) -> None:
    """Two decode layers (Llama-3-8B heads) launched with ``config`` back to back, checked
    eagerly and then replayed from a CUDA graph of both (outputs zeroed, and with
    ``new_caches`` the caches rewritten, after the capture)."""
    layers = [make_batch(seqs, 32, 8, 128, dtype) for _ in range(2)]
    scale = 128**-0.5
    outs = [torch.empty_like(b.query) for b in layers]

    def step():
        for b, out in zip(layers, outs, strict=True):
            _launch_decode(
                b.query, b.key_cache, b.value_cache, b.seq_lens, b.block_tables, scale, None,
                out, splits, config,
            )  # fmt: skip

    def check(when):
        for i, (b, out) in enumerate(zip(layers, outs, strict=True)):
            ref = paged_attention_ref(*b.args(scale))
            assert_close(out, ref, dtype, f"{what} {when}, layer {i}")

    step()
    torch.cuda.synchronize()
    check("eager")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for b, out in zip(layers, outs, strict=True):
        out.zero_()
        if new_caches:
            b.key_cache.copy_(torch.randn_like(b.key_cache))
            b.value_cache.copy_(torch.randn_like(b.value_cache))
    graph.replay()
    check("graph")


@pytest.mark.parametrize("num_kv_splits", [1, 3])
def test_decode_sliding_window(num_kv_splits):
    batch = make_batch(DECODE_SEQS, 8, 2, 64, torch.float16)
    check_against_reference(batch, torch.float16, f"decode window 21 splits {num_kv_splits}",
                            sliding_window=21, num_kv_splits=num_kv_splits)  # fmt: skip


@pytest.mark.parametrize(
    "merge_block_h, merge_block_d, head_size",
    [(1, 0, 64), (2, 0, 64), (8, 0, 64), (1, 16, 80), (2, 32, 64), (4, 64, 80)],
)
def test_decode_merge_widths(merge_block_h, merge_block_d, head_size):
    """The split merge with one, some and all query heads of a token per program, and with
    all or a slice of their columns (a padded head size's last slices past its columns)."""
    batch = make_batch(DECODE_SEQS, 8, 2, head_size, torch.float16)
    scale = head_size**-0.5
    out = torch.empty_like(batch.query)
    _launch_decode(
        batch.query, batch.key_cache, batch.value_cache, batch.seq_lens, batch.block_tables,
        scale, None, out, 3, DecodeConfig(16, 4, 1, merge_block_h, merge_block_d),
    )  # fmt: skip
    ref = paged_attention_ref(*batch.args(scale))
    assert_close(out, ref, torch.float16, f"merge {merge_block_h} heads x {merge_block_d}")


def test_decode_merge_refuses_a_slice_that_is_not_a_power_of_two():
    with pytest.raises(ValueError, match="merge_block_d must be 0 or a power of two, got 24"):
        DecodeConfig(16, 4, 1, 2, 24)


# (kv_heads per program, fused merge, splits): two and four KV heads per program (8 query
# heads of a group of 2, 8 of a group of 4), the merge fused into the last split to finish.
DECODE_VARIANTS = [(2, False, 1), (2, False, 3), (1, True, 3), (2, True, 8), (4, True, 2)]


@pytest.mark.parametrize("kv_heads, fused, splits", DECODE_VARIANTS)
@pytest.mark.parametrize("sliding_window", [None, 21])
def test_decode_variants(kv_heads, fused, splits, sliding_window):
    batch = make_batch(DECODE_SEQS, 16, 4, 64, torch.float16)
    scale = 64**-0.5
    out = torch.empty_like(batch.query)
    config = DecodeConfig(16, 4, 1, 8, kv_heads=kv_heads, fused_merge=fused)
    for _ in range(2):  # the second launch finds the fused merge's tickets reset to 0
        _launch_decode(
            batch.query, batch.key_cache, batch.value_cache, batch.seq_lens,
            batch.block_tables, scale, sliding_window, out, splits, config,
        )  # fmt: skip
        ref = paged_attention_ref(*batch.args(scale, sliding_window))
        assert_close(out, ref, torch.float16, f"kv_heads {kv_heads} fused {fused} x{splits}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("kv_heads, fused, splits", DECODE_VARIANTS + [(4, True, 8), (1, True, 2)])
def test_decode_variants_llama_heads(kv_heads, fused, splits, dtype):
    """The decode variants compiled at Llama-3-8B heads, with context lengths up to 3001."""
    seqs = [(1, 1), (17, 1), (2047, 1), (3001, 1), (512, 1), (90, 1), (1300, 1)]
    batch = make_batch(seqs, 32, 8, 128, dtype)
    scale = 128**-0.5
    out = torch.empty_like(batch.query)
    tiles = (32, 4, 3) if dtype == torch.bfloat16 else (16, 4, 2)  # fp32 tiles fill smem
    config = DecodeConfig(*tiles, 4, kv_heads=kv_heads, fused_merge=fused)
    for _ in range(3):
        _launch_decode(
            batch.query, batch.key_cache, batch.value_cache, batch.seq_lens,
            batch.block_tables, scale, None, out, splits, config,
        )  # fmt: skip
        ref = paged_attention_ref(*batch.args(scale))
        assert_close(out, ref, dtype, f"kv_heads {kv_heads} fused {fused} x{splits} {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [2, 4, 8])
def test_decode_one_warp_fused_merge(splits):
    """The default for batch 16 x 8 KV heads: one-warp programs, splits merged by the last."""
    seqs = [
        (int(n), 1)
        for n in torch.randint(1, 2100, (16,), generator=torch.Generator().manual_seed(splits))
    ]
    batch = make_batch(seqs, 32, 8, 128, torch.bfloat16)
    scale = 128**-0.5
    out = torch.empty_like(batch.query)
    for _ in range(2):  # the ticket buffer is left clean for the next launch
        _launch_decode(
            batch.query, batch.key_cache, batch.value_cache, batch.seq_lens,
            batch.block_tables, scale, None, out, splits, DecodeConfig(32, 1, 6, fused_merge=True),
        )  # fmt: skip
        assert_close(out, paged_attention_ref(*batch.args(scale)), torch.bfloat16, f"x{splits}")


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [9, 16, 32])
def test_decode_merge_as_dependent_launch(splits):
    """The merge kernel launched as a programmatic dependent of the split kernel (sm_90+; a
    plain launch before that), eagerly and in a CUDA graph of two layers back to back."""
    seqs = [(1, 1), (4000, 1), (2047, 1), (300, 1)]
    config = DecodeConfig(32, 4, 6, 4, pdl=True)
    check_two_layers_in_a_graph(seqs, torch.bfloat16, config, splits, f"PDL merge x{splits}")


@pytest.mark.gpu
@pytest.mark.parametrize("tiles, tma", [((32, 4, 6), False), ((16, 1, 6), True)])
@pytest.mark.parametrize("splits, fused", [(1, False), (4, True), (16, False)])
def test_decode_waits_as_dependent_launch(splits, fused, tiles, tma):
    """Decode kernels launched as programmatic dependents (``wait``; sm_90+, a plain launch
    before that), with pointer loads and by TMA, each layer's query being the previous
    layer's output, so a kernel that read before the previous one finished would see a stale
    query; eagerly and replayed from a CUDA graph."""
    seqs = [(1, 1), (4000, 1), (2047, 1), (300, 1)]
    layers = [make_batch(seqs, 32, 8, 128, torch.bfloat16) for _ in range(3)]
    scale = 128**-0.5
    config = DecodeConfig(*tiles, 4, fused_merge=fused, pdl=True, wait=True, tma=tma)
    query = layers[0].query.clone()
    outs = [torch.empty_like(query) for _ in layers]

    def step():
        q = query
        for b, out in zip(layers, outs, strict=True):
            _launch_decode(
                q, b.key_cache, b.value_cache, b.seq_lens, b.block_tables, scale, None,
                out, splits, config,
            )  # fmt: skip
            q = out

    def check(what):
        q = query
        for i, (b, out) in enumerate(zip(layers, outs, strict=True)):
            args = list(b.args(scale))
            args[0] = q
            assert_close(out, paged_attention_ref(*args), torch.bfloat16, f"{what}, layer {i}")
            q = out

    step()
    torch.cuda.synchronize()
    check(f"eager x{splits} tma {tma}")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for out in outs:
        out.zero_()
    query.copy_(torch.randn_like(query))
    graph.replay()
    check(f"graph x{splits} tma {tma}")


def test_no_tokens_with_sequences_returns_out_untouched():
    """The piecewise graphs' first capture runs a step of padding only: no query token, but
    the step's real metadata (two sequences). Nothing is launched and ``out`` stays as is."""
    batch = make_batch([(40, 9), (17, 17)], 8, 2, 64, torch.float32)
    out = torch.full((0, 8, 64), 7.0, device=DEVICE)
    args = batch.args(64**-0.5)
    got = paged_attention(batch.query[:0], *args[1:], out=out)
    assert got is out and got.shape == (0, 8, 64)


def test_strided_query_and_out():
    """query viewed out of a fused QKV buffer; the result written into a slice of a buffer."""
    batch = make_batch([(19, 19), (40, 3), (26, 1)], 6, 2, 80, torch.float16)
    num_tokens, num_heads, head_dim = batch.query.shape
    qkv = torch.randn(num_tokens, (num_heads + 4) * head_dim, device=DEVICE).half()
    query = qkv[:, : num_heads * head_dim].unflatten(-1, (num_heads, head_dim))
    query.copy_(batch.query)
    assert not query.is_contiguous()
    buffer = torch.randn(num_tokens, num_heads + 1, head_dim, device=DEVICE).half()
    before = buffer.clone()
    out = buffer[:, 1:]
    scale = head_dim**-0.5
    args = list(batch.args(scale))
    args[0] = query
    result = paged_attention(*args, out=out)
    assert result.data_ptr() == out.data_ptr()
    assert torch.equal(buffer[:, 0], before[:, 0]), "wrote outside out"
    assert_close(out, paged_attention_ref(*batch.args(scale)), torch.float16, "strided")


@pytest.mark.parametrize("sliding_window", [None, 7])
def test_reference_matches_dense_attention(sliding_window):
    batch = make_batch(MIXED_SEQS, 12, 3, 80, torch.float32, shared=MIXED_SHARED)
    scale = 0.1
    ref = paged_attention_ref(*batch.args(scale, sliding_window))
    assert_close(ref, dense_attention(batch, scale, sliding_window), torch.float32, "reference")


def test_rejects_bad_input():
    batch = make_batch([(5, 5)], 4, 2, 64, torch.float32)
    args = list(batch.args(0.125))
    with pytest.raises(ValueError, match="one dtype"):
        paged_attention(batch.query.half(), *args[1:])
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        paged_attention(batch.query[:, :3], *args[1:])
    with pytest.raises(ValueError, match="query_start_loc"):
        paged_attention(*args[:3], batch.query_start_loc[:1], *args[4:])
    with pytest.raises(ValueError, match="sliding_window"):
        paged_attention(*args[:9], 0)
