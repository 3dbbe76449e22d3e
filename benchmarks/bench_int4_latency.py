"""The table's register mma configs at small M beside the same configs with their loads issued
earlier, in the harness of bench_int4_gemm.py (CUDA-graph replays over weight copies that
exceed L2, median time per call), one run:

    python3 benchmarks/bench_int4_latency.py [--rows 1,8,16,32] [--shapes 4096x6144,...]

In the shipped kernels each warp waits on DRAM about once per K tile: its next tile's words
are loaded one tile ahead, into registers, and (where the decode does not apply them) its
tile's scales and offsets only after the tile's products, right before they are used (the
offline sm_90 SASS of the M <= 8 form has the scale loads about 25 instructions before their
FFMAs). The variants, each on the table's config for that shape and M:

- ``s_ahead``: the scales and offsets loaded with the words, a tile ahead;
- ``ring N``: the words copied into x's shared ring (``w_ring``, ``cp.async``) N = 1-3 tiles
  ahead (x's copies then N ahead too), with ``s_ahead`` where it applies;
All of them on words in ``tile_order`` (each 16 rows x 128 K one 1 KB run), as the engine
holds them (``device_form``); ``table, rows`` is the table's config on row-major fragment
order, as the engine held them before the twenty-third session.

Every output is checked against the reference (relative error printed). Reading: if the
variants are much faster, the M <= 32 kernels are bound by each warp's chain of DRAM round
trips, not by the bytes; if not, by something else (issue slots, the per-tile barrier).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import SHAPES, Peers, graph_time_us  # noqa: E402
from tqdm import tqdm  # noqa: E402

from kernels.int4_gemm import choose_config, int4_gemm, int4_gemm_ref, mma_kwargs  # noqa: E402
from kernels.int4_mma import int4_mma, to_mma  # noqa: E402


def variants(cfg) -> dict:
    """name -> config for the table's mma config ``cfg``: itself, ``s_ahead`` (where the
    decode does not apply the scales) and ``ring 1-3`` (where x goes through shared memory)."""
    out = {"table": cfg}
    ahead = {} if cfg.scaled else {"s_ahead": True}
    if ahead:
        out["s_ahead"] = dataclasses.replace(cfg, **ahead)
    if cfg.x_smem:
        for depth in (1, 2, 3):
            out[f"ring {depth}"] = dataclasses.replace(cfg, w_ring=True, num_stages=depth, **ahead)
    return out


def run_shape(k: int, n: int, rows: list[int]) -> list[tuple]:
    """(K, N, M, bf16 us, int4_gemm us, {variant: us}) for every M the table runs on the mma
    kernel; prints each M's line as it goes."""
    peers = Peers(k, n, with_torch=False)
    views = {t: [to_mma(w, contiguous_x=False, tiled=t) for w in peers.int4] for t in (False, True)}
    found = []
    for m in tqdm(rows, desc=f"{k}x{n}", leave=False):
        cfg = choose_config(m, n, k, 128, torch.device("cuda"), frag=True)
        if cfg.strategy != "mma":
            print(f"{k}x{n} M={m}: the table runs {cfg.strategy}, not the mma kernel")
            continue
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = int4_gemm_ref(x, peers.int4[0]).float()
        t_bf16 = peers.time_bf16(x)
        t_gemm = graph_time_us(lambda i, x=x: int4_gemm(x, peers.int4[i]), peers.num_int4)
        times, errors = {}, []

        def run(name, c, tiled, x=x, ref=ref, times=times, errors=errors):
            kw = mma_kwargs(c)
            w = views[tiled]
            out = int4_mma(x, w[0], **kw).float()
            errors.append(((out - ref).norm() / ref.norm()).item())
            times[name] = graph_time_us(lambda i: int4_mma(x, w[i], **kw), peers.num_int4)

        for name, c in variants(cfg).items():  # in tile order, as the engine holds them
            run(name, c, True)
        run("table, rows", cfg, False)  # row-major, as the engine held them before
        line = ", ".join(f"{name} {t:.1f}" for name, t in times.items())
        print(f"\n{k}x{n} M={m}: bf16 {t_bf16:.1f} us, int4_gemm {t_gemm:.1f}; {line} "
              f"(worst rel. error {max(errors):.1e})")  # fmt: skip
        found.append((k, n, m, t_bf16, t_gemm, times))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES[:2] + SHAPES[3:])
    )
    parser.add_argument("--rows", default="1,8,16,32")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    table = []
    for k, n in tqdm(shapes, desc="shapes"):
        table += run_shape(k, n, rows)
        torch.cuda.empty_cache()
    names = []
    for *_, times in table:
        names += [v for v in times if v not in names]
    print("\n| K x N | M | bf16 | int4_gemm | " + " | ".join(names) + " | bf16 / best |")
    print("|---|---|---|---|" + "---|" * len(names) + "---|")
    for k, n, m, t_bf16, t_gemm, times in table:
        cells = " | ".join(f"{times[v]:.1f}" if v in times else "" for v in names)
        print(f"| {k} x {n} | {m} | {t_bf16:.1f} | {t_gemm:.1f} | {cells} | "
              f"{t_bf16 / min(times.values()):.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
