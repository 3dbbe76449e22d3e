"""The Gluon W4A16 kernel for large M (``kernels/int4_wgmma.py``) against the reference
(dequantize + matmul in fp32), on Hopper GPUs only (wgmma, TMA)."""

from __future__ import annotations

import pytest
import torch

from kernels import split_k
from kernels.int4_gemm import int4_gemm_ref
from kernels.int4_wgmma import int4_wgmma, int4_wgmma_swap, wgmma_ok, wgmma_swap_ok
from tests.kernels.test_int4_gemm import (
    assert_close,
    assert_eager_and_replayed,
    assert_sees_a_late_write,
    late_copy_kernel,
    random_weight,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs an sm_90+ GPU (wgmma, TMA)")


@pytest.mark.parametrize("group_size", [64, 128, 1024])  # 1024 = K: per channel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "tiles",
    [(128, 128, 64, 4, 8), (128, 128, 64, 5, 8), (64, 128, 64, 4, 4), (128, 256, 64, 4, 8)],
    ids=lambda t: "x".join(map(str, t)),
)
def test_matches_reference(group_size, dtype, tiles):
    block_m, block_n, block_k, stages, warps = tiles
    weight = random_weight(1000 + 37, 1024, group_size, seed=group_size)  # odd N: masked tiles
    for m in (1, 77, 128, 300):
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        assert wgmma_ok(x, weight, block_k)
        out = int4_wgmma(x, weight, block_m, block_n, block_k, stages, warps)
        assert_close(out, int4_gemm_ref(x, weight), dtype, f"wgmma {tiles} M={m} g={group_size}")


def test_short_k_and_graph_replay():
    """K of one tile (fewer K steps than ring slots) and replays inside a CUDA graph."""
    weight = random_weight(200, 64, 64, seed=5)
    x = torch.randn(130, 64, device="cuda", dtype=torch.bfloat16)
    assert_close(int4_wgmma(x, weight), int4_gemm_ref(x, weight), torch.bfloat16, "K = 64")
    weight = random_weight(512, 2048, 128, seed=6)
    x = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
    int4_wgmma(x, weight)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = int4_wgmma(x, weight)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert_close(out, int4_gemm_ref(x, weight), torch.bfloat16, "graph")


# The swapped form (small M): (block_m, block_n, block_k, split_k, stages, warps). Block_m is
# wgmma's N (8 .. 256); splits of 3 leave a shorter last split.
SWAP_TILES = [(16, 128, 64, 1, 4, 4), (16, 64, 64, 3, 6, 4), (64, 128, 64, 2, 4, 4),
              (8, 64, 128, 4, 4, 4), (32, 256, 64, 2, 4, 8), (128, 64, 64, 1, 3, 4)]  # fmt: skip


@pytest.mark.parametrize("group_size", [64, 128, 1024])  # 1024 = K: per channel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tiles", SWAP_TILES, ids=lambda t: "x".join(map(str, t)))
def test_swap_matches_reference(group_size, dtype, tiles):
    block_m, block_n, block_k, split, stages, warps = tiles
    if group_size < block_k:
        pytest.skip("K tiles within one group")
    # N a multiple of 8 (scale rows by TMA), not of the tile: masked tiles
    weight = random_weight(1000 + 40, 1024, group_size, seed=group_size)
    for m in (1, 5, 16, 37, 64, 130):
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        assert wgmma_swap_ok(x, weight, block_k)
        out = int4_wgmma_swap(x, weight, block_m, block_n, block_k, split, stages, warps)
        assert_close(out, int4_gemm_ref(x, weight), dtype, f"swap {tiles} M={m} g={group_size}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "tiles", [(16, 128, 128, 1, 4, 4), (16, 64, 64, 3, 3, 4), (64, 128, 128, 2, 4, 8),
              (256, 128, 128, 1, 2, 8), (128, 64, 128, 2, 4, 4)],
    ids=lambda t: "x".join(map(str, t)),
)  # fmt: skip
def test_swap_specialized_matches_reference(dtype, tiles):
    """The warp-specialized form: a producer warp refills the ring, the decoding warps hand
    slots back through empty barriers (K of 1024 gives 4-16 K tiles against rings of 2-4)."""
    weight = random_weight(1000 + 40, 1024, 128, seed=11)
    for m in (1, 16, 37, 130):
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        out = int4_wgmma_swap(x, weight, *tiles, specialized=True)
        assert_close(out, int4_gemm_ref(x, weight), dtype, f"specialized {tiles} M={m}")


