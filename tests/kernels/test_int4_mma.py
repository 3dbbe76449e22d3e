"""The register mma INT4 kernel for small M (``kernels/int4_mma.py``) against the reference
(dequantize + matmul in fp32) on CUDA, and its word order on the CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels.int4_gemm import Int4GemmConfig, choose_config, int4_gemm, int4_gemm_ref
from kernels.int4_mma import (
    _mma_source_k,
    int4_mma,
    int4_mma_ok,
    mma_order,
    to_mma,
)
from kernels.int4_weight import unpack_words
from tests.kernels.test_int4_gemm import (
    assert_close,
    assert_eager_and_replayed,
    late_copy_kernel,
    random_weight,
)

cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8,
    reason="needs an sm_80+ GPU (mma.sync)",
)


def test_mma_order_columns():
    """Column j = 8r + 2t + h of a tile holds column 32t + 2r + h, so lane t (of an mma
    m16n8k16 operand, which holds columns 2t, 2t + 1, 2t + 8, 2t + 9 of every 16) multiplies
    x's columns 32t .. 32t + 31, and every column of the tile appears once."""
    src = _mma_source_k().tolist()
    assert sorted(src) == list(range(128))
    for t in range(4):
        lane_cols = [16 * s + 8 * half + 2 * t + h for s in range(8) for half in (0, 1)
                     for h in (0, 1)]  # fmt: skip
        assert sorted(src[j] for j in lane_cols) == list(range(32 * t, 32 * t + 32))


def test_mma_order_keeps_every_code():
    """The same codes per 128-column tile of a row, only reordered (nothing lost or mixed
    across tiles or rows)."""
    weight = random_weight(5, 384, 128, seed=3)
    codes = unpack_words(weight.qweight.cpu()).reshape(5, 3, 128)
    ordered = unpack_words(mma_order(weight.qweight.cpu())).reshape(5, 3, 128)
    assert torch.equal(codes.sort(dim=-1).values, ordered.sort(dim=-1).values)
    assert not torch.equal(codes, ordered)


def _mma_weight(n: int, k: int, group: int, seed: int, scale_dtype=torch.float16):
    weight = random_weight(n, k, group, seed=seed)
    weight = dataclasses.replace(
        weight, scales=weight.scales.to(scale_dtype), offsets=weight.offsets.to(scale_dtype)
    )
    return weight, to_mma(weight)


# (block_m, warps, split_k, depth, wsplit, row_tiles); K = 1024 is 8 tiles: wsplit configs
# give warps of 2 and 1 tiles (a group of 256 then applies once per group or after every
# tile) and a split-K of 3 that rounds up to whole warps; 2 and 4 row tiles per warp, over
# rows and over K, with N = 1037 leave the last program's row tiles partly or wholly past N.
CFGS = [(8, 4, 1, 2, False, 1), (8, 1, 3, 1, False, 1), (16, 2, 2, 2, False, 1),
        (8, 8, 8, 2, False, 1), (16, 4, 5, 1, False, 1), (8, 4, 1, 2, True, 1),
        (16, 8, 1, 1, True, 1), (8, 4, 3, 2, True, 1), (32, 2, 2, 1, True, 1),
        (16, 8, 1, 1, True, 2), (8, 4, 3, 2, True, 4), (16, 2, 2, 1, False, 2),
        (8, 4, 1, 2, False, 4)]  # fmt: skip


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [128, 256, 1024])  # 1024 = K: per channel
@pytest.mark.parametrize("cfg", CFGS, ids=lambda c: "m{}w{}s{}d{}{}r{}".format(*c))
def test_matches_reference(dtype, group, cfg):
    block_m, warps, split, depth, wsplit, row_tiles = cfg
    ref_w, weight = _mma_weight(1000 + 37, 1024, group, seed=group + split)  # odd N: masked
    for m in (1, 5, 16, 21):
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        assert int4_mma_ok(x)
        out = int4_mma(x, weight, block_m=block_m, num_warps=warps, split_k=split, depth=depth,
                       wsplit=wsplit, row_tiles=row_tiles)  # fmt: skip
        assert_close(out, int4_gemm_ref(x, ref_w), dtype, f"mma {cfg} M={m} g={group}")


