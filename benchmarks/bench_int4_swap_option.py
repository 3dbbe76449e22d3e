"""The table's configs on the swapped wgmma kernel with one keyword of ``int4_wgmma_swap`` set
to each of two values, A and B alternated in one process (bench_int4_gemm.py's harness:
CUDA-graph replays over weight copies that exceed L2, median time per call), beside bf16
cuBLAS, on the engine's word order. For a launch option of the kernel: whether it pays, and
where.

    python3 benchmarks/bench_int4_swap_option.py --option vector_store [--values 0,1] \
        [--shapes 4096x6144,...] [--rows 16,64,256] [--rounds 3] [--plot option.png]

The table's config for each case goes through ``int4_gemm`` as the engine's calls do
(padding, the weight's descriptors); only the kernel's keyword differs. Rows where the table
runs another kernel are listed as such. Each output is checked against the reference, and
the two values' outputs against each other (``equal``: bitwise). Both values are forced,
also for a keyword the table's config sets (then A or B is what the table runs); not for the
tiling or ``specialized``, which the launcher passes by position. A keyword that is also a
field of ``Int4GemmConfig`` is timed only where the table's config takes both values (its
own checks: ``thread_release`` needs the warp-specialized form, say).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import SHAPES, Peers, describe, graph_time_us, plot_pairs  # noqa: E402
from tqdm import tqdm  # noqa: E402

from kernels import int4_gemm as G  # noqa: E402
from kernels.int4_gemm_config import choose_config  # noqa: E402

ORIGINAL = G.int4_wgmma_swap


def takes(cfg, name: str, values) -> bool:
    """Whether ``cfg`` takes each of ``values`` for ``name``, by ``Int4GemmConfig``'s own
    checks (True for a keyword of the launcher that is not a config field)."""
    if name not in {f.name for f in dataclasses.fields(cfg)}:
        return True
    try:
        for v in values:
            dataclasses.replace(cfg, **{name: v})
    except ValueError:
        return False
    return True


def with_option(name: str, value) -> None:
    """The table's launcher with the swapped kernel's keyword ``name`` set to ``value``, over
    what the table's config passes for it (``vector_store``, ``maxnreg``)."""

    def launch(*args, **kwargs):
        return ORIGINAL(*args, **{**kwargs, name: value})

    G.int4_wgmma_swap = launch


def parse_value(text: str):
    """``0``/``1``/``true``/``false`` as bools, other integers as ints."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    value = int(low)
    return bool(value) if value in (0, 1) else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--option", required=True, help="a keyword of int4_wgmma_swap")
    parser.add_argument("--values", default="0,1", help="A,B (0/1 are False/True)")
    parser.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    parser.add_argument("--rows", default="16,32,64,128,256,512")
    parser.add_argument("--rounds", type=int, default=3, help="A/B pairs per case")
    parser.add_argument("--plot", default=None, help="a PNG of bf16 / ours by M, A and B")
    args = parser.parse_args()
    values = [parse_value(v) for v in args.values.split(",")]
    if len(values) != 2:
        raise SystemExit(f"--values takes two values, A,B; got {args.values!r}")
    a, b = values
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
            if not (cfg.strategy == "wgmma" and cfg.swap and takes(cfg, args.option, (a, b))):
                table.append((k, n, m, cfg, None, None, None, None, None))
                continue
            ref = G.int4_gemm_ref(x, w0).float()
            outs, times = {}, {a: [], b: []}
            for v in (a, b):
                with_option(args.option, v)
                outs[v] = G.int4_gemm(x, w0, config=cfg)
            err = max(((o.float() - ref).norm() / ref.norm()).item() for o in outs.values())
            equal = torch.equal(outs[a], outs[b])
            t_bf16 = peers.time_bf16(x)
            for _ in range(args.rounds):
                for v in (a, b):
                    with_option(args.option, v)
                    times[v].append(
                        graph_time_us(
                            lambda i, x=x, w=peers.int4, c=cfg: G.int4_gemm(x, w[i], config=c),
                            peers.num_int4,
                        )
                    )
            G.int4_wgmma_swap = ORIGINAL
            ta, tb = statistics.median(times[a]), statistics.median(times[b])
            table.append((k, n, m, cfg, t_bf16, ta, tb, err, equal))
        peers = w0 = None
        torch.cuda.empty_cache()
    bar.close()
    print(f"\n| K x N | M | table's form | bf16 us | {args.option}={a} us | {args.option}={b} us "
          f"| B / A | bf16 / ours (A, B) | worst rel. error | equal |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k, n, m, cfg, t_bf16, ta, tb, err, equal in table:
        form = describe(cfg)
        if ta is None:
            why = "the option does not apply" if cfg.swap else "not the swapped kernel"
            print(f"| {k} x {n} | {m} | {form} ({why}) | | | | | | | |")
            continue
        print(f"| {k} x {n} | {m} | {form} | {t_bf16:.1f} | {ta:.1f} | {tb:.1f} | "
              f"{tb / ta:.3f} | {t_bf16 / ta:.2f}x, {t_bf16 / tb:.2f}x | {err:.1e} | "
              f"{'yes' if equal else 'no'} |")  # fmt: skip
    if args.plot:
        curves = {}
        for k, n in shapes:
            pts = [r for r in table if r[0] == k and r[1] == n and r[5] is not None]
            if pts:
                curves[f"{k}x{n}"] = ([r[2] for r in pts], [r[4] / r[6] for r in pts],
                                      [r[4] / r[5] for r in pts])  # fmt: skip
        title = f"swapped kernel: {args.option}={b} (solid) against {a} (dashed)"
        plot_pairs(args.plot, curves, title)


if __name__ == "__main__":
    main()