def test_swap_split_k_slots_are_deterministic():
    """Split-K partials stored in slots and added by the tile's last split in split order
    (MODE 3): repeated calls give bitwise the same output, within the reference tolerance;
    the atomic reduction (``slots=False``) agrees with the reference too."""
    weight = random_weight(1000 + 40, 2048, 128, seed=12)
    for m, tiles in ((1, (8, 64, 128, 4, 4, 4)), (37, (64, 64, 128, 5, 4, 4))):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        ref = int4_gemm_ref(x, weight)
        first = int4_wgmma_swap(x, weight, *tiles)
        assert_close(first, ref, torch.bfloat16, f"slots {tiles} M={m}")
        for _ in range(3):
            assert torch.equal(int4_wgmma_swap(x, weight, *tiles), first), f"{tiles} M={m}"
        atomics = int4_wgmma_swap(x, weight, *tiles, slots=False)
        assert_close(atomics, ref, torch.bfloat16, f"atomics {tiles} M={m}")


def test_graph_replay_after_the_split_k_workspace_grew():
    """A graph captured with a split-K launch keeps using the workspace of its capture after a
    bigger launch has grown the workspace: replays stay right, and tensors allocated after the
    growth (which would take the old workspace's memory, were it freed) are not written."""
    weight = random_weight(1000 + 40, 2048, 128, seed=13)
    tiles = (8, 64, 128, 4, 4, 4)
    saved = dict(split_k._WORKSPACES)
    split_k._WORKSPACES.clear()
    try:
        x = torch.randn(4, 2048, device="cuda", dtype=torch.bfloat16)
        int4_wgmma_swap(x, weight, *tiles)  # compiled; the smallest slot workspace
        small = split_k._WORKSPACES[x.device, True][0].numel()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = int4_wgmma_swap(x, weight, *tiles)
        big = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
        grown = int4_wgmma_swap(big, weight, 64, 64, 128, 8, 4, 4)
        assert_close(grown, int4_gemm_ref(big, weight), torch.bfloat16, "the launch that grows")
        assert split_k._WORKSPACES[x.device, True][0].numel() > small
        fillers = [torch.full((small,), 7.0, device="cuda") for _ in range(4)]
        for _ in range(2):
            x.copy_(torch.randn_like(x))
            graph.replay()
            assert_close(out, int4_gemm_ref(x, weight), torch.bfloat16, "replay after growth")
        assert all(bool((f == 7.0).all()) for f in fillers), "a replay wrote into a new tensor"
    finally:
        split_k._WORKSPACES.clear()
        split_k._WORKSPACES.update(saved)