# (block_m, warps, split_k, depth, row_tiles, x_stages, row_warps): warps over K with x's
# tiles copied into shared memory; K = 1024 (8 tiles) gives warps of 1, 2 or 4 tiles, and 3
# splits round up to whole warps. Row warps: K groups of 2, 4 or 8 warps over different rows
# that share the group's copies (one group of 8 has all of K; 4 of 2 rows tiles, 128 rows).
XS_CFGS = [(8, 4, 1, 2, 1, 2, 1), (16, 8, 1, 1, 2, 2, 1), (8, 2, 3, 2, 4, 3, 1),
           (32, 4, 2, 1, 2, 3, 1), (16, 2, 1, 1, 1, 3, 1), (16, 8, 1, 1, 1, 2, 2),
           (16, 8, 2, 2, 1, 2, 4), (16, 8, 1, 1, 1, 2, 8), (8, 4, 1, 2, 2, 3, 4),
           (32, 16, 3, 1, 1, 2, 4)]  # fmt: skip


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [128, 256, 1024])
@pytest.mark.parametrize("cfg", XS_CFGS, ids=lambda c: "m{}w{}s{}d{}r{}x{}rw{}".format(*c))
@pytest.mark.parametrize("scaled", [False, True], ids=["ones", "scaled"])
def test_x_through_shared_memory(dtype, group, cfg, scaled):
    """``x_smem``: the warps-over-K kernel as a batched mma, x's tiles copied into a shared
    ring and read back by ldmatrix, on fragment-ordered words in place (odd N, M across
    several programs' x rows), with one warp or a group of row warps per K range; the
    scales applied per group to the sums of codes and of x, or in the decode (``scaled``;
    group 1024 is per channel)."""
    block_m, warps, split, depth, row_tiles, x_stages, row_warps = cfg
    ref_w = random_weight(1037, 1024, group, seed=group + warps)
    ref_w = dataclasses.replace(
        ref_w, scales=ref_w.scales.to(torch.float16), offsets=ref_w.offsets.to(torch.float16)
    )
    view = to_mma(ref_w.to_frag(), contiguous_x=False)
    for m in (1, 5, 16, 21):
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        out = int4_mma(x, view, block_m, warps, split, depth, wsplit=True, row_tiles=row_tiles,
                       x_smem=True, x_stages=x_stages, row_warps=row_warps,
                       scaled=scaled)  # fmt: skip
        assert_close(out, int4_gemm_ref(x, ref_w), dtype, f"x_smem {cfg} M={m} g={group}")
    x = torch.randn(3, 1152, device="cuda", dtype=dtype)  # 9 tiles: ranges past K read nothing
    ref_w = random_weight(203, 1152, 128, seed=5)
    out = int4_mma(x, to_mma(ref_w.to_frag(), contiguous_x=False), block_m, warps, split, depth,
                   wsplit=True, row_tiles=row_tiles, x_smem=True, x_stages=x_stages,
                   row_warps=row_warps, scaled=scaled)  # fmt: skip
    assert_close(out, int4_gemm_ref(x, ref_w), dtype, f"x_smem {cfg} K=1152")


