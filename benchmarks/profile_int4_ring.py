"""Why the swapped INT4 kernel's TMA ring streams a narrow weight slower than a plain read:
its ring alone and whole (``int4_wgmma_swap(..., parts=)``) in a few tilings, beside the
streaming read of ``bench_int4_small_m.py``, on one weight at small M.

    python3 benchmarks/profile_int4_ring.py [--shape 4096x4096] [--rows 16]       # times
    ncu --profile-from-start off --section SpeedOfLight --section WarpStateStats \\
        --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \\
        python3 benchmarks/profile_int4_ring.py --profile                          # counters

Times come from bench_int4_gemm.py's harness (CUDA-graph replays over weight copies that
exceed L2). With ``--profile`` each kernel runs once, warm, between cudaProfilerStart and
Stop, for Nsight Compute (which flushes caches before each launch by default).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import Peers, graph_time_us  # noqa: E402
from bench_int4_small_m import stream_read  # noqa: E402

from kernels.int4_gemm import int4_gemm_ref  # noqa: E402
from kernels.int4_wgmma import int4_wgmma_swap  # noqa: E402

# (block_n, split, stages, warp-specialized): the table's tiling first
TILINGS = [(64, 4, 4, False), (64, 4, 8, False), (128, 2, 4, False), (128, 2, 6, False),
           (64, 4, 4, True), (128, 4, 4, False)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4096x4096", help="K x N")
    parser.add_argument("--rows", type=int, default=16, help="M")
    parser.add_argument("--profile", action="store_true", help="one launch each, for ncu")
    args = parser.parse_args()
    k, n = (int(v) for v in args.shape.split("x"))
    m = args.rows
    peers = Peers(k, n, with_torch=False, engine_order=False)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    block_m = max(8, 1 << (m - 1).bit_length())
    words = [w.qweight.view(-1) for w in peers.int4]
    out = torch.empty(8192, dtype=torch.int32, device="cuda")
    runs = {"read (512 programs, 4 KB steps, 4 warps, 2 stages)":
            lambda i: stream_read(words[i], out, 512, 1024, 4, 2, False)}  # fmt: skip
    ref = int4_gemm_ref(x, peers.int4[0]).float()
    for bn, split, stages, ws in TILINGS:
        for parts in (2, 0):
            if ws and parts:
                continue

            def run(i, bn=bn, split=split, stages=stages, ws=ws, parts=parts):
                return int4_wgmma_swap(x, peers.int4[i], block_m, bn, 128, split, stages, 4,
                                       ws, parts=parts)  # fmt: skip

            if parts == 0:
                err = ((run(0).float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, f"{bn} {split} {stages} {ws}: relative error {err:.1e}"
            what = "ring" if parts else "kernel"
            runs[f"{what} {block_m}x{bn} split {split} stages {stages}{' ws' if ws else ''}"] = run
    if args.profile:
        for fn in runs.values():
            fn(0)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for name, fn in runs.items():
            torch.cuda.nvtx.range_push(name)
            fn(1)
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print("\n".join(f"launch {i}: {name}" for i, name in enumerate(runs)))
        return
    print(f"K x N = {k} x {n}, M = {m}; bf16 {peers.time_bf16(x):.1f} us")
    for name, fn in runs.items():
        print(f"{name}: {graph_time_us(fn, peers.num_int4):.1f} us", flush=True)


if __name__ == "__main__":
    main()
