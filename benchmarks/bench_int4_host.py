"""Host cost of an eager INT4 linear against ``F.linear``, one H200.

Prefill and mixed steps run eagerly (CUDA graphs replay decode-only steps), so what a call
costs the host matters there: an 8B model runs 128 linears per step. Each case launches
the same call ``--calls`` times back to back without synchronizing (``host``: enqueue time
per call) and then waits for the GPU (``wall``: per call, host and GPU overlapped); where
host equals wall the stream is host-bound. Weights in the engine's word order.

    python3 benchmarks/bench_int4_host.py [--rows 1,16,256,512,2048] [--calls 300]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import engine_int4  # noqa: E402

from kernels.int4_gemm import int4_gemm  # noqa: E402

SHAPES = [(4096, 4096), (14336, 4096), (4096, 28672)]  # K x N: o_proj, down_proj, gate_up


def per_call_us(fn, calls: int) -> tuple[float, float]:
    """(host enqueue us, wall us) per call of ``fn`` over ``calls`` back-to-back calls."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    enqueued = time.perf_counter()
    torch.cuda.synchronize()
    done = time.perf_counter()
    return (enqueued - start) / calls * 1e6, (done - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,16,256,512,2048", help="M values")
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| K x N | M | words | int4 host us | int4 wall us | bf16 host us | bf16 wall us |")
    print("|---|---|---|---|---|---|---|")
    for k, n in SHAPES:
        weight = engine_int4(n, k)
        dense = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            int4 = per_call_us(lambda x=x, w=weight: int4_gemm(x, w), args.calls)
            bf16 = per_call_us(lambda x=x, d=dense: torch.nn.functional.linear(x, d), args.calls)
            words = "fragment" if weight.frag else "canonical"
            print(f"| {k} x {n} | {m} | {words} | {int4[0]:.1f} | {int4[1]:.1f} | "
                  f"{bf16[0]:.1f} | {bf16[1]:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