def test_swap_group_32_and_graph_capture_without_workspace():
    """K tiles of 32 (group 32), then a capture that would have to grow the split-K
    workspace: the launch adds into a zeroed fp32 output instead (MODE 1)."""
    weight = random_weight(296, 2048, 32, seed=7)
    assert not wgmma_swap_ok(torch.empty(1, 2048, device="cuda", dtype=torch.bfloat16),
                             random_weight(300, 2048, 32, seed=7), 32)  # fmt: skip
    x = torch.randn(24, 2048, device="cuda", dtype=torch.bfloat16)
    out = int4_wgmma_swap(x, weight, 32, 64, 32, 4, 6, 4)
    assert_close(out, int4_gemm_ref(x, weight), torch.bfloat16, "group 32")
    int4_wgmma_swap(x, weight, 32, 64, 32, 4, 6, 4)  # compiled
    saved = dict(split_k._WORKSPACES)
    split_k._WORKSPACES.clear()
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                out = int4_wgmma_swap(x, weight, 32, 64, 32, 4, 6, 4)
        torch.cuda.current_stream().wait_stream(stream)
        assert not split_k._WORKSPACES, "the capture must not allocate a workspace"
        for _ in range(2):
            x.copy_(torch.randn_like(x))
            graph.replay()
            assert_close(out, int4_gemm_ref(x, weight), torch.bfloat16, "graph, MODE 1")
    finally:
        split_k._WORKSPACES.update(saved)


# Fragment-ordered words (Int4Weight.frag): K tiles of 128 only.
FRAG_TILES = [(8, 128, 128, 1, 4, 4), (16, 64, 128, 3, 4, 4), (64, 128, 128, 1, 4, 8),
              (32, 128, 128, 2, 6, 4), (128, 64, 128, 1, 3, 4)]  # fmt: skip


@pytest.mark.parametrize("tiled", [False, True], ids=["rows", "tiled"])
@pytest.mark.parametrize("group_size", [128, 256, 1024])  # 1024 = K: per channel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tiles", FRAG_TILES, ids=lambda t: "x".join(map(str, t)))
def test_swap_fragment_order_matches_reference(group_size, dtype, tiles, tiled):
    """The swapped kernel on fragment-ordered words (each lane loads its own 16 bytes of a
    row and decodes nibble pairs (j, j + 4)), row-major or also in tile order (the TMA box
    [block_n // 16, 16, 16] of ``_tiled_words_desc``), against the reference on the canonical
    weight; masked N (1040: the last tile of 128 rows half past N), splits of 3 (a short last
    split)."""
    weight = random_weight(1000 + 40, 1024, group_size, seed=group_size + 1)
    frag = weight.to_frag(tiled=tiled)
    for m in (1, 5, 16, 37, 64, 130):
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        out = int4_wgmma_swap(x, frag, *tiles)
        what = f"frag tiled={tiled} {tiles} M={m} g={group_size}"
        assert_close(out, int4_gemm_ref(x, weight), dtype, what)
    if tiles[0] >= 64:
        out = int4_wgmma_swap(x, frag, *tiles, specialized=True)
        assert_close(out, int4_gemm_ref(x, weight), dtype, f"frag specialized {tiles} {tiled}")
    with pytest.raises(ValueError, match="block_k=128"):
        int4_wgmma_swap(x, frag, 16, 64, 64)


# Two wgmmas in flight (``pipe``): (block_m, block_n, block_k, split_k, stages, warps). With K
# = 1024: 8 K tiles of 128 (4 per split of 2), 16 of 64, and 3 per split of 3 (odd: the plain
# loop runs), against rings of 3-4.
PIPE_TILES = [(256, 128, 128, 1, 3, 8), (128, 64, 128, 2, 3, 4), (64, 64, 64, 1, 4, 4),
              (16, 128, 128, 1, 4, 4), (32, 64, 128, 3, 3, 4)]  # fmt: skip


