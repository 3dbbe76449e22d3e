"""int4_gemm (Triton; interpreter on CPU) against int4_gemm_ref on random packed weights."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernels' import (jit decoration)

from kernels.int4_gemm import (  # noqa: E402
    Int4GemmConfig,
    Int4Weight,
    dequantize_int4,
    device_form,
    int4_gemm,
    int4_gemm_ref,
)
from kernels.int4_gemm_config import (  # noqa: E402
    _LARGE_PLAIN,
    _LARGE_PLAIN_FRAG,
    _LARGE_WIDE,
    _NARROW_2X64,
    _NARROW_256,
    choose_config,
    pad_rows,
    split_rows,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Relative Frobenius error allowed per activation dtype (fp32 accumulate in both).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def random_weight(n: int, k: int, group_size: int, seed: int, perm: bool = False) -> Int4Weight:
    """Random codes packed by hand here (low nibble first along K), random scales/offsets."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int64)
    qweight = torch.zeros(n, k // 8, dtype=torch.int64)
    for j in range(8):
        qweight |= codes[:, j::8] << (4 * j)
    qweight = torch.where(qweight >= 2**31, qweight - 2**32, qweight).to(torch.int32)
    num_groups = k // group_size
    scales = (torch.rand(num_groups, n, generator=gen) * 0.02 + 0.005).half()
    offsets = (torch.randn(num_groups, n, generator=gen) * 0.1).half()
    in_perm = torch.randperm(k, generator=gen) if perm else None
    return Int4Weight(qweight, scales, offsets, group_size, in_perm).to(DEVICE)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype, what
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    err = (out.float() - ref.float()).norm() / ref.float().norm()
    if err > TOLERANCE[dtype]:
        idx = (out.float() - ref.float()).abs().argmax()
        row, col = divmod(int(idx), out.shape[-1])
        raise AssertionError(
            f"{what}: relative error {err:.2e} > {TOLERANCE[dtype]:.0e}; "
            f"worst at [{row}, {col}]: {out.flatten()[idx]} vs "
            f"{ref.flatten()[idx]}"
        )


# (N, K, group_size): odd N, K a multiple of the group; group_size == K is per-channel.
SHAPES = [(37, 96, 32), (45, 192, 64), (29, 384, 128), (23, 200, 200)]
CONFIGS = [
    ("auto", None),
    ("gemv", Int4GemmConfig("gemv", block_n=16, block_k=64, split_k=1)),
    ("gemv-split", Int4GemmConfig("gemv", block_n=32, block_k=32, split_k=3)),
    ("tiled", Int4GemmConfig("tiled", block_m=16, block_n=32, block_k=64, split_k=1)),
    ("tiled-split", Int4GemmConfig("tiled", block_m=32, block_n=16, block_k=32, split_k=2)),
    ("dequant", Int4GemmConfig("dequant")),
    ("gemv-nibble", Int4GemmConfig("gemv", block_n=16, block_k=64, split_k=2, nibble=True)),
    ("tiled-nibble", Int4GemmConfig("tiled", 16, 16, 128, split_k=2, nibble=True)),
    ("tiled-nibble-1", Int4GemmConfig("tiled", 32, 32, 128, split_k=1, nibble=True)),
    ("gemv-wide", Int4GemmConfig("gemv", block_n=16, block_k=256, split_k=2, num_stages=2)),
    ("mm", Int4GemmConfig("mm", block_m=32, block_n=16, block_k=64)),
    ("gemv-tall", Int4GemmConfig("gemv", block_n=4, block_k=1024, num_warps=4, num_stages=1)),
    ("mm-split", Int4GemmConfig("mm", block_m=16, block_n=32, block_k=32, split_k=3)),
    ("mm-magic", Int4GemmConfig("mm", 32, 16, 64, magic=True)),
    ("mm-magic-pipe", Int4GemmConfig("mm", 16, 16, 128, split_k=2, magic=True, pipelined=True)),
    (
        "mm-swap",
        Int4GemmConfig("mm", 16, 32, 32, split_k=3, magic=True, swap=True, pipelined=True),
    ),
    ("gemv-fold", Int4GemmConfig("gemv", block_n=16, block_k=64, split_k=2, fold=True)),
    (
        "gemv-fold-prefetch",
        Int4GemmConfig("gemv", 16, 32, 64, split_k=1, fold=True, prefetch=True, pdl=True),
    ),
    ("gemv-prefetch-split", Int4GemmConfig("gemv", 16, 16, 32, split_k=2, prefetch=True)),
    ("wgmma-fallback", Int4GemmConfig("wgmma", 256, 128, 64, 1, 8, 4)),
    ("wgmma-swap-fallback", Int4GemmConfig("wgmma", 8, 128, 128, 2, 4, 4, swap=True)),
]


# Rows per config: the interpreter runs one program at a time, so the large M goes to the
# strategies the table picks for it (tiled, dequant) and once through each split path.
ROWS = {
    "auto": [1, 16, 300],
    "gemv": [1, 3],
    "gemv-split": [1, 2],
    "tiled": [1, 37],
    "tiled-split": [16, 300],
    "dequant": [5, 300],
    "gemv-nibble": [1, 2],
    "tiled-nibble": [1, 19],
    "tiled-nibble-1": [3],
    "gemv-wide": [1, 2],
    "mm": [1, 37],
    "gemv-tall": [1, 3],
    "mm-split": [2, 17],
    "mm-magic": [1, 37],
    "mm-magic-pipe": [3],
    "mm-swap": [1, 17],
    "gemv-fold": [1, 2],
    "gemv-fold-prefetch": [1, 3],
    "gemv-prefetch-split": [1],
    "wgmma-fallback": [3],
    "wgmma-swap-fallback": [2],
}


@pytest.mark.parametrize("n,k,group_size", SHAPES)
@pytest.mark.parametrize("name,config", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_matches_reference(n, k, group_size, name, config):
    weight = random_weight(n, k, group_size, seed=n * k)
    for i, dtype in enumerate(DTYPES):
        for m in ROWS[name]:
            if m >= 100 and i > 0 and name != "auto":
                continue  # large M once per shape and config (fp32), in fp16 through "auto"
            x = torch.randn(m, k, device=DEVICE).to(dtype)
            out = int4_gemm(x, weight, config=config)
            ref = int4_gemm_ref(x, weight)
            assert_close(out, ref, dtype, f"{name} M={m} N={n} K={k} g={group_size} {dtype}")


def test_act_order_bias_batch_dims_and_strided_rows():
    weight = random_weight(41, 256, 64, seed=7, perm=True)
    bias = torch.randn(41, device=DEVICE)
    big = torch.randn(2, 5, 300, device=DEVICE)
    x = big[..., :256]  # rows strided by 300, last dim contiguous
    out = int4_gemm(x, weight, bias)
    ref = int4_gemm_ref(x, weight, bias)
    assert out.shape == (2, 5, 41)
    assert_close(out, ref, torch.float32, "act-order + bias + 3-D")
    # The reference itself: dequantize_int4 undoes the permutation.
    dense = dequantize_int4(weight)
    torch.testing.assert_close(ref, x @ dense.t() + bias, rtol=1e-5, atol=1e-4)


def test_cat_and_narrow():
    a, b = random_weight(24, 128, 32, seed=1), random_weight(40, 128, 32, seed=2)
    fused = Int4Weight.cat_n([a, b])
    dense = torch.cat([dequantize_int4(a), dequantize_int4(b)])
    torch.testing.assert_close(dequantize_int4(fused), dense)
    torch.testing.assert_close(dequantize_int4(fused.narrow_n(24, 40)), dense[24:])
    torch.testing.assert_close(dequantize_int4(fused.narrow_k(32, 64)), dense[:, 32:96])
    x = torch.randn(5, 128, device=DEVICE)
    assert_close(int4_gemm(x, fused), x @ dense.t(), torch.float32, "fused")


def test_split_k_reductions_keep_their_workspaces_apart():
    """The gemv's split-K adds into the self-cleaning workspace (MODE 2), the tiled kernels
    store partials in slots of their own workspace (MODE 3) and leave values there: calls
    of the two in turn, on fresh inputs, must each match the reference, and the self-cleaning
    workspace must be all zeros again afterwards."""
    from kernels import split_k

    weight = random_weight(45, 384, 64, seed=21)
    gemv = Int4GemmConfig("gemv", block_n=16, block_k=64, split_k=3)
    tiled = Int4GemmConfig("tiled", block_m=16, block_n=16, block_k=64, split_k=3)
    mm = Int4GemmConfig("mm", block_m=16, block_n=32, block_k=32, split_k=4)
    for step, (m, config) in enumerate([(2, gemv), (19, tiled), (1, gemv), (5, mm), (3, gemv)]):
        x = torch.randn(m, 384, device=DEVICE)
        out = int4_gemm(x, weight, config=config)
        assert_close(out, int4_gemm_ref(x, weight), torch.float32, f"step {step}: {config}")
    atomic_ws, atomic_locks = split_k._WORKSPACES[torch.device(DEVICE), False]
    assert not atomic_ws.any() and not atomic_locks.any(), "MODE 2 workspace left dirty"
    slot_ws, slot_locks = split_k._WORKSPACES[torch.device(DEVICE), True]
    assert slot_ws.any() and not slot_locks.any(), "MODE 3: partials stay, tickets reset"


def test_split_k_workspace_growth_keeps_the_old_one_allocated():
    """A CUDA graph captured before the workspace grew keeps writing into the old one, so
    growing must not free it (the caching allocator would hand its memory to other tensors;
    ``test_int4_wgmma.py::test_graph_replay_after_the_split_k_workspace_grew`` replays such a
    graph on the GPU). It grows at least twofold, so the kept ones add up to less than it."""
    import gc
    import weakref

    from kernels import split_k

    device = torch.device(DEVICE)
    saved = dict(split_k._WORKSPACES)
    split_k._WORKSPACES.clear()
    try:
        sizes, old = [], []
        for need in (1000, 70_000, 70_001, 150_000, 150_000):
            ws, locks = split_k.workspace(device, need, 8, slots=True)
            assert ws.numel() >= need and not locks.any()
            if not sizes or ws.numel() != sizes[-1]:
                sizes.append(ws.numel())
                old.append((weakref.ref(ws), weakref.ref(locks), ws.data_ptr()))
            del ws, locks
        gc.collect()
        assert sizes == [1 << 16, 1 << 17, 1 << 18], sizes  # twofold: 70 000 and 150 000 fit
        for ws_ref, locks_ref, ptr in old:
            assert ws_ref() is not None and locks_ref() is not None, "a workspace was freed"
            assert ws_ref().data_ptr() == ptr
    finally:
        split_k._WORKSPACES.clear()
        split_k._WORKSPACES.update(saved)


def test_bad_input_raises():
    w = random_weight(16, 64, 32, seed=3)
    with pytest.raises(ValueError, match="input features"):
        int4_gemm(torch.randn(2, 32, device=DEVICE), w)
    with pytest.raises(ValueError, match="fp16, bf16 or fp32"):
        int4_gemm(torch.ones(2, 64, dtype=torch.int32, device=DEVICE), w)
    with pytest.raises(ValueError, match="group_size"):
        Int4Weight(w.qweight, w.scales, w.offsets, 48)
    with pytest.raises(ValueError, match="multiples of group_size"):
        w.narrow_k(16, 32)
    with pytest.raises(ValueError, match="strategy"):
        Int4GemmConfig("cutlass")
    with pytest.raises(ValueError, match="specialized applies"):
        Int4GemmConfig("mm", specialized=True)
    with pytest.raises(ValueError, match="pipe applies"):
        Int4GemmConfig("mm", pipe=True)
    with pytest.raises(ValueError, match="num_stages >= 3"):
        Int4GemmConfig("wgmma", swap=True, num_stages=2, pipe=True)
    ws = {"strategy": "wgmma", "swap": True, "specialized": True}
    for bad in ({**ws, "specialized": False}, {**ws, "num_stages": 8}):  # a named barrier a slot
        with pytest.raises(ValueError, match="thread_release applies"):
            Int4GemmConfig(**bad, thread_release=True)
    Int4GemmConfig(**ws, num_stages=6, thread_release=True)
    with pytest.raises(ValueError, match="early_ticket applies to the wgmma strategy"):
        Int4GemmConfig("mma", 16, 16, 128, 2, 8, 1, early_ticket=True)
    for bad in ({"strategy": "gemv"}, {"strategy": "mm", "pdl": True}):
        with pytest.raises(ValueError, match="l2_prefetch applies to the gemv strategy"):
            Int4GemmConfig(**bad, l2_prefetch=True)
    with pytest.raises(ValueError, match="equal K"):
        Int4Weight.cat_n([w, random_weight(16, 128, 32, seed=4)])


@pytest.mark.gpu
@pytest.mark.parametrize("m, n", [(1, 4152), (16, 4152), (64, 4152), (300, 4152), (64, 8248),
                                  (200, 8248), (1, 16440), (5, 16440), (48, 16440),
                                  (100, 16440)])  # fmt: skip
def test_cuda_graph_replay_bf16(m, n):
    """The table's launch for each M bucket and weight width inside a CUDA graph (split-K
    workspace included), replayed on fresh inputs."""
    weight = random_weight(n, 1024, 128, seed=m)
    x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
    assert_graph_replays(x, weight, weight, f"graph M={m}")


def assert_graph_replays(x: torch.Tensor, weight: Int4Weight, ref: Int4Weight, what: str):
    """int4_gemm(x, weight) with the table's config, captured in a CUDA graph (after a call
    outside it that compiles and sizes the workspace) and replayed on fresh x, against the
    reference on ``ref`` (the same weight, possibly in the other word order)."""
    int4_gemm(x, weight)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        int4_gemm(x, weight)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = int4_gemm(x, weight)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert_close(out, int4_gemm_ref(x, ref), torch.bfloat16, what)


# Every strategy at a model-like shape in bf16 (the interpreter has no bf16): odd N, several
# splits, groups of 128 and 32.
GPU_CONFIGS = [
    Int4GemmConfig("gemv", block_n=32, block_k=512, split_k=4, num_warps=4, num_stages=2),
    Int4GemmConfig("gemv", block_n=4, block_k=2048, split_k=1, num_warps=8, num_stages=1),
    Int4GemmConfig("gemv", 16, 32, 256, 4, 1, 1, fold=True, prefetch=True, pdl=True),
    Int4GemmConfig("gemv", 16, 64, 256, 3, 2, 2, fold=True, pdl=True),
    Int4GemmConfig("gemv", 16, 32, 256, 4, 1, 2, fold=True, pdl=True, asm=True),
    Int4GemmConfig("gemv", 16, 16, 128, 3, 1, 2, fold=True, asm=True),
    Int4GemmConfig("tiled", 16, 128, 128, split_k=8, nibble=True),
    Int4GemmConfig("tiled", 16, 256, 128, split_k=4, nibble=True),
    Int4GemmConfig("tiled", 64, 64, 128, split_k=2, nibble=False),
    Int4GemmConfig("mm", 128, 128, 64, num_warps=8, num_stages=3),
    Int4GemmConfig("mm", 16, 128, 128, split_k=4, num_warps=4, num_stages=3),
    Int4GemmConfig("mm", 128, 128, 64, num_warps=8, num_stages=3, magic=True, pipelined=True),
    Int4GemmConfig("mm", 16, 64, 128, split_k=4, magic=True),
    Int4GemmConfig("mm", 16, 64, 128, split_k=4, magic=True, swap=True, pipelined=True),
    Int4GemmConfig("mm", 16, 64, 128, split_k=4, swap=True, pipelined=True, asm=True),
    Int4GemmConfig("mm", 64, 32, 128, split_k=2, pipelined=True, asm=True),
    Int4GemmConfig("mm", 128, 128, 64, num_warps=8, num_stages=3, pipelined=True, asm=True),
    Int4GemmConfig("mm", 16, 64, 128, split_k=4, swap=True, pipelined=True, asm=True, tma=True),
    Int4GemmConfig("mm", 64, 64, 128, split_k=1, swap=True, pipelined=True, asm=True, tma=True),
    # weights in K order through shared memory, x from the TMA buffer (large M)
    Int4GemmConfig("mm", 128, 128, 128, 1, 8, 3, pipelined=True, asm=True, tma=True),
    Int4GemmConfig("mm", 128, 128, 64, 1, 8, 4, pipelined=True, asm=True, tma=True),
    Int4GemmConfig("mm", 64, 64, 64, 2, 4, 4, pipelined=True, asm=True, tma=True),
    Int4GemmConfig("wgmma", 256, 128, 64, 1, 8, 4),  # group 32: the fallback
    # odd N (scale rows TMA cannot address) or group 32: the swapped TMA mm fallback
    Int4GemmConfig("wgmma", 16, 64, 128, 4, 4, 4, swap=True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("group_size", [128, 32, 2048])
@pytest.mark.parametrize(
    "config",
    GPU_CONFIGS,
    ids=lambda c: (
        f"{c.strategy}{c.block_m}x{c.block_n}"
        + "".join(
            f"-{f}"
            for f in ("magic", "swap", "pipelined", "asm", "tma", "fold", "prefetch", "pdl")
            if getattr(c, f)
        )
    ),
)
def test_strategies_bf16(config, group_size):
    weight = random_weight(1000 + 37, 2048, group_size, seed=group_size)
    for m in (1, 5, 16, 64, 200):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        out = int4_gemm(x, weight, config=config)
        assert_close(out, int4_gemm_ref(x, weight), torch.bfloat16, f"{config} M={m}")


L2_GEMV = Int4GemmConfig("gemv", 16, 32, 256, 4, 1, 2, fold=True, asm=True, pdl=True,
                         l2_prefetch=True)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("group_size", [128, 32, 2048])
@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("n", [1088, 1037])  # 1037: rows the bulk prefetch cannot address
def test_gemv_l2_prefetch(group_size, scale_dtype, n):
    """The gemv prefetching its words, scales and offsets into L2 before it waits (with
    split-K, one output row and several), against the reference; where the rows are not
    16-byte aligned it runs without the prefetch."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch is sm_90+")
    from kernels.int4_gemm import _bulk_prefetch_ok

    w = random_weight(n, 2048, group_size, seed=n + group_size)
    w = Int4Weight(w.qweight, w.scales.to(scale_dtype), w.offsets.to(scale_dtype), group_size)
    assert _bulk_prefetch_ok(w, L2_GEMV.block_n, min(group_size, 128)) == (n % 8 == 0)
    for m in (1, 3):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        out = int4_gemm(x, w, config=L2_GEMV)
        assert_close(out, int4_gemm_ref(x, w), torch.bfloat16, f"l2 prefetch M={m} N={n}")


def late_copy_kernel():
    """A Triton kernel ``late_copy(src, dst, spin_out, n, SPIN, BLOCK)`` that lets its
    programmatic dependents start at once, spins, and only then copies ``src`` over ``dst``:
    a dependent that read ``dst`` before waiting would see the old values."""
    import triton
    import triton.language as tl

    @triton.jit
    def late_copy(src, dst, spin_out, n, SPIN: tl.constexpr, BLOCK: tl.constexpr):
        tl.extra.cuda.gdc_launch_dependents()
        acc = tl.program_id(0).to(tl.float32)
        for _ in range(SPIN):
            acc = acc * 0.999 + 1.0
        tl.store(spin_out + tl.program_id(0), acc)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

    return late_copy


def assert_sees_a_late_write(gemm, old: Int4Weight, new: Int4Weight, what: str) -> None:
    """``gemm(x, weight)`` launched as the programmatic dependent of a kernel that lets its
    dependents start at once and writes ``new``'s words over ``old``'s only after a long
    spin: a kernel that prefetches the weight before it waits must still compute with the new
    words (eagerly and replayed from a CUDA graph)."""
    import triton

    late_copy = late_copy_kernel()
    target = dataclasses.replace(old, qweight=old.qweight.clone())
    expected = dataclasses.replace(old, qweight=new.qweight)
    spin = torch.empty(8192, device="cuda")
    x = torch.randn(1, old.in_features, device="cuda", dtype=torch.bfloat16)

    def step():
        target.qweight.copy_(old.qweight)
        numel = target.qweight.numel()
        late_copy[(triton.cdiv(numel, 4096),)](
            new.qweight, target.qweight, spin, numel, SPIN=20000, BLOCK=4096
        )
        return gemm(x, target)

    ref = int4_gemm_ref(x, expected)
    assert not torch.allclose(ref, int4_gemm_ref(x, old)), "old and new words must differ"
    assert_eager_and_replayed(step, ref, what)


def assert_eager_and_replayed(step, ref: torch.Tensor, what: str) -> None:
    """``step()`` (which returns a bf16 output) agrees with ``ref`` when run eagerly and when
    replayed from a CUDA graph that captured it (warmed up on a side stream first; the
    output is zeroed before each replay, so a replay that wrote nothing would fail)."""
    assert_close(step(), ref, torch.bfloat16, f"{what}, eager")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(3):
        out.zero_()
        graph.replay()
        assert_close(out, ref, torch.bfloat16, f"{what}, graph replay")


@pytest.mark.gpu
def test_gemv_l2_prefetch_sees_a_write_that_lands_after_it():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch is sm_90+")
    old = random_weight(4096, 4096, 128, seed=11)
    new = random_weight(4096, 4096, 128, seed=12)
    assert_sees_a_late_write(
        lambda x, w: int4_gemm(x, w, config=L2_GEMV), old, new, "gemv + L2 prefetch"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("swap, tma", [(False, False), (True, False), (True, True), (False, True)])
def test_asm_dequant_fp16(swap, tma):
    # The inline-PTX dequantization has its own fp16 code (f16x2, bias 1024); bf16 above.
    weight = random_weight(512 + 16, 1024, 128, seed=3)
    config = Int4GemmConfig(
        "mm", 16, 64, 128, split_k=2, swap=swap, pipelined=True, asm=True, tma=tma
    )
    for m in (1, 16, 40):
        x = torch.randn(m, 1024, device="cuda", dtype=torch.float16)
        out = int4_gemm(x, weight, config=config)
        assert_close(out, int4_gemm_ref(x, weight), torch.float16, f"{config} M={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 16, 48, 100, 200, 300])
@pytest.mark.parametrize("n, k", [(16440, 512), (1032, 8192), (4232, 1024)])
def test_fragment_order_table_graph_replay_bf16(m, n, k):
    """A wide, a long-K and a qkv-like weight in fragment order through their table (the
    register mma kernel at small M on the narrow ones, the swapped wgmma kernel up to M = 256,
    with registers capped at M = 33-64 on the narrow ones and a second warpgroup on long K
    from M = 9, then dequantize + cuBLAS or the large tilings) in a CUDA graph."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("fragment order is for sm_90+")
    cfg = choose_config(m, n, k, 128, torch.device("cuda"), frag=True)
    assert (cfg.maxnreg == 200) == (m == 48 and n <= 8192 and k < 8192), cfg
    # the long-K weight's second warpgroup (the mma kernel's wsplit is its warps over K)
    assert (cfg.swap and cfg.wsplit) == (m in (16, 48) and k == 8192), cfg
    assert (cfg == _NARROW_256) == (m == 200 and n == 4232), cfg  # 134 tiles of 128 x-rows
    canon = random_weight(n, k, 128, seed=m)
    canon = Int4Weight(canon.qweight, canon.scales.bfloat16(), canon.offsets.bfloat16(), 128)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    assert_graph_replays(x, canon.to_frag(), canon, f"frag table M={m} N={n} K={k}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 8, 16, 32, 64, 96, 200, 300])
@pytest.mark.parametrize("n, k", [(16400, 512), (1040, 8192), (4240, 1024), (2048, 1024)])
def test_engine_word_order_table_graph_replay_bf16(m, n, k):
    """Weights as the engine holds them on Hopper (``device_form``: fragment and tile order),
    wide, long-K, qkv-like and o_proj-like, through their table (the register mma kernel with
    its scales a tile ahead and words through the shared ring at small M, the swapped wgmma
    kernel, then dequantize + cuBLAS or the large tilings) in a CUDA graph."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("fragment order is for sm_90+")
    canon = random_weight(n, k, 128, seed=m + n)
    canon = Int4Weight(canon.qweight, canon.scales.bfloat16(), canon.offsets.bfloat16(), 128)
    weight = device_form(canon)
    assert weight.frag and weight.tiled
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    assert_graph_replays(x, weight, canon, f"engine order M={m} N={n} K={k}")


def test_pad_rows_rule():
    """``pad_rows``: whole x tiles for the swapped kernel where the last tile reaches at least
    48 rows past M (24 without warp specialization, 96 with 128 weight rows; 32 for the single
    128-row tile with two wgmmas in flight where each program runs >= 32 K tiles, and for the
    two 64-row tiles of ``_NARROW_2X64``, padded to 128 rows), as measured on the H200 and an
    H100; nothing for the other kernels or a short overhang."""
    cpu = torch.device("cpu")
    for m, n, k, want in [
        (72, 6144, 4096, 56),  # 128 x 64, warp-specialized: 56 rows past M
        (88, 6144, 4096, 40),  # one tile, two wgmmas in flight, 32 K tiles: from 32 past
        (96, 6144, 4096, 32),
        (104, 6144, 4096, 0),  # 24 past: the fill cost less than the copy
        (96, 4096, 14336, 32),  # split 2 over 112 K tiles: 56 a program
        (65, 4096, 4096, 63),  # _NARROW_2X64: two 64-row tiles, x padded to 128 rows
        (72, 4096, 4096, 56),
        (96, 4096, 4096, 32),
        (100, 4096, 4096, 0),  # 28 past the second tile
        (120, 4096, 4096, 0),
        (88, 4096, 14336, 40),  # long K keeps the 128-row tile
        (96, 6144, 4096 * 2 - 128, 32),
        (136, 6144, 4096, 120),  # _NARROW_256
        (224, 6144, 4096, 0),
        (96, 28672, 4096, 32),  # 128 x 64 not warp-specialized: 24 suffice
        (120, 28672, 4096, 0),
        (160, 28672, 4096, 96),  # 256 x 128: 96 past M
        (192, 28672, 4096, 0),
        (1000, 4096, 4096, 0),  # 24 past a 256-row tile
        (16, 6144, 4096, 0),  # the mma kernel
        (40, 6144, 4096, 0),  # 64-row tiles: no slowdown measured
    ]:
        cfg = choose_config(m, n, k, 128, cpu, frag=True)
        assert pad_rows(m, cfg, k) == want, (m, n, k, cfg)
    assert pad_rows(300, Int4GemmConfig("dequant"), 4096) == 0
    # the same tile over 31 K tiles a program: from 48 past
    cfg = choose_config(88, 6144, 4096, 128, cpu, frag=True)
    assert pad_rows(88, cfg, 31 * 128) == 0 and pad_rows(72, cfg, 31 * 128) == 56
    # canonical words keep one wgmma at a time there: from 48 past
    assert pad_rows(96, choose_config(96, 6144, 4096, 128, cpu, frag=False), 4096) == 0


def test_narrow_swap_issues_the_weight_first_at_m_17_to_64():
    """The table's swapped kernel on weights with K < 8192 at M = 17-64 (qkv, o_proj past the
    mma kernel) is a programmatic dependent that copies the weight's first tiles before it
    waits (``weights_first``), with 6 ring stages where its programs fit one wave (x tiles of
    32 rows, or at most one program per multiprocessor) and 4 where they would not (and in
    each of the two rings of ``wsplit``); M > 64 and wide weights keep their forms."""
    cpu = torch.device("cpu")
    for m, n, k, stages in [(17, 6144, 4096, 4), (32, 6144, 4096, 4), (40, 6144, 4096, 6),
                            (48, 6144, 4096, 4), (64, 4096, 4096, 6), (64, 2048, 2048, 6),
                            (40, 5120, 4096, 4), (32, 5120, 4096, 6)]:  # fmt: skip
        cfg = choose_config(m, n, k, 128, cpu, frag=True)
        assert cfg.swap and cfg.weights_first and cfg.pdl and not cfg.specialized, (m, n, k, cfg)
        assert cfg.num_stages == stages, (m, n, k, cfg)
    for m, n, k in [(65, 6144, 4096), (48, 28672, 4096)]:
        cfg = choose_config(m, n, k, 128, cpu, frag=True)
        assert cfg.num_stages <= 4 and (cfg.weights_first == (n > 8192)), (m, n, k, cfg)


def test_narrow_swap_runs_a_second_warpgroup_where_one_split_fills_the_grid_or_k_is_long():
    """At M = 17-64 the swapped kernel on narrow weights adds a second warpgroup over the later
    half of each program's K tiles (``wsplit``) where one split already makes >= 96 programs
    (qkv-sized weights, but not at M = 33-47, where it was slower) and where K is long
    (down_proj from M = 9, with 2 splits instead of 4, ahead of the mma kernel at M = 9-16);
    two wgmmas in flight in each half above M = 32; no register cap. o_proj-sized weights,
    wide ones, M <= 8, short K at M <= 16 and M > 64 keep their forms. Both word orders take
    the same rule."""
    cpu = torch.device("cpu")
    for frag in (True, False):
        for m, n, k, split, pipe in [
            (17, 6144, 4096, 1, False), (32, 6144, 4096, 1, False), (48, 6144, 4096, 1, True),
            (64, 6144, 4096, 1, True), (17, 4096, 14336, 2, False), (32, 4096, 14336, 2, False),
            (33, 4096, 14336, 2, True), (64, 4096, 14336, 2, True), (9, 4096, 14336, 2, False),
            (16, 4096, 14336, 2, False),
        ]:  # fmt: skip
            cfg = choose_config(m, n, k, 128, cpu, frag=frag)
            got = (cfg.strategy, cfg.swap, cfg.wsplit, cfg.split_k, cfg.pipe, cfg.maxnreg)
            assert got == ("wgmma", True, True, split, pipe, None), (m, n, k, frag, cfg)
            assert cfg.weights_first and cfg.pdl and cfg.num_warps == 4, (m, n, k, frag, cfg)
        for m, n, k in [(16, 6144, 4096), (33, 6144, 4096), (47, 6144, 4096), (64, 4096, 4096),
                        (64, 5120, 4096), (32, 28672, 4096), (65, 4096, 14336),
                        (65, 6144, 4096), (8, 4096, 14336)]:  # fmt: skip
            cfg = choose_config(m, n, k, 128, cpu, frag=frag)
            assert not (cfg.swap and cfg.wsplit), (m, n, k, frag, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [72, 80, 88, 96, 104])
def test_engine_word_order_qkv_sized_at_m_72_to_104_graph_replay_bf16(m):
    """The qkv projection's weight (4096 x 6144) as the engine holds it on Hopper at M =
    72-104: the warp-specialized 128 x 64 tiling with two wgmmas in flight, x padded to the
    whole tile where >= 32 rows are past M (M <= 96) and read past M by TMA's zero fill
    elsewhere, in a CUDA graph."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("fragment order is for sm_90+")
    cfg = choose_config(m, 6144, 4096, 128, torch.device("cuda"), frag=True)
    assert cfg.specialized and cfg.pipe and cfg.block_m == 128, cfg
    assert (pad_rows(m, cfg, 4096) > 0) == (m <= 96), (m, cfg)
    canon = random_weight(6144, 4096, 128, seed=m)
    canon = Int4Weight(canon.qweight, canon.scales.bfloat16(), canon.offsets.bfloat16(), 128)
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    assert_graph_replays(x, device_form(canon), canon, f"engine order qkv M={m}")


def test_wide_weights_at_m_33_to_64_run_one_warpgroup_with_two_wgmmas_in_flight():
    """Wide weights (N > 8192) in fragment order at M = 33-64 run the swapped kernel's 64-row x
    tiles over 128 weight rows with one warpgroup (16 words a thread per K tile) and two
    wgmmas in flight, faster than two warpgroups of 64 rows in the plain loop on the H100 of
    the twenty-eighth session; 32-row x tiles and canonical words keep the plain loop (two
    wgmmas in flight were slower at M = 32)."""
    cpu = torch.device("cpu")
    for m, n in [(33, 28672), (48, 28672), (64, 28672), (64, 16400)]:
        cfg = choose_config(m, n, 4096, 128, cpu, frag=True)
        got = (cfg.strategy, cfg.swap, cfg.block_m, cfg.block_n, cfg.num_warps, cfg.pipe)
        assert got == ("wgmma", True, 64, 128, 4, True), (m, n, cfg)
        assert cfg.weights_first and cfg.pdl and not cfg.specialized, (m, n, cfg)
    for m, frag in [(17, True), (32, True), (48, False), (64, False)]:
        cfg = choose_config(m, 28672, 4096, 128, cpu, frag=frag)
        assert cfg.swap and cfg.num_warps == 4 and not cfg.pipe, (m, frag, cfg)


def test_swapped_kernel_keeps_two_wgmmas_in_flight_at_m_65_to_128_in_fragment_order():
    """At 64 < M <= 128, fragment-ordered words keep two wgmmas in flight (``pipe``): narrow
    weights on the warp-specialized 128 x 64 tiling (one wave of programs) and wide ones on the
    plain 128 x 64 tiling (``_LARGE_PLAIN_FRAG``, as above M = 256); canonical words keep the
    one-at-a-time loop there (``_LARGE_PLAIN``), and above M = 128 both orders pipe."""
    cpu = torch.device("cpu")
    for m in (65, 72, 96, 112, 128):
        for n, k in [(6144, 4096), (4096, 4096), (4096, 14336)]:
            for frag in (True, False):
                cfg = choose_config(m, n, k, 128, cpu, frag=frag)
                if cfg == _NARROW_2X64:  # o_proj-sized (the test below)
                    continue
                got = (cfg.strategy, cfg.swap, cfg.block_m, cfg.block_n, cfg.specialized)
                assert got == ("wgmma", True, 128, 64, True), (m, n, k, frag, cfg)
                assert cfg.pipe == frag and cfg.num_stages == 4, (m, n, k, frag, cfg)
        assert choose_config(m, 28672, 4096, 128, cpu, frag=True) == _LARGE_PLAIN_FRAG, m
        assert choose_config(m, 28672, 4096, 128, cpu, frag=False) == _LARGE_PLAIN, m
    for frag in (True, False):
        cfg = choose_config(200, 4096, 4096, 128, cpu, frag=frag)
        assert cfg.specialized and cfg.block_m == 128 and cfg.pipe, (frag, cfg)


def test_o_proj_sized_weights_run_two_64_row_x_tiles_unsplit_at_m_65_to_128():
    """Narrow weights whose two 64-row x tiles make 96-132 programs (o_proj-sized), K < 8192,
    fragment-ordered, at 64 < M <= 128: 64 x 64 unsplit, warp-specialized, two wgmmas in
    flight (``_NARROW_2X64``), not 128 x 64 split 2. Long K, qkv-sized and small weights,
    canonical words and M > 128 keep 128-row tiles."""
    cpu = torch.device("cpu")
    for m in (65, 72, 88, 96, 100, 104, 112, 120, 128):
        for n, k in [(4096, 4096), (3072, 4096), (4224, 1024), (4096, 8064)]:
            assert choose_config(m, n, k, 128, cpu, frag=True) == _NARROW_2X64, (m, n, k)
    assert _NARROW_2X64.block_m == 64 and _NARROW_2X64.split_k == 1
    assert _NARROW_2X64.specialized and _NARROW_2X64.pipe and _NARROW_2X64.num_stages == 6
    for m, n, k, frag in [
        (129, 4096, 4096, True), (112, 4096, 4096, False), (72, 4096, 4096, False),
        (112, 4096, 14336, True), (72, 4096, 14336, True), (112, 6144, 4096, True),
        (72, 6144, 4096, True), (112, 4288, 4096, True), (112, 3008, 4096, True),
    ]:  # fmt: skip
        cfg = choose_config(m, n, k, 128, cpu, frag=frag)
        assert cfg.strategy != "wgmma" or cfg.block_m >= 128, (m, n, k, frag, cfg)


def test_swapped_kernel_runs_wsplit_and_pipe_only_where_the_k_tiles_allow():
    """``int4_wgmma_swap``'s loop forms (``loop_forms``): a second warpgroup over the later K
    half needs two K tiles in every split (else one warpgroup runs), and two wgmmas in flight
    an even number of tiles in each split, in each half with ``wsplit``."""
    from kernels.int4_wgmma import loop_forms

    for tiles, last, pipe, wsplit, want in [
        (8, 8, True, True, (True, True)),  # halves of 4: both
        (8, 2, True, True, (False, True)),  # a last split of 2: halves of 1, no pipe
        (6, 6, True, True, (False, True)),  # halves of 3
        (6, 6, True, False, (True, False)),  # one warpgroup: pairs of 6
        (3, 2, False, True, (False, True)),  # halves of 2 and 1 (the GPU test's split of 3)
        (1, 1, True, True, (False, False)),  # one tile a split: neither
        (4, 1, False, True, (False, False)),  # a last split of one tile
        (4, 4, False, False, (False, False)),
    ]:
        assert loop_forms(tiles, last, pipe, wsplit) == want, (tiles, last, pipe, wsplit)


def test_swapped_kernel_stores_16_bytes_except_on_unsplit_64_row_tiles():
    """The table's swapped kernel above M = 16 stores its outputs (and split-K slots) 16
    bytes at a time through shared memory (``vector_store``), as it paid on the H200 on every
    such form except the unsplit x tiles of 32-64 rows (qkv-sized weights at M = 17-64,
    slower at M = 64); at M <= 16 and on the other kernels it keeps the wgmma layout's
    stores. Covers both word orders and the forms above M = 256 (the cost model's three)."""
    cpu = torch.device("cpu")
    for frag in (True, False):
        for m, n, k in [(48, 4096, 4096), (64, 4096, 14336), (32, 28672, 4096),
                        (128, 6144, 4096), (200, 6144, 4096), (256, 28672, 4096),
                        (512, 4096, 4096), (1024, 28672, 4096), (2048, 4096, 14336)]:  # fmt: skip
            cfg = choose_config(m, n, k, 128, cpu, frag=frag)
            if cfg.strategy == "wgmma" and cfg.swap:
                assert cfg.vector_store, (m, n, k, frag, cfg)
        for m, n, k in [(32, 6144, 4096), (64, 6144, 4096), (16, 28672, 4096), (8, 4096, 4096),
                        (1, 28672, 4096)]:  # fmt: skip
            cfg = choose_config(m, n, k, 128, cpu, frag=frag)
            assert not cfg.vector_store, (m, n, k, frag, cfg)
    with pytest.raises(ValueError, match="vector_store applies to the wgmma strategy"):
        Int4GemmConfig("mma", 16, 16, 128, 1, 8, 1, wsplit=True, vector_store=True)


def test_swapped_kernel_split_forms_take_the_ticket_before_the_slot_store():
    """Every split-K form of the table's swapped kernel takes the tile's ticket before its slot
    store (``early_ticket``, 2-5% faster on an H100 at M = 48-128), and no unsplit form asks
    for it; both word orders, the narrow weights' forms from M = 2 to 256."""
    cpu = torch.device("cpu")
    split_forms = 0
    for frag in (True, False):
        for n, k in [(4096, 4096), (6144, 4096), (4096, 14336), (28672, 4096)]:
            for m in (2, 9, 16, 17, 33, 48, 64, 65, 96, 128, 160, 256):
                cfg = choose_config(m, n, k, 128, cpu, frag=frag)
                if cfg.strategy != "wgmma" or not cfg.swap:
                    continue
                assert cfg.early_ticket == (cfg.split_k > 1), (m, n, k, frag, cfg)
                split_forms += cfg.split_k > 1
    assert split_forms >= 10, split_forms


def test_large_m_cost_model_takes_the_256_by_64_tiling_where_it_fills_the_waves():
    """Above M = 256 the cost model has a fourth form, the 256 x 64 tiling (``_NARROW_256``:
    half the products per program of 256 x 128 at half the cost), taken where it fills the
    waves that the others leave part empty: qkv at M = 1024 (3 waves of it against 2 of 256 x
    128, or dequantize + cuBLAS), down_proj at M = 512 (one wave of 128 programs against 256 x
    128's 64), the wide weight at M = 512. Where the two fill them alike (o_proj and down_proj
    at M = 1024, the wide weight at M = 1024) 256 x 128 is kept: it was faster there."""
    cpu = torch.device("cpu")
    for m, n, k in [(1024, 6144, 4096), (512, 4096, 14336), (512, 4096, 4096),
                    (512, 28672, 4096)]:  # fmt: skip
        assert choose_config(m, n, k, 128, cpu, frag=True) == _NARROW_256, (m, n, k)
    for m, n, k in [(1024, 4096, 4096), (1024, 4096, 14336), (1024, 28672, 4096)]:
        assert choose_config(m, n, k, 128, cpu, frag=True) == _LARGE_WIDE, (m, n, k)


def test_rows_past_a_multiple_of_256_run_as_a_second_call_where_the_model_puts_it_first():
    """``split_rows``: above M = 256, with at most 64 rows past a multiple of 256, two calls
    where the cost model puts them first. Points measured on the H200 as faster in two calls
    (the wide weight and down_proj at M = 257-576, qkv at 257-288) split; points measured
    slower (qkv at M = 513-800, o_proj at 288-800) and the rest do not, nor M <= 256,
    multiples of 256 or more than 64 rows past one."""
    cpu = torch.device("cpu")
    for m, n, k in [(257, 28672, 4096), (320, 28672, 4096), (576, 28672, 4096),
                    (257, 4096, 14336), (513, 4096, 14336), (264, 6144, 4096),
                    (257, 4096, 4096)]:  # fmt: skip
        assert split_rows(m, n, k, 128, cpu, frag=True) == m - m % 256, (m, n, k)
    for m, n, k in [(513, 6144, 4096), (769, 6144, 4096), (800, 4096, 4096), (544, 4096, 4096),
                    (288, 4096, 4096), (769, 28672, 4096), (800, 4096, 14336)]:  # fmt: skip
        assert split_rows(m, n, k, 128, cpu, frag=True) == 0, (m, n, k)
    for m in (1, 64, 200, 256, 512, 1024, 321, 600):
        assert split_rows(m, 28672, 4096, 128, cpu, frag=True) == 0, m


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(257, 4096, 14336), (300, 16440, 2048), (530, 4104, 8192)])
def test_rows_split_into_two_calls_agree_with_the_reference(m, n, k):
    """Where the table runs the rows past a multiple of 256 as a second call (``split_rows``),
    the joined output has x's M rows in order and agrees with the reference, eagerly and
    replayed from a CUDA graph; with a config given, one call."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the swapped wgmma kernel is for sm_90+")
    assert split_rows(m, n, k, 128, torch.device("cuda"), frag=True) == m - m % 256
    canon = random_weight(n, k, 128, seed=m)
    canon = Int4Weight(canon.qweight, canon.scales.bfloat16(), canon.offsets.bfloat16(), 128)
    weight = canon.to_frag()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    out = int4_gemm(x, weight)
    assert out.shape == (m, n) and out.is_contiguous()
    assert_close(out, int4_gemm_ref(x, canon), torch.bfloat16, f"two calls M={m} N={n}")
    assert_graph_replays(x, weight, canon, f"two calls M={m} N={n}, graph")
    cfg = choose_config(m, n, k, 128, x.device, frag=True)
    one = int4_gemm(x, weight, config=cfg)
    assert_close(one, int4_gemm_ref(x, canon), torch.bfloat16, f"one call M={m} N={n}")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, n, k",
    [(65, 4096, 4096), (96, 3072, 2048), (100, 4096, 4096), (104, 4096, 4096), (120, 4224, 1024),
     (128, 3072, 2048)],
)  # fmt: skip
def test_engine_word_order_two_64_row_x_tiles_graph_replay_bf16(m, n, k):
    """o_proj-sized weights as the engine holds them at M = 65-128: two 64-row x tiles,
    unsplit, warp-specialized, two wgmmas in flight (``_NARROW_2X64``), the second tile read
    past M by TMA's zero fill (M >= 97) or x padded to 128 rows (``pad_rows``), eagerly and in
    a CUDA graph, against the reference."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("fragment order is for sm_90+")
    assert choose_config(m, n, k, 128, torch.device("cuda"), frag=True) == _NARROW_2X64
    canon = random_weight(n, k, 128, seed=m + n)
    canon = Int4Weight(canon.qweight, canon.scales.bfloat16(), canon.offsets.bfloat16(), 128)
    weight = device_form(canon)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    assert_close(int4_gemm(x, weight), int4_gemm_ref(x, canon), torch.bfloat16, f"M={m} N={n}")
    assert_graph_replays(x, weight, canon, f"two 64-row tiles M={m} N={n} K={k}")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, n, k", [(136, 4232, 1024), (96, 16440, 512), (72, 1032, 8192), (80, 4096, 2048)]
)
def test_padded_rows_never_reach_the_output(m, n, k):
    """Where the table pads x to whole tiles (``pad_rows``), the added rows are left as the
    allocator hands them over: here a block just filled with NaN. The output holds only x's
    rows, agrees with the reference, eagerly and replayed from a CUDA graph."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the swapped wgmma kernel is for sm_90+")
    cfg = choose_config(m, n, k, 128, torch.device("cuda"), frag=True)
    pad = pad_rows(m, cfg, k)
    assert pad > 0, cfg
    canon = random_weight(n, k, 128, seed=m)
    canon = Int4Weight(canon.qweight, canon.scales.bfloat16(), canon.offsets.bfloat16(), 128)
    weight = canon.to_frag()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    poison = torch.full((m + pad, k), float("nan"), device="cuda", dtype=torch.bfloat16)
    del poison  # its block goes back to the cache, where the padded copy of x is taken from
    out = int4_gemm(x, weight)
    assert out.shape == (m, n) and out.is_contiguous()
    assert_close(out, int4_gemm_ref(x, canon), torch.bfloat16, f"padded M={m} N={n}")
    assert_graph_replays(x, weight, canon, f"padded M={m} N={n}, graph")


@pytest.mark.gpu
@pytest.mark.parametrize("order", ["canonical", "frag", "tiled"])
@pytest.mark.parametrize("k", [2048, 1152])  # 16 K tiles; 9 (odd: no two wgmmas in flight)
def test_large_m_tilings_and_their_fallback(k, order):
    """The swapped tilings the table runs above M = 256 (``_large_config``) and the 256-row
    one of qkv-sized weights at M = 129-256 (``_NARROW_256``), on both word orders, against
    the reference, eagerly and replayed in a CUDA graph; with fp32 x (which the wgmma kernels
    do not take) the same configs fall back to dequantize + cuBLAS."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the swapped wgmma kernel is for sm_90+")
    canon = random_weight(1000 + 40, k, 128, seed=k)
    canon = Int4Weight(canon.qweight, canon.scales.bfloat16(), canon.offsets.bfloat16(), 128)
    frag = order != "canonical"
    weight = canon.to_frag(tiled=order == "tiled") if frag else canon
    for config in (_LARGE_PLAIN_FRAG if frag else _LARGE_PLAIN, _LARGE_WIDE, _NARROW_256):
        for m in (257, 300, 513):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = int4_gemm(x, weight, config=config)
            assert_close(out, int4_gemm_ref(x, canon), torch.bfloat16, f"{config} M={m}")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = int4_gemm(x, weight, config=config)
        for _ in range(2):
            x.copy_(torch.randn_like(x))
            graph.replay()
            assert_close(out, int4_gemm_ref(x, canon), torch.bfloat16, f"graph {config}")
        x32 = torch.randn(300, k, device="cuda")
        out = int4_gemm(x32, weight, config=config)
        assert_close(out, int4_gemm_ref(x32, canon), torch.float32, f"fp32 x {config}")
