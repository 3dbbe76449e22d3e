"""The Gluon W4A16 kernel for large M (``kernels/int4_wgmma.py``) against the reference
(dequantize + matmul in fp32), on Hopper GPUs only (wgmma, TMA)."""

from __future__ import annotations

import pytest
import torch

from kernels.int4_gemm import int4_gemm_ref
from kernels.int4_wgmma import int4_wgmma, wgmma_ok
from tests.kernels.test_int4_gemm import assert_close, random_weight

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