@pytest.mark.parametrize("specialized", [False, True], ids=["plain", "specialized"])
@pytest.mark.parametrize("frag", [False, True], ids=["canonical", "frag"])
@pytest.mark.parametrize("tiles", PIPE_TILES, ids=lambda t: "x".join(map(str, t)))
def test_swap_two_wgmmas_in_flight(tiles, frag, specialized):
    """``pipe``: each K tile's wgmma is issued before the previous one is waited for. It must
    agree with the reference, and bitwise with the one-at-a-time loop (the same products
    into the same accumulator in the same order; a decode that overwrote an operand still
    being read would show as a difference); masked N and M."""
    if frag and tiles[2] != 128:
        pytest.skip("fragment order: K tiles of 128")
    weight = random_weight(1000 + 40, 1024, 128, seed=17)
    words = weight.to_frag() if frag else weight
    for m in (1, 37, 130, 256):
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        out = int4_wgmma_swap(x, words, *tiles, specialized=specialized, pipe=True)
        assert_close(out, int4_gemm_ref(x, weight), torch.bfloat16, f"pipe {tiles} M={m}")
        plain = int4_wgmma_swap(x, words, *tiles, specialized=specialized)
        assert torch.equal(out, plain), f"pipe {tiles} M={m}: differs from the plain loop"
    with pytest.raises(ValueError, match="num_stages >= 3"):
        int4_wgmma_swap(x, words, 16, 64, 128, 1, 2, 4, pipe=True)
    with pytest.raises(ValueError, match="pdl must be 0, 1, 2 or 3"):
        int4_wgmma_swap(x, words, 16, 64, 128, 1, 3, 4, pdl=4)


# Launched as a programmatic dependent (``pdl``): (tiles, frag, specialized, pipe, group).
PDL_CASES = [((8, 64, 128, 4, 4, 4), False, False, False, 128),
             ((16, 64, 128, 3, 4, 4), True, False, False, 256),  # a short last split
             ((64, 128, 128, 2, 4, 8), False, True, True, 128),
             ((128, 64, 128, 2, 3, 4), True, False, True, 1024),  # per channel
             ((16, 128, 64, 1, 6, 4), False, False, False, 64)]  # fmt: skip


@pytest.mark.parametrize("mode", [1, 2, 3])
@pytest.mark.parametrize("case", PDL_CASES, ids=lambda c: "x".join(map(str, c[0])) + str(c[1:]))
def test_swap_as_a_dependent_launch(case, mode):
    """``pdl``: the kernel waits for the previous one before reading anything and lets the
    next launch start on entry (1) or only after its main loop (2), or (3) as 2 with the
    weight's first tiles copied before the wait (not warp-specialized). Bitwise the same
    output as without (the same products in the same order), for plain, warp-specialized and
    ``pipe`` loops, both word orders, split K with a short last split, per-channel and
    64-column groups; and chained back to back in a CUDA graph, each call the dependent of the
    one before."""
    tiles, frag, specialized, pipe, group = case
    weight = random_weight(1000 + 40, 1024, group, seed=23)
    words = weight.to_frag() if frag else weight
    if mode == 3 and specialized:
        with pytest.raises(ValueError, match="not with specialized"):
            int4_wgmma_swap(torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16), words,
                            *tiles, specialized=True, pipe=pipe, pdl=3)  # fmt: skip
        return
    for m in (1, 16, 37, 130):
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        plain = int4_wgmma_swap(x, words, *tiles, specialized=specialized, pipe=pipe)
        out = int4_wgmma_swap(x, words, *tiles, specialized=specialized, pipe=pipe, pdl=mode)
        assert torch.equal(out, plain), f"pdl {case} M={m}: differs from the plain launch"
        assert_close(out, int4_gemm_ref(x, weight), torch.bfloat16, f"pdl {case} M={m}")
    xs = [torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(4)]

    def chain():
        return [int4_wgmma_swap(x, words, *tiles, specialized=specialized, pipe=pipe, pdl=mode)
                for x in xs]  # fmt: skip

    chain()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = chain()
    for _ in range(2):
        for x in xs:
            x.copy_(torch.randn_like(x))
        graph.replay()
        for x, out in zip(xs, outs, strict=True):
            assert_close(out, int4_gemm_ref(x, weight), torch.bfloat16, f"pdl chain {case}")


