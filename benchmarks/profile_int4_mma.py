"""Nsight Compute view of the register mma INT4 kernel's loads (``int4_mma(..., parts=2)``):
warps over rows with split-K against warps over K (``wsplit``), same warps and K tiles per
warp, one weight, M = 1.

    ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,\\
sm__warps_active.avg.pct_of_peak_sustained_active,sm__cycles_active.avg,\\
lts__t_sectors_srcunit_tex_op_read.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,\\
launch__grid_size,launch__block_size,launch__registers_per_thread,\\
launch__occupancy_limit_registers,launch__occupancy_limit_warps \\
        python3 benchmarks/profile_int4_mma.py [--shape 4096x4096]

Each config runs three times (the first compiles); ncu flushes the caches before each launch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import random_int4  # noqa: E402

from kernels.int4_mma import int4_mma, to_mma  # noqa: E402

CONFIGS = [
    dict(num_warps=4, split_k=32, wsplit=False),  # 8192 warps of 1 tile
    dict(num_warps=16, split_k=2, wsplit=True),  # 8192 warps of 1 tile, 16 per program
    dict(num_warps=4, split_k=8, wsplit=False),  # 2048 warps of 4 tiles
    dict(num_warps=8, split_k=1, wsplit=True),  # 2048 warps of 4 tiles, 8 per program
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4096x4096")
    parser.add_argument("--parts", type=int, default=2)
    parser.add_argument("--configs", default="0,1,2,3", help="indices into CONFIGS")
    args = parser.parse_args()
    k, n = (int(v) for v in args.shape.split("x"))
    weight = random_int4(n, k)
    weight = to_mma(weight)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    for cfg in [CONFIGS[int(i)] for i in args.configs.split(",")]:
        for _ in range(3):
            int4_mma(x, weight, block_m=8, depth=1, parts=args.parts, **cfg)
        torch.cuda.synchronize()
        print(cfg, flush=True)


if __name__ == "__main__":
    main()
