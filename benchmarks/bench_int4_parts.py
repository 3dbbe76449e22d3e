"""Where the swapped INT4 kernel's time goes at small M: the shipped table against the same
kernel and tiling with part of the work left out (``int4_wgmma_swap(..., parts=)``), Llama-3-8B
projection shapes, one H200; same harness as bench_int4_gemm.py (CUDA-graph replays over
weight copies that exceed L2; median of 10), weights in the engine's order.

    python3 benchmarks/bench_int4_parts.py [--rows 1,16,64]

Columns: "ring" streams the tiles through the TMA ring and does nothing with them (parts=2),
"ring + mma" adds each tile's wgmma on an operand of ones (parts=1), "kernel" is the whole
kernel (parts=0), "read" one torch.sum over the packed words. bf16 / ring is the ratio to
bf16 that this kernel structure could reach if the decode and the products cost nothing.
Shapes whose table entry is not the swapped kernel use 64 rows, split-K 4 (canonical words).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import SHAPES, graph_time_us, shape_rows  # noqa: E402

from kernels.int4_gemm import choose_config, int4_gemm_ref  # noqa: E402
from kernels.int4_gemm_config import Int4GemmConfig  # noqa: E402
from kernels.int4_wgmma import int4_wgmma_swap  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,16,64", help="M values")
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    table = []
    for k, n, m, peers, first in shape_rows(SHAPES, [int(m) for m in args.rows.split(",")]):
        if first:
            t_read = peers.time_read_floor()
        w0 = peers.int4[0]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        cfg = choose_config(m, n, k, w0.group_size, x.device, frag=w0.frag)
        if not (cfg.strategy == "wgmma" and cfg.swap and not cfg.specialized):
            block_m = max(8, 1 << (m - 1).bit_length())
            cfg = Int4GemmConfig("wgmma", block_m, 64, 128, 4, 4, 4, swap=True)
        times = {}
        for parts in (0, 1, 2):

            def run(i, parts=parts, w=peers.int4, x=x, c=cfg):
                return int4_wgmma_swap(x, w[i], c.block_m, c.block_n, c.block_k, c.split_k,
                                       c.num_stages, c.num_warps, parts=parts)  # fmt: skip

            if parts == 0:
                ref = int4_gemm_ref(x, w0).float()
                err = ((run(0).float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, f"{k}x{n} M={m}: relative error {err:.1e}"
            times[parts] = graph_time_us(run, peers.num_int4)
        t_bf16 = peers.time_bf16(x)
        table.append((k, n, m, cfg, t_bf16, peers.time_ours(x, None), t_read, times))
    print(
        "\n| K x N | M | tiling (rows x weight rows, split) | bf16 us | table us | kernel us | "
        "ring + mma us | ring us | read us | bf16 / table | bf16 / ring |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for k, n, m, c, t_bf16, t_table, t_read, t in table:
        print(
            f"| {k} x {n} | {m} | {c.block_m} x {c.block_n}, {c.split_k} | {t_bf16:.1f} | "
            f"{t_table:.1f} | {t[0]:.1f} | {t[1]:.1f} | {t[2]:.1f} | {t_read:.1f} | "
            f"{t_bf16 / t_table:.2f}x | {t_bf16 / t[2]:.2f}x |"
        )


if __name__ == "__main__":
    main()
