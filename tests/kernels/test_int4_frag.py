"""The fragment word order of INT4 weights (``Int4Weight.frag``): the layout, checked against
the wgmma A-fragment definition; the dequantizers (PyTorch, and the Triton kernel under the
interpreter on CPU); ``int4_gemm``'s routing; ``Int4Linear``'s conversion on Hopper."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernels' import (jit decoration)

from engine.quant.int4_linear import Int4Linear  # noqa: E402
from kernels.int4_gemm import (  # noqa: E402
    Int4GemmConfig,
    Int4Weight,
    dequantize_int4,
    dequantize_int4_triton,
    device_form,
    frag_preferred,
    int4_gemm,
    int4_gemm_ref,
)
from kernels.int4_gemm_config import _NARROW_2X64, choose_config  # noqa: E402
from kernels.int4_weight import frag_order, frag_unorder, tile_order, tile_unorder  # noqa: E402
from tests.kernels.test_int4_gemm import DEVICE, assert_close, random_weight  # noqa: E402


def codes_of(qweight: torch.Tensor) -> torch.Tensor:
    """Nibble j of word w as codes [N, words, 8] (independent of the kernels' helpers)."""
    q = qweight.to(torch.int64) & 0xFFFFFFFF
    return torch.stack([(q >> (4 * j)) & 0xF for j in range(8)], dim=-1)


def test_layout_is_the_wgmma_fragment():
    """Hopper's wgmma A fragment (PTX ISA, "Register fragments: matrix A", 16-bit types): in a
    k16 step, lane l holds row l // 4 (and + 8) at columns 2t, 2t + 1 (register a0 / a1) and
    2t + 8, 2t + 9 (a2 / a3), t = l % 4. The fragment order gives lane t, for the 32-column
    block b of a 128-column tile, one word 4t + b whose register r = 2c + e (k16 step c of the
    block, e = 0 for columns 2t.., 1 for 2t + 8..) is nibbles r (first column) and r + 4."""
    w = random_weight(3, 256, 128, seed=11).to("cpu")
    canon = codes_of(w.qweight).reshape(3, 256)  # code of column k
    frag = codes_of(frag_order(w.qweight)).reshape(3, 2, 16, 8)  # [row, tile, word, nibble]
    for tile in range(2):
        for t in range(4):
            for b in range(4):
                for c in range(2):
                    for e in range(2):
                        col = tile * 128 + 32 * b + 16 * c + 8 * e + 2 * t
                        r = 2 * c + e
                        word = frag[:, tile, 4 * t + b]
                        assert torch.equal(word[:, r], canon[:, col]), (tile, t, b, c, e)
                        assert torch.equal(word[:, r + 4], canon[:, col + 1]), (tile, t, b, c, e)
    assert torch.equal(frag_unorder(frag_order(w.qweight)), w.qweight)


def test_tile_order_runs_of_16_rows():
    """``tile_order``: word w of row r's K tile t lands at 256 (T (r // 16) + t) + 16 (r % 16)
    + w (T tiles per row), every word once; N not a multiple of 16 is refused."""
    n, k = 48, 384
    words = torch.randint(-(2**31), 2**31 - 1, (n, k // 8), dtype=torch.int32)
    tiled = tile_order(words).reshape(-1)
    r, t, w = torch.meshgrid(torch.arange(n), torch.arange(k // 128), torch.arange(16),
                             indexing="ij")  # fmt: skip
    where = 256 * ((k // 128) * (r // 16) + t) + 16 * (r % 16) + w
    assert torch.equal(tiled[where.reshape(-1)], words[r, 16 * t + w].reshape(-1))
    assert torch.equal(torch.sort(tiled).values, torch.sort(words.reshape(-1)).values)
    with pytest.raises(ValueError, match="multiple of 16"):
        tile_order(words[:40])


def test_tile_order_layout():
    """Tile order as a weight form (``Int4Weight.tiled``; the order itself checked against
    its formula above): ``tile_unorder`` inverts it; ``to_frag(tiled=True)`` is fragment
    order then tile order, from either order, and back."""
    w = random_weight(48, 384, 128, seed=21).to("cpu")
    frag = frag_order(w.qweight)
    flat = tile_order(frag).reshape(-1)
    assert torch.equal(tile_unorder(tile_order(frag)), frag)
    tiled = w.to_frag(tiled=True)
    assert tiled.frag and tiled.tiled and torch.equal(tiled.qweight.reshape(-1), flat)
    assert w.to_frag().to_frag(tiled=True).qweight.equal(tiled.qweight)
    assert torch.equal(tiled.to_frag().qweight, frag) and not tiled.to_frag().tiled
    assert torch.equal(tiled.to_canonical().qweight, w.qweight)
    assert not tiled.to_canonical().tiled and tiled.to_frag(tiled=True) is tiled


@pytest.mark.parametrize("tiled", [False, True], ids=["rows", "tiled"])
@pytest.mark.parametrize("group_size", [128, 256, 512])  # 512 = K: per channel
def test_dequantizers(group_size, tiled):
    """Both dequantizers on fragment-ordered words, row-major and in tile order, give the
    canonical weight's values exactly (N = 48: three blocks of 16 rows, the Triton kernel's
    32-row blocks across them)."""
    w = random_weight(48, 512, group_size, seed=12)
    f = w.to_frag(tiled=tiled)
    assert f.frag and f.tiled == tiled and not torch.equal(f.qweight, w.qweight)
    dense = dequantize_int4(w)
    torch.testing.assert_close(dequantize_int4(f), dense, rtol=0, atol=0)
    for dtype in (torch.float16, torch.float32):
        torch.testing.assert_close(
            dequantize_int4_triton(f, dtype), dequantize_int4_triton(w, dtype), rtol=0, atol=0
        )
        assert_close(dequantize_int4_triton(f, dtype).float(), dense, dtype, "frag dequant")
    assert f.to_canonical().frag is False
    assert torch.equal(f.to_canonical().qweight, w.qweight)


def test_int4_gemm_routes_fragment_order():
    """Off Hopper (and on CPU) a fragment-ordered weight runs on dequantize + matmul; the table
    gives such weights the register mma kernel (M <= 16 on N <= 8192 with K < 8192, else M <=
    8), the swapped wgmma kernel (M <= 256; x tiles of 128 rows above M = 64 on narrow
    weights, two of 64 on o_proj-sized ones at M = 65-128) or dequantize only."""
    canon = random_weight(48, 256, 128, seed=13, perm=True)
    w = canon.to_frag()
    for m in (1, 7, 300):
        x = torch.randn(m, 256, device=DEVICE)
        assert_close(int4_gemm(x, w), int4_gemm_ref(x, w), torch.float32, f"M={m}")
        assert_close(int4_gemm_ref(x, w), int4_gemm_ref(x, canon), torch.float32, "ref")
        tiled = int4_gemm(x, canon.to_frag(tiled=True))
        assert_close(tiled, int4_gemm_ref(x, canon), torch.float32, f"tiled M={m}")
    for m in (1, 2, 16, 64, 65, 128, 200, 256, 257, 4096):
        for n in (4096, 28672):
            cfg = choose_config(m, n, 4096, 128, torch.device(DEVICE), frag=True)
            if m <= (16 if n <= 8192 else 8):  # the register mma kernel, warps over K
                assert cfg.strategy == "mma" and cfg.wsplit and cfg.split_k == 1, cfg
                continue
            # above M = 256 the cost model's pick: dequantize + cuBLAS or a swapped tiling
            assert cfg.swap or (m > 256 and cfg.strategy == "dequant"), (m, n, cfg)
            rows = 128 if n <= 8192 and m > 64 else min(m, 128)
            if n == 4096 and 64 < m <= 128:  # o_proj-sized: two 64-row x tiles
                assert cfg == _NARROW_2X64, cfg
                rows = 64
            assert cfg.strategy == "dequant" or cfg.block_k == 128 and cfg.block_m >= rows
    with pytest.raises(ValueError, match="fragment-ordered"):
        int4_gemm(torch.randn(2, 256, device=DEVICE), w, config=Int4GemmConfig("gemv"))


def test_fragment_order_bad_input():
    w = random_weight(16, 256, 128, seed=14)
    with pytest.raises(ValueError, match="multiple"):
        random_weight(16, 192, 64, seed=15).to_frag()
    with pytest.raises(ValueError, match="multiple"):
        random_weight(16, 256, 64, seed=15).to_frag()
    with pytest.raises(ValueError, match="same word order"):
        Int4Weight.cat_n([w, w.to_frag()])
    f = random_weight(16, 512, 128, seed=16).to_frag()
    torch.testing.assert_close(
        dequantize_int4(f.narrow_k(128, 256)), dequantize_int4(f)[:, 128:384], rtol=0, atol=0
    )
    torch.testing.assert_close(
        dequantize_int4(Int4Weight.cat_n([f, f]).narrow_n(16, 16)), dequantize_int4(f)
    )


def test_tile_order_shards_and_bad_input():
    """Weights in tile order concatenate along N and shard along N (on 16-row blocks) and K
    (on group boundaries) to the same values as canonical ones; what tile order cannot hold
    is refused with the reason."""
    a, b = random_weight(32, 512, 128, seed=22), random_weight(16, 512, 128, seed=23)
    ta, tb = a.to_frag(tiled=True), b.to_frag(tiled=True)
    both = Int4Weight.cat_n([ta, tb])
    assert both.tiled
    dense = torch.cat([dequantize_int4(a), dequantize_int4(b)])
    torch.testing.assert_close(dequantize_int4(both), dense, rtol=0, atol=0)
    torch.testing.assert_close(dequantize_int4(both.narrow_n(16, 32)), dense[16:48], rtol=0,
                               atol=0)  # fmt: skip
    shard = both.narrow_k(128, 256)
    assert shard.tiled and shard.in_features == 256
    torch.testing.assert_close(dequantize_int4(shard), dense[:, 128:384], rtol=0, atol=0)
    with pytest.raises(ValueError, match="multiple of 16"):
        random_weight(40, 512, 128, seed=24).to_frag(tiled=True)
    with pytest.raises(ValueError, match="multiples of 16"):
        both.narrow_n(8, 16)
    with pytest.raises(ValueError, match="same word order"):
        Int4Weight.cat_n([ta, b.to_frag()])
    with pytest.raises(ValueError, match="fragment-ordered"):
        Int4Weight(a.qweight, a.scales, a.offsets, 128, tiled=True)
    with pytest.raises(ValueError, match="contiguous"):
        Int4Weight(ta.qweight.t().contiguous().t(), a.scales, a.offsets, 128, frag=True,
                   tiled=True)  # fmt: skip


def test_frag_preferred_only_on_hopper():
    w = random_weight(8200, 256, 128, seed=17)  # N > 8192, a multiple of 8
    hopper = DEVICE == "cuda" and torch.cuda.get_device_capability()[0] >= 9
    assert frag_preferred(w) == hopper
    assert frag_preferred(random_weight(4096, 256, 128, seed=18)) == hopper  # narrow too
    assert not frag_preferred(random_weight(4096, 256, 64, seed=18))  # groups of 64
    assert frag_preferred(random_weight(64, 8192, 128, seed=18)) == hopper  # long K


@pytest.mark.gpu
def test_int4_linear_converts_wide_weights_on_hopper():
    """On sm_90, Int4Linear holds a wide part in fragment order and still computes the same
    outputs (table kernels at M = 1, 16, 100 and 300 against the reference)."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("fragment order is for sm_90+")
    parts = [random_weight(8200, 512, 128, seed=19), random_weight(4096, 512, 128, seed=20)]
    parts = [replace_dtype(p, torch.bfloat16) for p in parts]
    ref = [p.to("cpu") for p in parts]
    layer = Int4Linear(parts)
    assert layer.parts[0].frag and layer.out_features == 12296  # fused, N > 8192
    assert not layer.parts[0].tiled  # N not a multiple of 16: row-major fragment order
    for m in (1, 16, 100, 300):
        x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
        want = torch.cat([int4_gemm_ref(x.cpu().float(), r) for r in ref], dim=-1)
        assert_close(layer(x).float().cpu(), want, torch.bfloat16, f"M={m}")
    back = layer.to("cpu")
    x = torch.randn(3, 512)
    want = torch.cat([int4_gemm_ref(x, r) for r in ref], dim=-1)
    assert_close(back(x), want, torch.float32, "moved to CPU")


@pytest.mark.gpu
def test_int4_linear_holds_tile_order_on_hopper():
    """On sm_90, a part with N a multiple of 16 is held in fragment and tile order
    (``device_form``), in the layer's buffer, and computes the reference's outputs on the
    table's kernels at M = 1, 8, 16, 64 (register mma, swapped wgmma) and 300 (dequantize),
    also after a round trip to the CPU and back."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("fragment order is for sm_90+")
    parts = [replace_dtype(random_weight(n, 1024, 128, seed=25 + n), torch.bfloat16)
             for n in (1024, 256, 256)]  # fmt: skip
    ref = [p.to("cpu") for p in parts]
    layer = Int4Linear(parts)
    assert layer.parts[0].tiled and layer.qweight_0 is layer.parts[0].qweight
    assert "tiled" in repr(layer)
    assert device_form(layer.parts[0]) is layer.parts[0]
    for rounds in range(2):
        for m in (1, 8, 16, 64, 300):
            x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
            want = torch.cat([int4_gemm_ref(x.cpu().float(), r) for r in ref], dim=-1)
            assert_close(layer(x).float().cpu(), want, torch.bfloat16, f"M={m} round {rounds}")
        layer = layer.to("cpu").to("cuda")
        assert layer.parts[0].tiled


def replace_dtype(w: Int4Weight, dtype: torch.dtype) -> Int4Weight:
    return Int4Weight(w.qweight, w.scales.to(dtype), w.offsets.to(dtype), w.group_size)
