"""Above M = 256: the four forms the table's cost model picks from (``_large_config``:
the swapped kernel at 128 x 64 (plain, two per multiprocessor), at 256 x 128 or 256 x 64
(warp-specialized, one per multiprocessor), or dequantize + cuBLAS), each timed beside bf16
cuBLAS on the engine's word order (bench_int4_gemm.py's harness: CUDA-graph replays over weight
copies that exceed L2, median per call), and the table's config (at M <= 256 another form),
with the fastest marked. For refitting the model when a kernel option changes the swapped
kernel's speed.

    python3 benchmarks/bench_int4_large.py [--shapes 4096x6144,...] \
        [--rows 256,384,512,768,1024,2048] [--forms 128x64,256x128,256x128/2,dequant] \
        [--plot large.png]

Each output is checked against the reference (worst relative error of the forms). ``/S``
splits K into S programs per tile, reduced in slots (the table's split-K form).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import GROUP, SHAPES, shape_rows  # noqa: E402

from kernels import int4_gemm_config as C  # noqa: E402

FORMS = "128x64,256x128,256x64,dequant"


def form(name: str, frag: bool) -> C.Int4GemmConfig:
    """A form by name: ``dequant``, or the swapped kernel's tiling ``ROWSxCOLS`` (x rows by
    weight rows: 128x64 plain, 256x128 and 256x64 warp-specialized, the table's configs
    above M = 256 and at 128 < M <= 256) with ``/S`` for S splits of K (slots), and a
    trailing ``t`` on a warp-specialized one for ``thread_release`` (ring slots released by
    each warp through named barriers)."""
    if name == "dequant":
        return C.Int4GemmConfig("dequant")
    release = name.endswith("t")
    tiling, _, split = name.removesuffix("t").partition("/")
    base = {
        "128x64": C._plain_128x64(frag),
        "256x128": C._LARGE_WIDE,
        "256x64": C._NARROW_256,
    }.get(tiling)
    if base is None:
        raise SystemExit(f"unknown form {name!r}: dequant, 128x64, 256x128 or 256x64[/splits][t]")
    try:  # the config refuses what the kernel does not take (thread_release: specialized only)
        return dataclasses.replace(base, split_k=int(split or 1), thread_release=release)
    except ValueError as err:
        raise SystemExit(f"form {name!r}: {err}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    parser.add_argument("--rows", default="256,384,512,768,1024,2048")
    parser.add_argument("--forms", default=FORMS, help="dequant, 128x64, 256x128, 256x64[/S][t]")
    parser.add_argument("--plot", default=None, help="a PNG of bf16 / INT4 by M, each form")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = [int(v) for v in args.rows.split(",")]
    table = []
    for k, n, m, peers, _ in shape_rows(shapes, rows):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        frag = peers.int4[0].frag
        candidates = {v: form(v, frag) for v in args.forms.split(",")}
        candidates["table"] = C.choose_config(m, n, k, GROUP, x.device, frag=frag)
        times, err = {}, 0.0
        for name, cfg in candidates.items():
            err = max(err, peers.check(x, cfg))
            times[name] = peers.time_ours(x, cfg)
        picked = next(v for v, cfg in candidates.items() if cfg == candidates["table"])
        table.append((k, n, m, peers.time_bf16(x), times, picked, err))
    names = [*args.forms.split(","), "table"]
    head = " | ".join(f"{v} us" for v in names)
    print(
        f"\n| K x N | M | bf16 us | {head} | table's form | fastest | table / fastest "
        "| bf16 / table | worst rel. error |"
    )
    print("|---|---|---|" + "---|" * len(names) + "---|---|---|---|---|")
    for k, n, m, t_bf16, times, picked, err in table:
        best = min(times, key=times.get)
        cells = " | ".join(f"{times[v]:.1f}" for v in names)
        print(f"| {k} x {n} | {m} | {t_bf16:.1f} | {cells} | {picked} | {best} | "
              f"{times[picked] / times[best]:.3f} | {t_bf16 / times[picked]:.2f}x | "
              f"{err:.1e} |")  # fmt: skip
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(shapes), figsize=(4 * len(shapes), 3.5), squeeze=False)
        for ax, (k, n) in zip(axes[0], shapes, strict=True):
            pts = [r for r in table if r[0] == k and r[1] == n]
            for v in names:
                ax.plot([r[2] for r in pts], [r[3] / r[4][v] for r in pts], marker="o", label=v)
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{k} x {n}")
            ax.set_xlabel("M")
        axes[0][0].set_ylabel("bf16 time / INT4 time")
        axes[0][0].legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