@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("frag", [False, True], ids=["canonical", "frag"])
def test_swap_dependent_launch_sees_a_write_that_lands_after_it(frag, mode):
    old = random_weight(4096, 4096, 128, seed=11)
    new = random_weight(4096, 4096, 128, seed=12)
    if frag:
        old, new = old.to_frag(), new.to_frag()
    assert_sees_a_late_write(
        lambda x, w: int4_wgmma_swap(x, w, 8, 64, 128, 4, 4, 4, pdl=mode), old, new,
        f"swapped kernel, pdl {mode}, frag={frag}",
    )  # fmt: skip


@pytest.mark.parametrize(
    "order, m, pipe",
    [(order, m, False) for order in ("canonical", "frag", "tiled") for m in (1, 16, 40)]
    + [("frag", 40, True), ("tiled", 64, True)]  # the table's wide form at M = 33-64
    + [("frag", 64, "wsplit"), ("tiled", 40, "wsplit")],  # a second warpgroup's K half
)
def test_swap_weights_first_reads_x_after_the_previous_kernel(order, m, pipe):
    """``pdl=3`` (``weights_first``) copies the weight's first tiles before it waits on the
    previous kernel, x's only after: with that kernel letting it start at once and writing x
    only after a long spin, the output is that of the new x, eagerly and replayed from a
    CUDA graph; also with two wgmmas in flight (``pipe``, 128 weight rows, one warpgroup), and
    with a second warpgroup over the later K half (``wsplit``: both rings' first tiles)."""
    import triton

    late_copy = late_copy_kernel()
    weight = random_weight(1040, 2048, 128, seed=31)  # rows of scales 16-byte aligned (TMA)
    words = weight if order == "canonical" else weight.to_frag(tiled=order == "tiled")
    rows = max(8, 1 << (m - 1).bit_length())
    old_x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
    new_x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
    x = old_x.clone()
    spin = torch.empty(8192, device="cuda")
    ref = int4_gemm_ref(new_x, weight)

    def step():
        x.copy_(old_x)
        late_copy[(triton.cdiv(x.numel(), 4096),)](new_x, x, spin, x.numel(), SPIN=20000,
                                                   BLOCK=4096)  # fmt: skip
        if pipe == "wsplit":
            return int4_wgmma_swap(x, words, rows, 64, 128, 1, 3, 4, wsplit=True, pdl=3)
        if pipe:
            return int4_wgmma_swap(x, words, rows, 128, 128, 2, 4, 4, pipe=True, pdl=3)
        return int4_wgmma_swap(x, words, rows, 64, 128, 2, 4, 4, pdl=3)

    what = f"swapped kernel, weights first, {order} words, M={m}, pipe={pipe}"
    assert_eager_and_replayed(step, ref, what)


# A second warpgroup over the later half of each program's K tiles (``wsplit``): (block_m,
# block_n, block_k, split_k, stages, warps, kwargs). With K = 1024: 8 K tiles of 128 (halves
# of 4, or of 2 and 1 per split of 3 with a short last split; two wgmmas in flight in halves
# of 4), 16 of 64 (groups of two tiles), and 1 per split of 8 (the kernel runs without it).
WSPLIT_CASES = [((64, 64, 128, 1, 3, 4), {}), ((64, 64, 128, 1, 3, 4), {"pipe": True}),
                ((32, 64, 128, 3, 3, 4), {}),
                ((64, 64, 128, 2, 3, 4), {"pdl": 3, "vector_store": True}),
                ((16, 64, 64, 1, 4, 4), {}),
                ((64, 128, 128, 1, 3, 4), {"pipe": True, "pdl": 3}),
                ((16, 64, 128, 8, 3, 4), {})]  # fmt: skip