# (block_m, warps, split_k, depth, wsplit, row_tiles, x_smem, row_warps, scaled): the in-place
# kernel over rows and over K, and x through shared memory with row warps and the scaled
# decode, as the table runs them
TILED_CFGS = [(8, 4, 1, 2, False, 1, False, 1, False), (8, 16, 1, 1, True, 1, False, 1, False),
              (16, 4, 3, 1, True, 2, False, 1, False), (8, 8, 1, 1, True, 1, True, 1, False),
              (16, 8, 2, 1, True, 1, True, 2, True),
              (16, 8, 1, 2, True, 2, True, 1, False)]  # fmt: skip


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("group", [128, 384, 1152])  # 1152 = K: per channel
@pytest.mark.parametrize("cfg", TILED_CFGS, ids=lambda c: "m{}w{}s{}d{}{}r{}x{}rw{}sc{}".format(*c))
def test_tile_order_matches_reference(group, cfg):
    """Words in ``tile_order`` (fragment order within each tile) on both mma kernels: N =
    1040 leaves the last programs' row tiles past N, K = 1152 (9 tiles) warps and splits past
    K; eagerly, as dependent launches with the words issued before the wait."""
    block_m, warps, split, depth, wsplit, row_tiles, x_smem, row_warps, scaled = cfg
    ref_w = random_weight(1040, 1152, group, seed=group + warps)
    view = to_mma(ref_w.to_frag(), contiguous_x=False, tiled=True)
    assert view.tiled and view.qweight.shape == ref_w.qweight.shape
    for m in (1, 5, 16, 21):
        x = torch.randn(m, 1152, device="cuda", dtype=torch.bfloat16)
        for launch in (dict(), dict(pdl=True, weights_first=True)):
            out = int4_mma(x, view, block_m, warps, split, depth, wsplit=wsplit,
                           row_tiles=row_tiles, x_smem=x_smem, row_warps=row_warps,
                           scaled=scaled, **launch)  # fmt: skip
            ref = int4_gemm_ref(x, ref_w)
            assert_close(out, ref, torch.bfloat16, f"tiled {cfg} {launch} M={m} g={group}")


# (block_m, warps, split_k, depth, wsplit, row_tiles, x_smem, maxnreg): the in-place kernel
# over rows and over K (the table's down_proj M <= 2 form, capped at 64 registers) and x
# through shared memory (the table's M <= 8 and o_proj M = 9-16 forms, and two row tiles
# with split-K); K = 1536 is 12 tiles: 4 warps over K get 3 each, so groups of 256 apply
# after every tile too
AHEAD_CFGS = [(8, 4, 2, 1, False, 1, False, None), (8, 16, 1, 1, True, 1, False, 64),
              (8, 4, 1, 2, True, 2, False, None), (8, 8, 1, 1, True, 1, True, 80),
              (16, 8, 1, 1, True, 1, True, None), (8, 4, 2, 1, True, 2, True, 128)]  # fmt: skip


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("group", [128, 256, 1536])  # 1536 = K: per channel (ignored)
@pytest.mark.parametrize("cfg", AHEAD_CFGS, ids=lambda c: "m{}w{}s{}d{}{}r{}x{}c{}".format(*c))
def test_scales_ahead_matches_reference(group, cfg):
    """``s_ahead``: each tile's scales and offsets loaded with its words, a tile ahead, on
    both kernels (N = 1037: the last rows masked), row-major and in ``tile_order`` (N =
    1040), eagerly and as a dependent launch that issues the words before its wait."""
    block_m, warps, split, depth, wsplit, row_tiles, x_smem, cap = cfg
    for n, tiled in ((1037, False), (1040, True)):
        ref_w = random_weight(n, 1536, group, seed=group + warps + n)
        view = to_mma(ref_w.to_frag(), contiguous_x=False, tiled=tiled)
        for m in (1, 5, 16):
            x = torch.randn(m, 1536, device="cuda", dtype=torch.bfloat16)
            for launch in (dict(), dict(pdl=True, weights_first=True)):
                args = dict(block_m=block_m, num_warps=warps, split_k=split, depth=depth,
                            wsplit=wsplit, row_tiles=row_tiles, x_smem=x_smem, maxnreg=cap,
                            **launch)  # fmt: skip
                out = int4_mma(x, view, s_ahead=True, **args)
                what = f"s_ahead {cfg} {launch} N={n} M={m} g={group}"
                assert_close(out, int4_gemm_ref(x, ref_w), torch.bfloat16, what)


