"""A form's fixed cost per call and its cost per K tile: the table's config for one weight width
N and one M (chosen at ``--base-k``), or it with fields changed, timed at several K with the
grid unchanged, in bench_int4_gemm.py's harness (CUDA-graph replays over weight copies that
exceed L2, median time per call), beside bf16 cuBLAS, on the engine's word order. A
least-squares line through the times, time = F + t x tiles, where tiles are the K tiles of
one program (K over ``block_k`` times ``split_k``): F is what a call costs whatever its K
(launch, the ring's fill, the epilogue, split-K's slots and ticket, the waves' tails), t what
each K tile of a program adds.

    python3 benchmarks/bench_int4_fixed_cost.py [--n 4096] [--rows 64,128] \
        [--ks 1024,2048,4096,8192,16384] [--base-k 4096] \
        [--forms "table;split_k=1;split_k=2;specialized=1,pipe=1,pdl=0,weights_first=0"] \
        [--plot fixed_cost.png]

The point (thirty-ninth session): at M = 64-128 the table's split-K forms spend about half
their time in costs that do not scale with K, read only indirectly from the grid's times;
this measures them. A form is ``table`` or comma-separated ``field=value`` changes of the
table's config (fields of ``Int4GemmConfig``; 0/1 for flags, ``none`` for no ``maxnreg``).
Held fixed across K, a form keeps its grid, so F and t of two forms compare directly. Each
output is checked against the reference. First run in the fortieth session, on an H100
(BENCHMARKS.md, "INT4 GEMM": split-K's F is 1.1-5.5 us above the unsplit form's).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import GROUP, Peers, config_changes, describe  # noqa: E402
from tqdm import tqdm  # noqa: E402

from kernels.int4_gemm_config import Int4GemmConfig, choose_config  # noqa: E402


def parse_form(text: str) -> dict:
    """``table`` -> {}; else ``FIELD=VALUE,...`` changes of the table's config
    (``config_changes``)."""
    text = text.strip()
    return {} if text == "table" else config_changes(text, "form")


def tiles_per_program(cfg: Int4GemmConfig, k: int) -> int:
    """K tiles of one program: K over ``block_k`` x ``split_k``, rounded up."""
    return math.ceil(k / (cfg.block_k * cfg.split_k))


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = f + t x: (f, t, the largest residual)."""
    t, f = statistics.linear_regression(xs, ys)
    return f, t, max(abs(y - (f + t * x)) for x, y in zip(xs, ys, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="4096", help="weight rows (N), comma-separated")
    parser.add_argument("--rows", default="64,128", help="M, comma-separated")
    parser.add_argument("--ks", default="1024,2048,4096,8192,16384")
    parser.add_argument("--base-k", type=int, default=4096, help="K the table's config is for")
    parser.add_argument(
        "--forms",
        default="table;split_k=1;split_k=2",
        help="';'-separated: table, or FIELD=VALUE,... changes of the table's config",
    )
    parser.add_argument("--plot", default=None, help="a PNG of time by K tiles per program")
    args = parser.parse_args()
    widths = [int(v) for v in args.n.split(",")]
    rows = [int(v) for v in args.rows.split(",")]
    ks = sorted({int(v) for v in args.ks.split(",")})
    if len(ks) < 2:
        raise SystemExit(f"--ks needs two or more values of K for a line, got {args.ks!r}")
    forms = [f.strip() for f in args.forms.split(";") if f.strip()]
    changes = {f: parse_form(f) for f in forms}
    device = torch.device("cuda")

    # times[(n, m, form)] = [(K, tiles, us)], bf16[(n, m, K)] = us
    times: dict[tuple[int, int, str], list[tuple[int, int, float]]] = {}
    configs: dict[tuple[int, int, str], Int4GemmConfig] = {}
    bf16: dict[tuple[int, int, int], float] = {}
    worst = 0.0
    for n, k in tqdm([(n, k) for n in widths for k in ks], desc="weights"):
        peers = Peers(k, n, with_torch=False)
        frag = peers.int4[0].frag
        for m in rows:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            bf16[n, m, k] = peers.time_bf16(x)
            base = choose_config(m, n, args.base_k, GROUP, device, frag=frag)
            for form in forms:
                try:
                    cfg = dataclasses.replace(base, **changes[form])
                except ValueError as err:
                    raise SystemExit(f"form {form!r} on {base}: {err}") from None
                configs[n, m, form] = cfg
                worst = max(worst, peers.check(x, cfg))
                us = peers.time_ours(x, cfg)
                times.setdefault((n, m, form), []).append((k, tiles_per_program(cfg, k), us))
        del peers
        torch.cuda.empty_cache()

    print(f"\nK = {', '.join(map(str, ks))}; worst relative error {worst:.1e}")
    print("\n| N | M | form | config | us by K | bf16 us by K | F us | t us per tile | "
          "largest residual us |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    fits = {}
    for (n, m, form), pts in times.items():
        cfg = configs[n, m, form]
        f, t, res = fit_line([p[1] for p in pts], [p[2] for p in pts])
        fits[n, m, form] = (f, t)
        ours = " / ".join(f"{p[2]:.1f}" for p in pts)
        peer = " / ".join(f"{bf16[n, m, k]:.1f}" for k in ks)
        print(f"| {n} | {m} | {form} | {describe(cfg)} | {ours} | {peer} | {f:.2f} | {t:.3f} | "
              f"{res:.2f} |")  # fmt: skip

    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for (n, m, form), pts in times.items():
            f, t = fits[n, m, form]
            xs = [p[1] for p in pts]
            (line,) = ax.plot(xs, [p[2] for p in pts], marker="o", ls="",
                              label=f"N={n} M={m} {form}")  # fmt: skip
            ax.plot([0, max(xs)], [f, f + t * max(xs)], color=line.get_color(), lw=0.8)
        ax.set_xlabel("K tiles per program")
        ax.set_ylabel("us per call")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.set_title("INT4 GEMM: fixed cost (intercept) and cost per K tile (slope)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