@pytest.mark.parametrize("order", ["canonical", "frag", "tiled"])
@pytest.mark.parametrize("case", WSPLIT_CASES, ids=lambda c: "x".join(map(str, c[0])) + str(c[1]))
def test_swap_second_warpgroup_takes_the_later_k_half(case, order):
    """``wsplit``: two warpgroups on rings of their own, each over half of a program's K
    tiles, the second's sum added through shared memory after the join, against the reference
    on the canonical weight; masked N and M, split K with a short last split, groups of two K
    tiles, two wgmmas in flight, weights first, 16-byte stores. Settings it does not take are
    refused."""
    tiles, kwargs = case
    if order != "canonical" and tiles[2] != 128:
        pytest.skip("fragment order: K tiles of 128")
    weight = random_weight(1000 + 40, 1024, 128, seed=41)
    words = weight if order == "canonical" else weight.to_frag(tiled=order == "tiled")
    for m in (1, 16, 37, 64):
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        out = int4_wgmma_swap(x, words, *tiles, wsplit=True, **kwargs)
        assert_close(out, int4_gemm_ref(x, weight), torch.bfloat16, f"wsplit {case} M={m}")
    for bad in ({"specialized": True}, {"maxnreg": 168}, {"parts": 1}):
        with pytest.raises(ValueError, match="wsplit needs"):
            int4_wgmma_swap(x, words, 64, 64, 128, 1, 3, 4, wsplit=True, **bad)


# (block_m, block_n, block_k, split_k, stages, warps, kwargs) as the table runs them: small
# M (split-K slots, weights first), wide, two wgmmas in flight, warp-specialized 256-row tiles.
VECTOR_STORE_CASES = [((16, 64, 128, 3, 4, 4), {}), ((64, 64, 128, 2, 6, 4), {"pdl": 3}),
                      ((32, 128, 128, 1, 4, 4), {"pdl": 3}),
                      ((128, 64, 128, 1, 3, 4), {"pipe": True}),
                      ((256, 128, 128, 1, 3, 8), {"specialized": True, "pipe": True})]  # fmt: skip


@pytest.mark.parametrize("order", ["canonical", "frag", "tiled"])
@pytest.mark.parametrize(
    "case", VECTOR_STORE_CASES, ids=lambda c: "x".join(map(str, c[0])) + str(c[1])
)
def test_swap_vector_store_agrees_with_the_mma_layout_store(case, order):
    """``vector_store``: the accumulator through shared memory, each thread storing 8
    consecutive outputs (and 8 floats of a split-K slot) at once. The same values land in
    the same places and the slots are added in the same order, so the output equals the
    plain epilogue's bitwise and agrees with the reference: masked N (1040 = 8 x 130) and M,
    a short last split, fp16 and per-channel scales. With fp32 atomics it is refused."""
    tiles, kwargs = case
    for group, dtype in ((128, torch.bfloat16), (1024, torch.float16)):
        weight = random_weight(1040, 1024, group, seed=43)
        words = weight if order == "canonical" else weight.to_frag(tiled=order == "tiled")
        for m in (1, 37, tiles[0]):
            x = torch.randn(m, 1024, device="cuda", dtype=dtype)
            plain = int4_wgmma_swap(x, words, *tiles, **kwargs)
            vector = int4_wgmma_swap(x, words, *tiles, vector_store=True, **kwargs)
            what = f"{order} {tiles} {kwargs} M={m} g={group}"
            assert_close(vector, int4_gemm_ref(x, weight), dtype, what)
            assert torch.equal(vector, plain), f"{what}: the two epilogues differ"
    with pytest.raises(ValueError, match="vector_store needs slots=True"):
        int4_wgmma_swap(x, words, 16, 64, 128, 2, 4, 4, vector_store=True, slots=False)


# Split-K with the ticket before the slot store (``early_ticket``): (block_m, block_n, block_k,
# split_k, stages, warps, kwargs) as the table runs split-K (o_proj and down_proj at M = 16-128:
# 2 splits, weights first), a short last split (3 of K = 1024's 8 tiles), 8 splits of one
# tile, 16-byte stores, the warp-specialized form with two wgmmas in flight.
EARLY_TICKET_CASES = [((64, 64, 128, 2, 6, 4), {"pdl": 3}), ((16, 64, 128, 3, 4, 4), {}),
                      ((16, 64, 128, 8, 3, 4), {}),
                      ((64, 64, 128, 2, 4, 4), {"vector_store": True}),
                      ((128, 64, 128, 2, 4, 4), {"specialized": True, "pipe": True})]  # fmt: skip