# (block_m, warps, split_k, row_tiles, x_stages, row_warps, scaled): x through shared memory
# with the words in its ring, 1-3 tiles ahead; K = 1152 is 9 tiles, so 8 warps over K get
# one each, 4 get 3 (the last past K), and 2 splits of 8 warps run past K
RING_CFGS = [(8, 8, 1, 1, 2, 1, False), (8, 8, 1, 1, 3, 1, False), (8, 4, 1, 2, 4, 1, False),
             (16, 8, 1, 1, 3, 2, True), (16, 8, 2, 1, 4, 2, False), (8, 8, 2, 2, 3, 1, False),
             (16, 8, 1, 1, 2, 1, True)]  # fmt: skip


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("group", [128, 384, 1152])  # 1152 = K: per channel
@pytest.mark.parametrize("cfg", RING_CFGS, ids=lambda c: "m{}w{}s{}r{}x{}rw{}sc{}".format(*c))
def test_words_through_the_ring_match_reference(group, cfg):
    """``w_ring``: the words copied into x's ring (``cp.async``) ``x_stages`` - 1 tiles
    ahead, with and without the scales a tile ahead (``s_ahead``), row-major (N = 1037) and
    in ``tile_order`` (N = 1040), eagerly and as a dependent launch that issues the first
    tiles' words before its wait."""
    block_m, warps, split, row_tiles, x_stages, row_warps, scaled = cfg
    for n, tiled in ((1037, False), (1040, True)):
        ref_w = random_weight(n, 1152, group, seed=group + x_stages + n)
        view = to_mma(ref_w.to_frag(), contiguous_x=False, tiled=tiled)
        for m in (1, 5, 16, 21):
            x = torch.randn(m, 1152, device="cuda", dtype=torch.bfloat16)
            ref = int4_gemm_ref(x, ref_w)
            for launch in (dict(s_ahead=True), dict(pdl=True, weights_first=True)):
                out = int4_mma(x, view, block_m, warps, split, 1, wsplit=True,
                               row_tiles=row_tiles, x_smem=True, x_stages=x_stages,
                               row_warps=row_warps, scaled=scaled, w_ring=True,
                               **launch)  # fmt: skip
                what = f"w_ring {cfg} {launch} N={n} M={m} g={group}"
                assert_close(out, ref, torch.bfloat16, what)


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("group", [128, 1152])
@pytest.mark.parametrize("cfg", [(8, 4, 1, 2, True, 1), (8, 8, 2, 1, True, 1),
                                 (16, 4, 2, 2, False, 1), (16, 8, 1, 1, True, 2)])  # fmt: skip
def test_k_tiles_not_a_multiple_of_the_warps(group, cfg):
    """K = 1152 (9 tiles): the last warps' and splits' ranges run past K and read nothing."""
    block_m, warps, split, depth, wsplit, row_tiles = cfg
    ref_w, weight = _mma_weight(203, 1152, group, seed=11)
    for m in (1, 9):
        x = torch.randn(m, 1152, device="cuda", dtype=torch.bfloat16)
        out = int4_mma(x, weight, block_m=block_m, num_warps=warps, split_k=split, depth=depth,
                       wsplit=wsplit, row_tiles=row_tiles)  # fmt: skip
        assert_close(out, int4_gemm_ref(x, ref_w), torch.bfloat16, f"K=1152 {cfg} M={m}")


