"""``kernels.launch.FastLaunch``: a kernel launched from its cache must behave exactly as the
normal call would, including Triton's specialization of integer and pointer arguments."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernels' import (jit decoration)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernels.launch import FastLaunch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _scaled_copy(src_ptr, dst_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask) * scale, mask=mask)


def _run(launch: FastLaunch, src: torch.Tensor, dst: torch.Tensor, n: int, scale: float) -> None:
    block = 256
    launch((triton.cdiv(n, block),), block, src_ptr=src, dst_ptr=dst, n=n, scale=scale,
           BLOCK=block)  # fmt: skip


def _run_positional(
    launch: FastLaunch, src: torch.Tensor, dst: torch.Tensor, n: int, scale: float
) -> None:
    """As the kernels' launchers call it: runtime arguments by position, the constexpr
    ones by name, which make the key."""
    launch[(triton.cdiv(n, 256),)](src, dst, n, scale, BLOCK=256)


@pytest.mark.parametrize("run", [_run, _run_positional], ids=["by-name", "positional"])
def test_fast_launch_matches_the_plain_call_and_keeps_specializations_apart(run):
    """Lengths divisible by 16 and not, and an offset (unaligned) source: each is its own
    specialization, so a kernel compiled assuming n % 16 == 0 or a 16-byte-aligned pointer is
    never reused where that does not hold (its vector stores would write past n = 1001 or 17,
    its vector loads would fault). The elements past n must stay untouched and every call must
    equal the same computation in PyTorch."""
    launch = FastLaunch(_scaled_copy)
    base = torch.arange(1040, dtype=torch.float32, device=DEVICE)
    for n, offset in ((1024, 0), (1024, 0), (1001, 0), (1001, 0), (1024, 1), (1024, 1), (17, 0)):
        src = base[offset : offset + n]
        dst = torch.full((1040,), -7.0, device=DEVICE)
        run(launch, src, dst, n, 0.5)
        assert torch.equal(dst[:n], src * 0.5), (n, offset)
        assert bool((dst[n:] == -7.0).all()), f"n={n} offset={offset}: wrote past n"
    if launch.fast:  # compiled once per specialization (17 is specialized as 1001 is)
        assert len(launch.kernels) == 3, list(launch.kernels)


@pytest.mark.gpu
def test_fast_launch_replays_in_a_cuda_graph():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    launch = FastLaunch(_scaled_copy)
    src = torch.randn(4096, device="cuda")
    dst = torch.empty_like(src)
    _run(launch, src, dst, 4096, 2.0)  # compiled
    _run(launch, src, dst, 4096, 2.0)  # from the cache
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _run(launch, src, dst, 4096, 3.0)
    src.copy_(torch.randn_like(src))
    graph.replay()
    assert torch.equal(dst, src * 3.0)