@pytest.mark.parametrize("order", ["canonical", "frag"])
@pytest.mark.parametrize(
    "case", EARLY_TICKET_CASES, ids=lambda c: "x".join(map(str, c[0])) + str(c[1])
)
def test_swap_early_ticket_adds_the_same_slots(case, order):
    """``early_ticket``: the splits that are not last store their slot after the ticket and
    count themselves done; the last waits for them and adds their slots and its own partial
    from registers in split order. Bitwise the output of the ticket after the store (the same
    sums in the same order) and close to the reference: masked N and M, fp16 and per-channel
    scales; a grid of many waves (28672 rows: not every program resident at once, so a wait
    on a split that has not started would hang); then a CUDA graph of four calls
    replayed back to back (a lock left not at 0 by one call would spoil the next). With fp32
    atomics (no slots) it is refused."""
    tiles, kwargs = case
    if order == "frag" and tiles[2] != 128:
        pytest.skip("fragment order: K tiles of 128")
    for rows, group, dtype in ((1040, 128, torch.bfloat16), (1040, 1024, torch.float16),
                               (28672, 128, torch.bfloat16)):  # fmt: skip
        weight = random_weight(rows, 1024, group, seed=47)
        words = weight if order == "canonical" else weight.to_frag()
        for m in (1, 37, tiles[0]):
            x = torch.randn(m, 1024, device="cuda", dtype=dtype)
            early = int4_wgmma_swap(x, words, *tiles, early_ticket=True, **kwargs)
            late = int4_wgmma_swap(x, words, *tiles, **kwargs)
            what = f"{order} {tiles} {kwargs} N={rows} M={m} g={group}"
            assert_close(early, int4_gemm_ref(x, weight), dtype, what)
            assert torch.equal(early, late), f"{what}: differs from the ticket after the store"
    x = torch.randn(37, 1024, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [int4_wgmma_swap(x, words, *tiles, early_ticket=True, **kwargs) for _ in range(4)]
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        ref = int4_wgmma_swap(x, words, *tiles, **kwargs)
        for out in outs:
            assert torch.equal(out, ref), f"early_ticket {tiles}: graph replay"
    with pytest.raises(ValueError, match="early_ticket needs slots=True"):
        int4_wgmma_swap(x, words, 16, 64, 128, 2, 4, 4, early_ticket=True, slots=False)


def test_swap_eager_launches_from_the_cache():
    """Eager calls after the first of a specialization launch the compiled kernel directly
    (``kernels.launch.FastLaunch``): one cache entry per specialization (M = 16 and 17 differ
    in Triton's divisibility specialization of M and of the output's row stride), and the
    cached launches agree with the reference and bitwise with the first call."""
    from kernels.int4_wgmma import _SWAP_LAUNCH

    weight = random_weight(1000 + 40, 1024, 128, seed=19)
    tiles = (16, 64, 128, 2, 4, 4)
    for m in (16, 17):
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        before = len(_SWAP_LAUNCH.kernels)
        first = int4_wgmma_swap(x, weight, *tiles)
        added = len(_SWAP_LAUNCH.kernels) - before
        assert added <= 1, added
        for _ in range(3):
            again = int4_wgmma_swap(x, weight, *tiles)
            assert torch.equal(again, first), f"M={m}: a cached launch differs"
        assert len(_SWAP_LAUNCH.kernels) == before + added, "a repeated call was not a hit"
        assert_close(first, int4_gemm_ref(x, weight), torch.bfloat16, f"cached launch M={m}")
    assert _SWAP_LAUNCH.fast


@pytest.mark.parametrize("frag", [True, False], ids=["frag", "canonical"])
def test_swap_parts_for_measurement(frag):
    """``parts`` (bench_int4_parts.py): 1 multiplies x by ones instead of the weight (every
    output column the sum of x's row, over all splits), 2 streams the tiles only (zeros);
    both refused with the warp-specialized form."""
    weight = random_weight(512 + 40, 1024, 128, seed=3)
    words = weight.to_frag() if frag else weight
    x = torch.randn(5, 1024, device="cuda", dtype=torch.bfloat16)
    sums = x.float().sum(1, keepdim=True).expand(5, 552)
    for split in (1, 3):
        out = int4_wgmma_swap(x, words, 8, 64, 128, split, 4, 4, parts=1)
        assert_close(out, sums.to(torch.bfloat16), torch.bfloat16, f"parts=1 split {split}")
        out = int4_wgmma_swap(x, words, 8, 64, 128, split, 4, 4, parts=2)
        assert out.abs().max().item() == 0.0, f"parts=2 split {split}: not zeros"
    with pytest.raises(ValueError, match="parts"):
        int4_wgmma_swap(x, words, 8, 64, 128, 1, 4, 4, specialized=True, parts=1)


# Ring slots released through named barriers (``thread_release``): (tiles, word order, pipe,
# K), the word order canonical (False), fragment (True) or fragment and tile ("tiled"). K
# of 256 gives fewer K tiles (2) than ring slots, K of 1024 more; split 3 leaves a short last
# split (an odd number of K tiles: the plain loop).
RELEASE_CASES = [((256, 128, 128, 1, 3, 8), "tiled", True, 1024),
                 ((256, 64, 128, 1, 3, 4), True, True, 1024),
                 ((256, 128, 128, 1, 3, 8), False, True, 256),
                 ((128, 64, 64, 3, 4, 4), False, False, 1024),
                 ((64, 128, 128, 1, 6, 8), True, False, 1024)]  # fmt: skip


@pytest.mark.parametrize("case", RELEASE_CASES, ids=lambda c: "x".join(map(str, c[0])) + str(c[1:]))
def test_swap_thread_release(case):
    """``thread_release``: each decoding warp arrives on the slot's named barrier once past its
    own wait and the producer warp syncs on it before the refill (and once more for each
    released slot it never refills, so every barrier ends complete). Bitwise the same output
    as the empty-barrier form (the same products in the same order), over rings longer and
    shorter than K, two wgmmas in flight or one, split K, both word orders; then in a CUDA
    graph replayed back to back (a barrier left incomplete by one launch would hang or
    corrupt the next)."""
    tiles, frag, pipe, k = case
    weight = random_weight(1000 + 40, k, 128, seed=29)
    words = weight.to_frag(tiled=frag == "tiled") if frag else weight
    for m in (1, 37, 130, 256):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = int4_wgmma_swap(x, words, *tiles, specialized=True, pipe=pipe, thread_release=True)
        assert_close(out, int4_gemm_ref(x, weight), torch.bfloat16, f"release {tiles} M={m}")
        ref = int4_wgmma_swap(x, words, *tiles, specialized=True, pipe=pipe)
        assert torch.equal(out, ref), f"release {tiles} M={m}: differs from the empty barriers"
    x = torch.randn(130, k, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [
            int4_wgmma_swap(x, words, *tiles, specialized=True, pipe=pipe, thread_release=True)
            for _ in range(4)
        ]
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        ref = int4_wgmma_swap(x, words, *tiles, specialized=True, pipe=pipe)
        for out in outs:
            assert torch.equal(out, ref), f"release {tiles}: graph replay"
    with pytest.raises(ValueError, match="thread_release needs specialized=True"):
        int4_wgmma_swap(x, words, *tiles, thread_release=True)