@cuda
@pytest.mark.gpu
def test_bf16_scales_pdl_and_graph_replay():
    """bf16 scales and offsets, a dependent launch, and replays inside a CUDA graph, where the
    split-K workspace was sized before the capture."""
    ref_w, weight = _mma_weight(512, 2048, 128, seed=9, scale_dtype=torch.bfloat16)
    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    int4_mma(x, weight, split_k=4, pdl=True)
    int4_mma(x, weight, split_k=2, pdl=True, wsplit=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = int4_mma(x, weight, split_k=4, pdl=True)
        out2 = int4_mma(out @ torch.zeros(512, 2048, device="cuda", dtype=torch.bfloat16) + x,
                        weight, split_k=2, pdl=True, wsplit=True)  # fmt: skip
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        ref = int4_gemm_ref(x, ref_w)
        assert_close(out, ref, torch.bfloat16, "graph")
        assert_close(out2, ref, torch.bfloat16, "graph, chained")


# (block_m, warps, split_k, depth, x_smem, row_warps, scaled): the table's forms with
# ``weights_first`` (M <= 2 on long K; x through shared memory at M <= 16, with row warps and
# the scaled decode), two tiles ahead, and split-K (whose workspace is touched after the wait)
FIRST_CFGS = [(8, 16, 1, 1, False, 1, False), (8, 8, 2, 2, False, 1, False),
              (8, 8, 1, 1, True, 1, False), (16, 8, 2, 2, True, 2, True),
              (16, 8, 1, 1, True, 2, True)]  # fmt: skip


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", FIRST_CFGS, ids=lambda c: "m{}w{}s{}d{}x{}rw{}sc{}".format(*c))
def test_weights_first_reads_x_after_the_previous_kernel(cfg):
    """``weights_first``: the words stream in before the wait on the previous kernel, x only
    after it. The previous kernel lets it start at once and writes x only after a long spin;
    the output must be that of the new x, eagerly and replayed from a CUDA graph, and a
    weight written by torch's own copy just before must be read as written (torch's kernels
    never let a dependent start early: ``kernels.pdl``)."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch is sm_90+")
    import triton

    block_m, warps, split, depth, x_smem, row_warps, scaled = cfg
    late_copy = late_copy_kernel()
    old_w = random_weight(1037, 2048, 128, seed=21)
    new_w = random_weight(1037, 2048, 128, seed=22)
    view = to_mma(old_w.to_frag(), contiguous_x=False)
    old_words = old_w.to_frag().qweight.clone()
    new_words = new_w.to_frag().qweight.clone()
    spin = torch.empty(8192, device="cuda")
    for m in (1, 5, 16):
        old_x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        new_x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        x = old_x.clone()
        expected = dataclasses.replace(old_w, qweight=new_w.qweight)  # old scales, new words
        ref = int4_gemm_ref(new_x, expected)

        def step(x=x, old_x=old_x, new_x=new_x):
            view.qweight.copy_(old_words)
            view.qweight.copy_(new_words)  # torch's copy: ends before the gemm may start
            x.copy_(old_x)
            late_copy[(triton.cdiv(x.numel(), 4096),)](
                new_x, x, spin, x.numel(), SPIN=20000, BLOCK=4096
            )
            return int4_mma(x, view, block_m, warps, split, depth, pdl=True,
                            weights_first=True, wsplit=True, x_smem=x_smem,
                            row_warps=row_warps, scaled=scaled)  # fmt: skip

        what = f"weights first {cfg} M={m}"
        assert_eager_and_replayed(step, ref, what)


def test_rejects_what_it_cannot_run():
    weight = random_weight(16, 256, 128, seed=1)
    x = torch.randn(1, 256, dtype=torch.bfloat16)
    assert not int4_mma_ok(x)  # CPU
    with pytest.raises(TypeError, match="to_mma"):
        int4_mma(x, weight)
    with pytest.raises(ValueError, match="depth"):
        int4_mma(x, to_mma(weight), depth=3)
    with pytest.raises(ValueError, match="row_tiles"):
        int4_mma(x, to_mma(weight), row_tiles=3)
    with pytest.raises(ValueError, match="x_smem needs wsplit"):
        int4_mma(x, to_mma(weight), wsplit=True, x_smem=True)  # mma_order words
    with pytest.raises(ValueError, match="x_smem needs wsplit"):
        int4_mma(x, to_mma(weight, contiguous_x=False), x_smem=True)
    with pytest.raises(ValueError, match="x_stages"):
        int4_mma(x, to_mma(weight), x_stages=5)
    with pytest.raises(ValueError, match="w_ring needs x_smem"):
        int4_mma(x, to_mma(weight, contiguous_x=False), wsplit=True, w_ring=True)
    with pytest.raises(ValueError, match="scaled"):
        int4_mma(x, to_mma(weight), scaled=True)  # without x_smem
    frag = to_mma(weight, contiguous_x=False)
    with pytest.raises(ValueError, match="row_warps"):
        int4_mma(x, frag, num_warps=8, wsplit=True, row_warps=2)  # without x_smem
    with pytest.raises(ValueError, match="row_warps"):
        int4_mma(x, frag, 16, 4, wsplit=True, x_smem=True, row_warps=8)  # not dividing warps
    with pytest.raises(ValueError, match="row_warps"):
        int4_mma(x, frag, 8, 8, wsplit=True, x_smem=True, row_warps=8)  # > block_m // 2
    with pytest.raises(ValueError, match="multiples of 128"):
        to_mma(random_weight(16, 256, 64, seed=1))
    with pytest.raises(ValueError, match="act-order"):
        to_mma(random_weight(16, 256, 128, seed=1, perm=True))
    with pytest.raises(ValueError, match="K=128"):
        int4_mma(torch.randn(1, 128, dtype=torch.bfloat16), to_mma(weight))


def test_to_mma_from_fragment_order():
    """A weight held in fragment order (``Int4Weight.to_frag``) gives the same words."""
    weight = random_weight(24, 256, 128, seed=4)
    assert torch.equal(to_mma(weight.to_frag()).qweight, to_mma(weight).qweight)


@cuda
@pytest.mark.gpu
def test_table_runs_fragment_order_on_mma_at_small_m():
    """``int4_gemm``'s table sends small M on a fragment-ordered weight with N <= 8192 to the
    register mma kernel (reading the words in place): K < 8192 through shared memory up to
    M = 16, with registers capped at 96 (N <= 4224) or 80 up to M = 8, the scales in the
    decode above M = 8, with two row warps at M = 9-16 for N > 4096 (and at M = 17-32, 16 x
    rows per program, for N <= 4096); down_proj-sized ones (K >= 8192) in place at M <= 2
    and through shared memory at 3-8 (the swapped kernel above); wide ones (N > 8192) up to
    M = 8. Eagerly, from a CUDA graph, and with fp32 x (which it does not take: the swapped
    kernel's path runs)."""
    cuda = torch.device("cuda")
    for n, seed, cases in [
        (2056, 21, [(1, 16, 1, 96), (2, 16, 1, 96), (8, 16, 1, 96), (9, 16, 1, None),
                    (16, 16, 1, None)]),
        (2056, 26, [(17, 32, 2, 128), (27, 32, 2, 128), (32, 32, 2, 128)]),
        (4232, 25, [(1, 16, 1, 80), (5, 16, 1, 80), (9, 32, 2, None), (16, 32, 2, None)]),
    ]:  # fmt: skip
        ref_w = random_weight(n, 1024, 128, seed=seed)
        weight = ref_w.to_frag()
        for m, rows, row_warps, cap in cases:
            cfg = choose_config(m, n, 1024, 128, cuda, frag=True)
            assert cfg.strategy == "mma" and cfg.x_smem, (m, cfg)
            assert (cfg.block_n, cfg.row_warps, cfg.maxnreg) == (rows, row_warps, cap), (m, cfg)
            assert cfg.scaled == (m > 8), (m, cfg)  # M = 9-32: the scales in the decode
            x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
            want = int4_gemm_ref(x, ref_w)
            assert_close(int4_gemm(x, weight), want, torch.bfloat16, f"N={n} M={m}")
    ref_w = random_weight(2056, 1024, 128, seed=21)
    weight = ref_w.to_frag()
    for m, n, k, mma in [(1, 6144, 4096, True), (8, 6144, 4096, True), (16, 6144, 4096, True),
                         (17, 6144, 4096, False), (17, 2056, 1024, True), (2, 4096, 14336, True),
                         (8, 4096, 14336, True), (9, 4096, 14336, False),
                         (17, 4096, 14336, False),
                         (33, 2056, 1024, False), (1, 28672, 4096, True),
                         (8, 28672, 4096, True), (9, 28672, 4096, False)]:  # fmt: skip
        assert (choose_config(m, n, k, 128, cuda, frag=True).strategy == "mma") == mma, (m, n, k)
    ref_k = random_weight(520, 8192, 128, seed=24)  # K >= 8192: split-K 2 through smem at M = 5
    cfg = choose_config(5, 520, 8192, 128, cuda, frag=True)
    assert (cfg.split_k, cfg.x_smem, cfg.block_n, cfg.maxnreg) == (2, True, 32, None), cfg
    assert not choose_config(2, 520, 8192, 128, cuda, frag=True).x_smem
    x = torch.randn(5, 8192, device="cuda", dtype=torch.bfloat16)
    assert_close(int4_gemm(x, ref_k.to_frag()), int4_gemm_ref(x, ref_k), torch.bfloat16, "K=8192")
    assert choose_config(33, 2056, 1024, 128, cuda, frag=True).swap
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = int4_gemm(x, weight)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert_close(out, int4_gemm_ref(x, ref_w), torch.bfloat16, "graph")
    x32 = torch.randn(1, 1024, device="cuda")
    assert_close(int4_gemm(x32, weight), int4_gemm_ref(x32, ref_w), torch.float32, "fp32 x")
    act_order = random_weight(2056, 1024, 128, seed=23, perm=True)  # x gathered by in_perm
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    want = int4_gemm_ref(x, act_order)
    assert_close(int4_gemm(x, act_order.to_frag()), want, torch.bfloat16, "act-order")


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("group", [128, 1024])
def test_fragment_order_words_in_place(group):
    """``to_mma(..., contiguous_x=False)`` reads a fragment-ordered weight's words as they are
    (no copy) and gives the reference's output, split and unsplit, warps over rows or K."""
    ref_w = random_weight(520, 1024, group, seed=22)
    frag = ref_w.to_frag()
    view = to_mma(frag, contiguous_x=False)
    assert view.qweight.data_ptr() == frag.qweight.data_ptr()
    for cfg in [(8, 16, 1, 1, True, 1), (16, 4, 2, 2, True, 1), (8, 2, 3, 2, False, 1),
                (16, 8, 1, 1, True, 2), (8, 16, 1, 1, True, 2)]:  # fmt: skip
        block_m, warps, split, depth, wsplit, row_tiles = cfg
        for m in (1, 13):
            x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
            out = int4_mma(x, view, block_m, warps, split, depth, wsplit=wsplit,
                           row_tiles=row_tiles)  # fmt: skip
            assert_close(out, int4_gemm_ref(x, ref_w), torch.bfloat16, f"{cfg} M={m}")


def test_config_checks():
    with pytest.raises(ValueError, match="wsplit"):
        Int4GemmConfig("gemv", wsplit=True)
    # the swapped wgmma kernel's second warpgroup: plain loop, one warpgroup each, no cap
    Int4GemmConfig("wgmma", 64, 64, 128, 1, 4, 3, swap=True, wsplit=True, pipe=True)
    for bad in ({"specialized": True}, {"num_warps": 8}, {"maxnreg": 200}, {"swap": False}):
        with pytest.raises(ValueError, match="wsplit applies"):
            Int4GemmConfig(**{"strategy": "wgmma", "swap": True, "wsplit": True, **bad})
    with pytest.raises(ValueError, match="x_smem"):
        Int4GemmConfig("wgmma", swap=True, wsplit=True, x_smem=True)
    with pytest.raises(ValueError, match="1 or 2"):
        Int4GemmConfig("mma", num_stages=3)
    with pytest.raises(ValueError, match="16, 32 or 64 weight rows"):
        Int4GemmConfig("mma", block_n=128, num_stages=1, wsplit=True)
    with pytest.raises(ValueError, match="times num_warps"):
        Int4GemmConfig("mma", block_n=32, num_warps=4, num_stages=1)
    with pytest.raises(ValueError, match="x_smem"):
        Int4GemmConfig("mma", num_stages=1, x_smem=True)
    with pytest.raises(ValueError, match="row_warps"):
        Int4GemmConfig("mma", block_n=32, num_stages=1, wsplit=True, row_warps=2)  # no x_smem
    with pytest.raises(ValueError, match="row_warps"):
        Int4GemmConfig("mma", block_n=64, num_warps=2, num_stages=1, wsplit=True, x_smem=True,
                       row_warps=4)  # fmt: skip
    with pytest.raises(ValueError, match="row_warps"):
        Int4GemmConfig("mma", 8, 64, num_warps=8, num_stages=1, wsplit=True, x_smem=True,
                       row_warps=8)  # fmt: skip  # 8 x rows for 8 row warps' copies
    with pytest.raises(ValueError, match="scaled"):
        Int4GemmConfig("mma", block_n=16, num_stages=1, wsplit=True, scaled=True)  # no x_smem
    with pytest.raises(ValueError, match="weights_first"):
        Int4GemmConfig("mma", block_n=16, num_stages=1, wsplit=True, weights_first=True)
    with pytest.raises(ValueError, match="weights_first"):
        Int4GemmConfig("gemv", pdl=True, weights_first=True)
    with pytest.raises(ValueError, match="weights_first"):
        Int4GemmConfig("wgmma", swap=True, specialized=True, pdl=True, weights_first=True)
    Int4GemmConfig("wgmma", swap=True, pdl=True, weights_first=True)  # form 3 of the kernel
    with pytest.raises(ValueError, match="s_ahead"):
        Int4GemmConfig("wgmma", swap=True, s_ahead=True)
    with pytest.raises(ValueError, match="w_ring"):
        Int4GemmConfig("mma", 8, 16, 128, 1, 8, 1, wsplit=True, w_ring=True)
    with pytest.raises(ValueError, match="1-3 with w_ring"):
        Int4GemmConfig("mma", 8, 16, 128, 1, 8, 3, wsplit=True, x_smem=True)
    Int4GemmConfig("mma", 8, 16, 128, 1, 8, 3, wsplit=True, x_smem=True, w_ring=True)
    with pytest.raises(ValueError, match="s_ahead"):
        Int4GemmConfig("mma", 16, 16, 128, 1, 8, 1, wsplit=True, x_smem=True, scaled=True,
                       s_ahead=True)  # fmt: skip
    Int4GemmConfig("mma", 8, 16, 128, 1, 8, 1, wsplit=True, x_smem=True, s_ahead=True)
    with pytest.raises(ValueError, match="maxnreg"):
        Int4GemmConfig("gemv", maxnreg=80)
    with pytest.raises(ValueError, match="maxnreg"):
        Int4GemmConfig("wgmma", maxnreg=128)  # unswapped: not a launch option there
    cfg = Int4GemmConfig("mma", block_n=64, num_warps=8, num_stages=1, wsplit=True, x_smem=True,
                         row_warps=2, maxnreg=80)  # fmt: skip
    assert cfg.row_tiles == 2  # 64 rows: two row warps of two 16-row tiles
    Int4GemmConfig("mma", block_n=64, num_warps=2, num_stages=1)  # 2 warps of 32 rows
