"""Rows just past a multiple of 256: one call of the table's config for all M rows against
two calls (the rows up to the multiple on their own config, the rest, at most 64 rows, on
theirs, outputs joined with ``torch.cat``), beside bf16 cuBLAS, on the engine's word order
(bench_int4_gemm.py's harness: CUDA-graph replays over weight copies that exceed L2, median
per call). Also the table's own call (``int4_gemm`` without a config), which is one of the
two.

    python3 benchmarks/bench_int4_row_split.py [--shapes 4096x6144,...] \
        [--rows 257,264,288,320,513,544,769,1025,1088] [--plot split.png]

Each output is checked against the reference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import GROUP, SHAPES, graph_time_us, plot_pairs, shape_rows  # noqa: E402

from kernels.int4_gemm import int4_gemm, int4_gemm_ref  # noqa: E402
from kernels.int4_gemm_config import choose_config  # noqa: E402


def two_calls(x: torch.Tensor, w, main: int) -> torch.Tensor:
    """Rows [0, main) and [main, M) each on the table's config for their count, joined."""
    m, k = x.shape
    n = w.out_features
    first = choose_config(main, n, k, GROUP, x.device, frag=w.frag)
    rest = choose_config(m - main, n, k, GROUP, x.device, frag=w.frag)
    return torch.cat([int4_gemm(x[:main], w, config=first), int4_gemm(x[main:], w, config=rest)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    parser.add_argument("--rows", default="257,264,288,320,513,544,769,1025,1088")
    parser.add_argument("--plot", default=None, help="a PNG of bf16 / INT4 by M")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = [int(v) for v in args.rows.split(",")]
    if any(m <= 256 or m % 256 == 0 for m in rows):
        raise SystemExit(f"--rows: M above 256 and not a multiple of 256, got {args.rows}")
    table = []
    for k, n, m, peers, _ in shape_rows(shapes, rows):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w0 = peers.int4[0]
        main_rows = m - m % 256
        one = choose_config(m, n, k, GROUP, x.device, frag=w0.frag)
        ref = int4_gemm_ref(x, w0).float()
        err = 0.0
        for out in (int4_gemm(x, w0, config=one), two_calls(x, w0, main_rows), int4_gemm(x, w0)):
            err = max(err, ((out.float() - ref).norm() / ref.norm()).item())
        t_one = peers.time_ours(x, one)
        t_two = graph_time_us(
            lambda i, x=x, w=peers.int4, r=main_rows: two_calls(x, w[i], r), peers.num_int4
        )
        t_table = peers.time_ours(x, None)
        table.append((k, n, m, main_rows, peers.time_bf16(x), t_one, t_two, t_table, one, err))
    print("\n| K x N | M | bf16 us | one call us (form) | two calls us (rows) | table us "
          "| one / two | bf16 / table | worst rel. error |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for k, n, m, main_rows, t_bf16, t_one, t_two, t_table, one, err in table:
        form = "dequant" if one.strategy == "dequant" else f"{one.block_m}x{one.block_n}"
        print(f"| {k} x {n} | {m} | {t_bf16:.1f} | {t_one:.1f} ({form}) | {t_two:.1f} "
              f"({main_rows} + {m - main_rows}) | {t_table:.1f} | {t_one / t_two:.2f} | "
              f"{t_bf16 / t_table:.2f}x | {err:.1e} |")  # fmt: skip
    if args.plot:
        curves = {}
        for k, n in shapes:
            pts = [r for r in table if r[0] == k and r[1] == n]
            curves[f"{k}x{n}"] = ([r[2] for r in pts], [r[4] / r[6] for r in pts],
                                  [r[4] / r[5] for r in pts])  # fmt: skip
        plot_pairs(args.plot, curves, "two calls (solid) against one (dashed)", log_x=False)


if __name__ == "__main__":
    main()
