"""Run the INT4 table's kernel once per case between cudaProfilerStart/Stop, for Nsight Compute.

    ncu --clock-control none --profile-from-start off --kernel-name regex:int4 --set full \
        --import-source yes -o int4 python3 benchmarks/profile_int4_table.py [--engine-order]
    ncu -i int4.ncu-rep --page details            # per kernel: throughput, stalls, occupancy
    ncu -i int4.ncu-rep --page source --csv --print-source sass   # stall samples per SASS line

Llama-3-8B shapes at the M where the table picks each kernel (gemv at M = 1, the swapped
wgmma kernel at M = 16, 64 and 256 on wide weights and at M = 16 on down_proj, the Triton
TMA mm kernel at M = 16 on 4096 x 4096). Canonical words unless ``--engine-order`` (the
order ``Int4Linear`` holds them in: fragment order for wide and long-K weights on Hopper).
Each case is checked against the reference before profiling starts. ``--cases M:K:N,...``
profiles those instead, and ``--bf16`` each case's ``F.linear`` on a bf16 weight as well (the
peer the benchmarks compare with; profile without the kernel-name filter then):

    ncu --clock-control none --profile-from-start off --set full -o large \
        python3 benchmarks/profile_int4_table.py --engine-order --bf16 \
        --cases 1024:4096:28672,256:4096:6144
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import engine_int4, random_int4  # noqa: E402

from kernels.int4_gemm import int4_gemm, int4_gemm_ref  # noqa: E402
from kernels.int4_gemm_config import choose_config  # noqa: E402

CASES = [(1, 4096, 28672), (16, 4096, 28672), (64, 4096, 28672), (16, 14336, 4096),
         (16, 4096, 4096), (256, 4096, 28672)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--engine-order", action="store_true", help="the words as Int4Linear holds them"
    )
    parser.add_argument("--cases", help="M:K:N,... instead of the default cases")
    parser.add_argument("--bf16", action="store_true", help="also F.linear on a bf16 weight")
    args = parser.parse_args()
    cases = CASES
    if args.cases:
        cases = [tuple(int(v) for v in c.split(":")) for c in args.cases.split(",")]
    make = engine_int4 if args.engine_order else random_int4
    weights, xs = {}, []
    for m, k, n in cases:
        w = weights.setdefault((k, n), make(n, k))
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out, ref = int4_gemm(x, w).float(), int4_gemm_ref(x, w).float()
        err = ((out - ref).norm() / ref.norm()).item()
        cfg = choose_config(m, n, k, w.group_size, x.device, frag=w.frag)
        print(f"M={m} K={k} N={n} frag={w.frag} rel. err {err:.1e} {cfg}", flush=True)
        dense = None
        if args.bf16:
            dense = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            F.linear(x, dense)  # cuBLAS's handle and workspace outside the range
        xs.append((x, w, dense))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for x, w, dense in xs:  # x made before the range: only the GEMMs are in it
        int4_gemm(x, w)
        if dense is not None:
            F.linear(x, dense)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
