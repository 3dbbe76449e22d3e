"""The swapped wgmma kernel with one barrier per copy of a ring slot against one per stage, on
the table's configs, A and B alternated in one process (bench_int4_gemm.py's harness:
CUDA-graph replays over weight copies that exceed L2, median time per call), beside bf16
cuBLAS, on the engine's word order.

    python3 benchmarks/bench_int4_barriers.py [--shapes 4096x6144,...] [--rows 16,64,1024] \
        [--rounds 3] [--plot barriers.png]

Why: Triton 3.6's shared-memory barrier analysis (membar) counts each TMA copy as a write to
its mbarrier's array and puts a CTA-wide ``bar.sync`` between any two operations on one
array, so a stage whose expect and four copies (x, words, scales, offsets) share one barrier
took five syncs of every warp per K tile, six with the refill's own (offline SASS,
``benchmarks/sass_int4_swap.py``). With a barrier array per copy
(``int4_wgmma_swap(..., stage_barriers=4)``) the expects go first and one sync precedes the
copies: three per tile. Only the plain (not warp-specialized) form changes; rows where the
table runs another kernel are listed as such. Each output is checked against the reference.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import SHAPES, Peers, graph_time_us  # noqa: E402
from tqdm import tqdm  # noqa: E402

from kernels import int4_gemm as G  # noqa: E402
from kernels.int4_gemm_config import choose_config  # noqa: E402

ORIGINAL = G.int4_wgmma_swap


def with_barriers(n: int):
    """The table's launcher with the swapped kernel's stage barriers set to ``n``."""
    G.int4_wgmma_swap = functools.partial(ORIGINAL, stage_barriers=n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    parser.add_argument("--rows", default="16,32,64,128,256,512,1024")
    parser.add_argument("--rounds", type=int, default=3, help="A/B pairs per case")
    parser.add_argument("--plot", default=None, help="a PNG of bf16 / ours by M, both forms")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = [int(v) for v in args.rows.split(",")]
    table = []
    bar = tqdm(total=len(shapes) * len(rows), desc="cases")
    for k, n in shapes:
        peers = Peers(k, n, with_torch=False)
        w0 = peers.int4[0]
        for m in rows:
            bar.update()
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            cfg = choose_config(m, n, k, w0.group_size, x.device, frag=True)
            plain = cfg.strategy == "wgmma" and cfg.swap and not cfg.specialized
            if not plain:
                table.append((k, n, m, cfg, None, None, None, None))
                continue
            ref = G.int4_gemm_ref(x, w0).float()
            errs, times = {}, {1: [], 4: []}
            for b in (1, 4):
                with_barriers(b)
                out = G.int4_gemm(x, w0, config=cfg).float()
                errs[b] = ((out - ref).norm() / ref.norm()).item()
            t_bf16 = peers.time_bf16(x)
            for _ in range(args.rounds):
                for b in (1, 4):
                    with_barriers(b)
                    times[b].append(
                        graph_time_us(
                            lambda i, x=x, w=peers.int4, c=cfg: G.int4_gemm(x, w[i], config=c),
                            peers.num_int4,
                        )
                    )
            with_barriers(4)
            t1, t4 = statistics.median(times[1]), statistics.median(times[4])
            table.append((k, n, m, cfg, t_bf16, t1, t4, max(errs.values())))
        peers = w0 = None
        torch.cuda.empty_cache()
    bar.close()
    G.int4_wgmma_swap = ORIGINAL
    print("\n| K x N | M | table's form | bf16 us | one barrier us | one per copy us | "
          "per copy / one | bf16 / ours (one, per copy) | worst rel. error |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for k, n, m, cfg, t_bf16, t1, t4, err in table:
        form = f"{cfg.strategy} {cfg.block_m}x{cfg.block_n} split {cfg.split_k}"
        if cfg.pipe:
            form += " pipe"
        if t1 is None:
            print(f"| {k} x {n} | {m} | {form}{' ws' if cfg.specialized else ''} "
                  f"(unchanged) | | | | | | |")  # fmt: skip
            continue
        print(f"| {k} x {n} | {m} | {form} | {t_bf16:.1f} | {t1:.1f} | {t4:.1f} | "
              f"{t4 / t1:.3f} | {t_bf16 / t1:.2f}x, {t_bf16 / t4:.2f}x | {err:.1e} |")  # fmt: skip
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for k, n in shapes:
            pts = [r for r in table if r[0] == k and r[1] == n and r[5] is not None]
            if not pts:
                continue
            ms = [r[2] for r in pts]
            (line,) = ax.plot(ms, [r[4] / r[6] for r in pts], marker="o", label=f"{k}x{n}")
            ax.plot(ms, [r[4] / r[5] for r in pts], ls="--", color=line.get_color())
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (rows of x)")
        ax.set_ylabel("bf16 time / INT4 time")
        ax.set_title("swapped kernel: one barrier per copy (solid) vs per stage (dashed)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
