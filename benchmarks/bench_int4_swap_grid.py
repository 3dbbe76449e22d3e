"""The table's swapped wgmma config at one M with its grid and ring varied (split-K, ring
stages, register cap, warp specialization, two wgmmas in flight, weight rows per program,
the weight's first tiles issued before the wait on the previous kernel, a second warpgroup
over the later half of K, x rows per program, ring slots released through named barriers),
in the harness of bench_int4_gemm.py (CUDA-graph replays over weight copies that exceed L2,
median time per call), beside bf16 cuBLAS, on the engine's word order.

    python3 benchmarks/bench_int4_swap_grid.py [--shapes 4096x6144,...] [--rows 32,64] \
        [--splits 1,2,4] [--stages 2,3,4] [--caps 0,168] [--block-n 64,128] [--warps 4,8] \
        [--wsplit 0,1] [--block-m 32,64] [--release 0,1]
    for i in 0 1 2 3; do python3 benchmarks/bench_int4_swap_grid.py ARGS --compile-only $i/4 & \
        done; wait; python3 benchmarks/bench_int4_swap_grid.py ARGS   # compiled in parallel

Where the table runs another kernel at that M (the register mma kernel), the base is the
swapped kernel's own tiling for it (``_narrow_swap`` / ``_wide_swap``). The point of the
axes: the table's grids at M = 32-64 leave multiprocessors idle or run one 4-warp program
per multiprocessor (qkv at M = 64: 96 programs of 64 weight rows on 132 multiprocessors,
registers capped at 200, so two programs cannot share one); a split of 4 with 3 stages and at
most 168 registers runs three programs of a fuller grid on every multiprocessor. Each output
is checked against the reference.

``--mma`` varies the register mma kernel's form instead (``kernels/int4_mma.py``; x through
shared memory, warps over K): split-K, weight rows per program, warps over rows per K range,
warps, register cap, the scales in the decode, the words in x's ring, the scales a tile
ahead. Its base is the table's config where that is the mma kernel, else the table's M = 9-16
form of qkv-sized weights; with ``--from-m1`` the table's M = 1 form of the weight with 16 rows
of x (the point: whether M = 9-16 can run as M = 1 does, at M = 1's speed).

    python3 benchmarks/bench_int4_swap_grid.py --mma [--from-m1] --rows 12,16 --splits 1,2,4 \
        --block-n 16,32 --warps 4,8 --caps 0,128 [--row-warps 1,2] [--scaled 0,1] \
        [--w-ring 0,1] [--s-ahead 0,1]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import SHAPES, Peers, graph_time_us  # noqa: E402
from tqdm import tqdm  # noqa: E402
from triton.runtime.errors import OutOfResources, PTXASError  # noqa: E402

from kernels.int4_gemm import _launch, int4_gemm_ref  # noqa: E402
from kernels.int4_gemm_config import (  # noqa: E402
    Int4GemmConfig,
    _narrow_swap,
    _wide_swap,
    choose_config,
)


def base_config(m: int, n: int, k: int, group: int, device) -> Int4GemmConfig:
    """The table's config if it is the swapped wgmma kernel, else that kernel's own tiling."""
    cfg = choose_config(m, n, k, group, device, frag=True)
    if cfg.strategy == "wgmma" and cfg.swap:
        return cfg
    return _narrow_swap(m, n, k, frag=True) if n <= 8192 else _wide_swap(m, frag=True)


def mma_base(m: int, n: int, k: int, group: int, device, from_m1: bool) -> Int4GemmConfig:
    """``--mma``: the table's config if it is the mma kernel, else the table's M = 9-16 form of
    qkv-sized weights (``SHAPES[0]``; 8 rows of x up to M = 8); ``from_m1``: the table's M = 1
    form of this weight with 16 rows of x."""
    if from_m1:
        return dataclasses.replace(choose_config(1, n, k, group, device, frag=True), block_m=16)
    cfg = choose_config(m, n, k, group, device, frag=True)
    if cfg.strategy == "mma":
        return cfg
    qkv_k, qkv_n = SHAPES[0]
    qkv16 = choose_config(16, qkv_n, qkv_k, group, device, frag=True)
    return dataclasses.replace(qkv16, block_m=8 if m <= 8 else 16)


def _add(out: list[Int4GemmConfig], base: Int4GemmConfig, **changes) -> None:
    """Append ``base`` with ``changes`` to ``out`` unless that config is already there or is
    one the kernel does not take (``Int4GemmConfig`` raises ValueError)."""
    try:
        cfg = dataclasses.replace(base, **changes)
    except ValueError:
        return
    if cfg not in out:
        out.append(cfg)


def mma_variants(base: Int4GemmConfig, args) -> list[Int4GemmConfig]:
    """``--mma``: every valid combination of the mma axes, the base first; row warps, warps,
    the scaled decode, words in x's ring and scales ahead keep the base's value where not
    given (split-K, weight rows and caps have the defaults of the swapped axes)."""
    keep = lambda values, name: values or [getattr(base, name)]  # noqa: E731
    out = [base]
    for split, block_n, row_warps, warps, cap, scaled, w_ring, s_ahead in itertools.product(
        args.splits,
        args.block_n,
        keep(args.row_warps, "row_warps"),
        keep(args.warps, "num_warps"),
        args.caps,
        keep(args.scaled, "scaled"),
        keep(args.w_ring, "w_ring"),
        keep(args.s_ahead, "s_ahead"),
    ):
        _add(
            out, base, split_k=split, block_n=block_n, row_warps=row_warps, num_warps=warps,
            maxnreg=cap or None, scaled=bool(scaled), w_ring=bool(w_ring), s_ahead=bool(s_ahead),
        )  # fmt: skip
    return out


def variants(base: Int4GemmConfig, args) -> list[Int4GemmConfig]:
    """Every valid combination of the axes, the base first."""
    if args.mma:
        return mma_variants(base, args)
    out = [base]
    for (split, stages, cap, spec, pipe, block_n, first, warps, wsplit, rows,
         release) in itertools.product(
        args.splits,
        args.stages,
        args.caps,
        (False, True),
        (False, True),
        args.block_n,
        (False, True),
        args.warps or [0],
        args.wsplit,
        args.block_m or [base.block_m],
        args.release or [int(base.thread_release)],
    ):  # fmt: skip
        if not warps:  # the old rule: two warpgroups for 128 weight rows at M >= 64
            warps = 8 if block_n == 128 and rows >= 64 else 4
        if first and spec:  # weights_first is the plain form's
            continue
        if block_n < 16 * warps:  # every warp holds at least one 16-row tile
            continue
        # (not taken: pipe with fewer than 3 stages; wsplit where it does not apply)
        _add(
            out, base, split_k=split, num_stages=stages, maxnreg=cap or None, specialized=spec,
            pipe=pipe, block_n=block_n, num_warps=warps, weights_first=first,
            pdl=first or (base.pdl and not base.weights_first), wsplit=bool(wsplit),
            block_m=rows, thread_release=bool(release),
        )  # fmt: skip
    return out


def short(cfg: Int4GemmConfig, base: Int4GemmConfig) -> str:
    """The fields where ``cfg`` differs from ``base``."""
    diff = {
        f.name: getattr(cfg, f.name)
        for f in dataclasses.fields(cfg)
        if getattr(cfg, f.name) != getattr(base, f.name)
    }
    return ", ".join(f"{a}={v}" for a, v in diff.items()) or "the base"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    parser.add_argument("--rows", default="32,64")
    parser.add_argument("--splits", default="1,2,4")
    parser.add_argument("--stages", default="2,3,4")
    parser.add_argument("--caps", default="0,168")
    parser.add_argument("--block-n", default="64,128")
    parser.add_argument("--block-m", default="", help="x rows per program; default: the base's")
    parser.add_argument(
        "--warps",
        default="",
        help="warps per program (4, 8); default: 8 for 128 weight rows at M >= 64, else 4",
    )
    parser.add_argument(
        "--wsplit",
        default="0",
        help="0,1: a second warpgroup over the later half of each program's K tiles (1)",
    )
    parser.add_argument(
        "--release", default="", help="0,1: thread_release (warp-specialized forms only)"
    )
    parser.add_argument("--mma", action="store_true", help="vary the register mma kernel")
    parser.add_argument(
        "--from-m1", action="store_true", help="--mma: the table's M = 1 form as the base"
    )
    parser.add_argument("--row-warps", default="", help="--mma: warps over rows per K range")
    parser.add_argument("--scaled", default="", help="--mma: 0,1: the scales in the decode")
    parser.add_argument("--w-ring", default="", help="--mma: 0,1: the words in x's ring")
    parser.add_argument("--s-ahead", default="", help="--mma: 0,1: the scales a tile ahead")
    parser.add_argument("--top", type=int, default=4)
    parser.add_argument("--compile-only", default=None, help="I/N: every N-th variant, untimed")
    args = parser.parse_args()
    ints = lambda s: [int(v) for v in s.split(",")]  # noqa: E731
    args.splits, args.stages, args.caps, args.block_n = map(
        ints, (args.splits, args.stages, args.caps, args.block_n)
    )
    args.warps = ints(args.warps) if args.warps else []
    args.block_m = ints(args.block_m) if args.block_m else []
    args.wsplit = ints(args.wsplit)
    for name in ("row_warps", "scaled", "w_ring", "s_ahead", "release"):
        setattr(args, name, ints(getattr(args, name)) if getattr(args, name) else [])
    shard = tuple(ints(args.compile_only.replace("/", ","))) if args.compile_only else None
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    kind = "mma" if args.mma else "swapped"
    table = []
    for k, n in shapes:
        peers = Peers(k, n, with_torch=False)
        w0 = peers.int4[0]
        for m in ints(args.rows):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            if args.mma:
                base = mma_base(m, n, k, w0.group_size, x.device, args.from_m1)
            else:
                base = base_config(m, n, k, w0.group_size, x.device)
            cands = variants(base, args)
            if shard is not None:
                for cfg in cands[shard[0] :: shard[1]]:
                    try:
                        _launch(x, w0, cfg)
                    except Exception:  # noqa: BLE001 - the timed run reports it
                        pass
                torch.cuda.synchronize()
                continue
            ref = int4_gemm_ref(x, w0).float()
            t_bf16 = peers.time_bf16(x)
            table_cfg = choose_config(m, n, k, w0.group_size, x.device, frag=True)
            t_table = graph_time_us(lambda i, x=x, w=peers.int4, c=table_cfg: _launch(x, w[i], c),
                                    peers.num_int4)  # fmt: skip
            results = []
            for cfg in tqdm(cands, desc=f"{k}x{n} M={m}", leave=False):
                try:
                    out = _launch(x, w0, cfg).float()
                except (PTXASError, OutOfResources):
                    continue
                except Exception as exc:  # noqa: BLE001 - a variant that fails is reported
                    print(f"  {short(cfg, base)} failed: {type(exc).__name__}: {exc}"[:300])
                    continue
                err = ((out - ref).norm() / ref.norm()).item()
                t = graph_time_us(lambda i, c=cfg, x=x, w=peers.int4: _launch(x, w[i], c),
                                  peers.num_int4)  # fmt: skip
                results.append((t, err, cfg))
            t_base = next(t for t, _, c in results if c == base)
            results.sort(key=lambda r: r[0])
            print(f"\n{k}x{n} M={m}: bf16 {t_bf16:.1f} us, table {t_table:.1f} us, {kind} "
                  f"base {t_base:.1f} us: {base}")  # fmt: skip
            for t, err, cfg in results[: args.top]:
                print(f"  {t:.1f} us ({t_bf16 / t:.2f}x of bf16) err {err:.1e}: {short(cfg, base)}")
            worst = max(e for _, e, _ in results)
            best_t, _, best = results[0]
            table.append((k, n, m, t_bf16, t_table, t_base, best_t, worst, short(best, base)))
        peers = w0 = None  # the copies go before the next shape's
        torch.cuda.empty_cache()
    if shard is not None:
        return
    print(f"\n| K x N | M | bf16 us | table us | {kind} base us | best us | bf16 / best | "
          "worst rel. error | best: its change from the base |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for k, n, m, t_bf16, t_table, t_base, best_t, worst, desc in table:
        print(f"| {k} x {n} | {m} | {t_bf16:.1f} | {t_table:.1f} | {t_base:.1f} | {best_t:.1f} | "
              f"{t_bf16 / best_t:.2f}x | {worst:.1e} | {desc} |")  # fmt: skip


if __name__ == "__main__":
    main()
