"""The register mma INT4 kernel (``kernels/int4_mma.py``) at small M beside bf16 cuBLAS and the
table's kernels, in the harness of bench_int4_gemm.py (CUDA-graph replays over weight copies
that exceed L2, median time per call).

    python3 benchmarks/bench_int4_mma.py [--shapes 4096x4096,...] [--rows 1,16,32]
    python3 benchmarks/bench_int4_mma.py --frag --rows 1    # fragment-ordered words in place
    python3 benchmarks/bench_int4_mma.py --frag --row-tiles 1,2,4 --launch pdl --rows 1,16
    python3 benchmarks/bench_int4_mma.py --frag --x-smem --row-tiles 1,2,4 --launch pdl
    python3 benchmarks/bench_int4_mma.py --frag --x-smem --row-warps 1,2,4,8 --x-stages 2 \
        --launch pdl --rows 8,16,32
    python3 benchmarks/bench_int4_mma.py --frag --x-smem --launch pdl,first --rows 1,8,16
    python3 benchmarks/bench_int4_mma.py --parts --rows 1 [--pdl]   # where the time goes
    python3 benchmarks/bench_int4_mma.py --frag --x-smem --launch first --tiled 0,1 --rows 1,8
        # words in tile_order (each 16 rows x 128 K one 1 KB run) against row-major
    for i in 0 1 2; do python3 benchmarks/bench_int4_mma.py ARGS --compile-only $i/3 & done; \
        wait; python3 benchmarks/bench_int4_mma.py ARGS   # compiled in parallel, then timed

``--parts`` times, per split-K count, the kernel whole, without its split-K reduction (each
split stores its partial over the others': ``int4_mma(..., parts=1)``) and without its math
too (``parts=2``: the words are loaded and summed), beside the read floor of
bench_int4_small_m.py (a plain streaming read of the same words) and bf16.

For every shape and M it times each candidate config of ``int4_mma`` (warps per program,
split-K, words in flight, dependent launch; x rows per program 8 for M <= 8, else 16), checks
each one's output against the reference, and prints the best few beside bf16 and the table
(``int4_gemm`` with its own config on the engine's word order, which since this kernel went
into the table is fragment order on Hopper), with the ratios to bf16.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import SHAPES, Peers, graph_time_us  # noqa: E402
from tqdm import tqdm  # noqa: E402

from kernels.int4_gemm import int4_gemm, int4_gemm_ref  # noqa: E402
from kernels.int4_mma import int4_mma, to_mma  # noqa: E402

# --launch: plain launches, programmatic dependents that wait on entry, and dependents that
# issue their first words before they wait (``weights_first``)
LAUNCHES = {
    "plain": dict(pdl=False),
    "pdl": dict(pdl=True),
    "first": dict(pdl=True, weights_first=True),
}


def candidates(
    m: int,
    short: bool = False,
    row_tiles: tuple[int, ...] = (1,),
    pdl=(dict(pdl=False), dict(pdl=True)),
    x_smem: bool = False,
    warps: tuple[int, ...] = (8, 16),
    x_stages: tuple[int, ...] = (2, 3),
    row_warps: tuple[int, ...] = (1,),
    maxnreg: tuple[int, ...] = (0,),
    scaled: tuple[bool, ...] = (False,),
    depths: tuple[int, ...] = (1, 2),
    s_ahead: tuple[bool, ...] = (False,),
    w_ring: tuple[bool, ...] = (False,),
) -> list[dict]:
    """Warps over rows (1-8 warps, split-K 1-16) or over K (``wsplit``: 2-16 warps, split-K
    1-4), 1 or 2 tiles ahead, each of the launches in ``pdl`` (``LAUNCHES``' values), each
    with every count of 16-row tiles per warp in ``row_tiles`` and every register cap per
    thread in ``maxnreg`` (0: no cap); ``short``: warps over K only, 4-16 of them, split-K 1
    or 2; ``x_smem``: warps over K with x through shared memory, ``warps`` of them in K
    groups of each of ``row_warps`` warps over rows, the decode applying the scales or not
    (``scaled``), ``x_stages`` tiles in its ring, 32 rows of x per program as well from M =
    32 (and 64 from M = 64, 8 warps: 16 spill)."""
    block_m = 8 if m <= 8 else 16
    # the axes both lists share: words in flight, launch, row tiles per warp, register cap
    common = [
        dict(depth=d, row_tiles=r, maxnreg=mr or None, s_ahead=sa, **p)
        for d in depths
        for sa in s_ahead
        for p in pdl
        for r in row_tiles
        for mr in maxnreg
    ]
    if x_smem:  # warps over K, x through shared memory: 2 or 3 tiles in its ring
        sizes = (block_m,) + ((32,) if m >= 32 else ()) + ((64,) if m >= 64 else ())
        return [
            dict(
                block_m=bm,
                num_warps=w,
                split_k=s,
                wsplit=True,
                x_smem=True,
                x_stages=xs,
                row_warps=rw,
                scaled=sc,
                w_ring=wr,
                **c,
            )  # fmt: skip
            for bm in sizes
            for w in warps
            for s in (1, 2)
            for c in common
            for xs in x_stages
            for rw in row_warps
            for sc in scaled
            for wr in w_ring
            if w * c["row_tiles"] <= 32
            and xs * w * bm * 256 // rw
            + w * c["row_tiles"] * bm * 64  # x ring, reduction
            + (xs * w * c["row_tiles"] * 1024 if wr else 0)  # words' ring
            <= 200 * 1024  # smem
            and (wr or xs <= 3)
            and not (wr and c["depth"] != 1)
            and w % rw == 0
            and 2 * rw <= bm
            and (bm < 64 or w * c["row_tiles"] <= 8)
        ]
    if short:
        shapes = [(w, s, True) for w in (4, 8, 16) for s in (1, 2)]
    else:
        shapes = [(w, s, False) for w in (1, 2, 4, 8) for s in (1, 2, 4, 8, 16)]
        shapes += [(w, s, True) for w in (2, 4, 8, 16) for s in (1, 2, 4)]
    return [
        dict(block_m=block_m, num_warps=w, split_k=s, wsplit=ws, **c)
        for w, s, ws in shapes
        for c in common
        if w * c["row_tiles"] <= 32  # 16 warps of 4 row tiles spill (sass_int4_mma.py)
    ]


def launch_name(cfg: dict) -> str:
    """The ``LAUNCHES`` key of a candidate's launch."""
    same = lambda v: all(cfg.get(a, False) == v.get(a, False) for a in ("pdl", "weights_first"))  # noqa: E731
    return next(name for name, v in LAUNCHES.items() if same(v))


def print_best(results: list[tuple], label: str, key) -> None:
    """The best time per value of ``key(config)`` among ``results`` (sorted, fastest first)."""
    best = {}
    for t, _, c in results:
        best.setdefault(key(c), t)
    print(f"  best per {label}: " + ", ".join(f"{v}: {t:.1f} us" for v, t in best.items()))


def distinct(cands: list[dict]) -> list[dict]:
    """``cands`` without repeats of one launch: ``s_ahead`` does nothing with ``scaled``
    (``int4_mma`` drops it there), so such a pair is kept once, as ``s_ahead=False``."""
    seen, out = set(), []
    for c in cands:
        c = dict(c, s_ahead=c.get("s_ahead", False) and not c.get("scaled", False))
        key = tuple(sorted((a, repr(v)) for a, v in c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def run_shape(
    k: int,
    n: int,
    rows: list[int],
    top: int,
    frag: bool,
    shard: tuple[int, int] | None = None,
    **space,
) -> list[tuple]:
    """Time bf16, the table and every candidate on one shape; print the best ``top`` per M.
    ``frag``: the kernel reads fragment-ordered words in place (x in 4-byte pairs) instead of
    ``mma_order``, on the short candidate list; ``space``: the sweep's axes, as
    ``candidates`` takes them. ``shard`` (i, n): only compile and run every n-th candidate
    from the i-th, untimed (``--compile-only``: several processes fill Triton's cache on
    disk at once, and the timed run that follows finds every kernel there)."""
    row_tiles, row_warps = space.get("row_tiles", (1,)), space.get("row_warps", (1,))
    peers = Peers(k, n, with_torch=False)
    tiled_axis = space.pop("tiled", (False,))
    forms = {t: [to_mma(w, contiguous_x=not frag, tiled=t) for w in peers.int4]
             for t in tiled_axis}  # fmt: skip
    ref_w = peers.int4[0]
    summary = []
    for m in rows:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        cands = distinct([dict(c, tiled=t) for c in candidates(m, frag, **space)
                          for t in tiled_axis])  # fmt: skip
        if shard is not None:
            for cfg in cands[shard[0] :: shard[1]]:
                call = {a: v for a, v in cfg.items() if a != "tiled"}
                int4_mma(x, forms[cfg["tiled"]][0], **call)
            torch.cuda.synchronize()
            continue
        ref = int4_gemm_ref(x, ref_w).float()
        t_bf16 = peers.time_bf16(x)
        t_table = graph_time_us(lambda i, x=x: int4_gemm(x, peers.int4[i]), peers.num_int4)
        results = []
        for cfg in tqdm(cands, desc=f"{k}x{n} M={m}", leave=False):
            call = {a: v for a, v in cfg.items() if a != "tiled"}
            mma = forms[cfg["tiled"]]
            out = int4_mma(x, mma[0], **call).float()
            err = ((out - ref).norm() / ref.norm()).item()
            t = graph_time_us(lambda i, c=call, x=x, w=mma: int4_mma(x, w[i], **c),
                              peers.num_int4)  # fmt: skip
            results.append((t, err, cfg))
        results.sort(key=lambda r: r[0])
        print(f"\n{k}x{n} M={m}: bf16 {t_bf16:.1f} us, table {t_table:.1f} us "
              f"({t_bf16 / t_table:.2f}x)")  # fmt: skip
        for t, err, cfg in results[:top]:
            print(f"  mma {t:.1f} us ({t_bf16 / t:.2f}x of bf16) err {err:.1e} {cfg}")
        if len(row_tiles) > 1:
            best = {r: min(t for t, _, c in results if c["row_tiles"] == r) for r in row_tiles}
            print("  best per row tiles: " + ", ".join(f"{r}: {t:.1f} us" for r, t in best.items()))
        axes = {  # label: (the values tried, a config's value)
            "scaled": (space.get("scaled", ()), lambda c: c["scaled"]),
            "(words in the ring, stages)": (
                space.get("w_ring", ()),
                lambda c: (c.get("w_ring"), c.get("x_stages")),
            ),
            "scales ahead": (space.get("s_ahead", ()), lambda c: c["s_ahead"]),
            "tile order": (tiled_axis, lambda c: c["tiled"]),
            "launch": (space.get("pdl", ()), launch_name),
            "row warps": (row_warps, lambda c: c["row_warps"]),
        }
        for label, (values, key) in axes.items():
            if len(values) > 1:
                print_best(results, label, key)
        worst = max(r[1] for r in results)
        summary.append((k, n, m, t_bf16, t_table, results[0][0], worst, results[0][2]))
    return summary


def run_parts(k: int, n: int, rows: list[int], pdl: bool) -> None:
    """Whole (split-K reduced in slots, or by fp32 atomics) / no reduction / loads only, per
    split count (depth 1)."""
    from bench_int4_small_m import read_floor

    peers = Peers(k, n, with_torch=False)
    mma = [to_mma(w) for w in peers.int4]
    floor, _, floor_cfg = read_floor(peers)
    variants = [dict(parts=0), dict(parts=0, slots=False), dict(parts=1), dict(parts=2)]
    for m in rows:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        t_bf16 = peers.time_bf16(x)
        print(f"\n{k}x{n} M={m}: bf16 {t_bf16:.1f} us, read floor {floor:.1f} us {floor_cfg}, "
              f"{'dependent launches' if pdl else 'plain launches'}")  # fmt: skip
        print("| warps | split | whole (slots) | whole (atomics) | no reduction | loads only |")
        print("|---|---|---|---|---|---|")
        for warps, wsplit in ((1, False), (4, False), (4, True), (8, True), (16, True)):
            for split in (1, 2, 4, 8, 16, 32):
                if wsplit and split > 8:
                    continue
                ts = []
                for variant in variants:
                    cfg = dict(block_m=8 if m <= 8 else 16, num_warps=warps, split_k=split,
                               depth=1, pdl=pdl, wsplit=wsplit, **variant)  # fmt: skip
                    ts.append(graph_time_us(lambda i, c=cfg, x=x: int4_mma(x, mma[i], **c),
                                            peers.num_int4))  # fmt: skip
                times = " | ".join(f"{t:.1f}" for t in ts)
                print(f"| {warps}{' over K' if wsplit else ''} | {split} | {times} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    parser.add_argument("--rows", default="1,16,32")
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--parts", action="store_true", help="where the time goes")
    parser.add_argument("--pdl", action="store_true", help="--parts: dependent launches")
    parser.add_argument("--frag", action="store_true", help="fragment-ordered words in place")
    parser.add_argument("--row-tiles", default="1", help="16-row tiles per warp to try: 1,2,4")
    parser.add_argument(
        "--launch",
        default="plain,pdl",
        help="launches to try: plain, pdl, first (pdl, weights_first)",
    )
    parser.add_argument("--x-smem", action="store_true", help="with --frag: x through smem")
    parser.add_argument("--warps", default="8,16", help="--x-smem: warps per program to try")
    parser.add_argument(
        "--x-stages", default="2,3", help="--x-smem: x ring depths to try (4: with --w-ring 1)"
    )
    parser.add_argument("--row-warps", default="1", help="--x-smem: warps over rows per K group")
    parser.add_argument("--maxnreg", default="0", help="register caps to try (0: none)")
    parser.add_argument("--scaled", default="0", help="--x-smem: 0 ones-mma, 1 scaled decode, 0,1")
    parser.add_argument("--depths", default="1,2", help="tiles of words in flight to try")
    parser.add_argument("--tiled", default="0", help="words in tile_order: 0, 1 or 0,1")
    parser.add_argument("--s-ahead", default="0", help="scales loaded a tile ahead: 0, 1, 0,1")
    parser.add_argument("--w-ring", default="0", help="--x-smem: words in x's ring: 0, 1, 0,1")
    parser.add_argument(
        "--compile-only",
        metavar="I/N",
        help="compile and run every N-th candidate from the I-th, untimed, to fill Triton's "
        "cache for a timed run (start N such processes at once)",
    )
    args = parser.parse_args()
    ints = lambda text: tuple(int(v) for v in text.split(","))  # noqa: E731
    space = dict(
        row_tiles=ints(args.row_tiles),
        pdl=tuple(LAUNCHES[v] for v in args.launch.split(",")),
        x_smem=args.x_smem,
        warps=ints(args.warps),
        x_stages=ints(args.x_stages),
        row_warps=ints(args.row_warps),
        maxnreg=ints(args.maxnreg),
        scaled=tuple(bool(v) for v in ints(args.scaled)),
        depths=ints(args.depths),
        tiled=tuple(bool(v) for v in ints(args.tiled)),
        s_ahead=tuple(bool(v) for v in ints(args.s_ahead)),
        w_ring=tuple(bool(v) for v in ints(args.w_ring)),
    )
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    if args.parts:
        for k, n in shapes:
            run_parts(k, n, rows, args.pdl)
        return
    shard = tuple(int(v) for v in args.compile_only.split("/")) if args.compile_only else None
    summary = []
    for k, n in tqdm(shapes, desc="shapes", disable=shard is not None):
        summary += run_shape(k, n, rows, args.top, args.frag, shard, **space)
        torch.cuda.empty_cache()
    if shard is not None:
        return
    print(
        "\n| K x N | M | bf16 us | table us | mma us (best) | bf16 / table | bf16 / mma | "
        "worst rel. error | best config |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for k, n, m, tb, tt, tm, worst, cfg in summary:
        c = f"{cfg['block_m']} x rows, " if cfg["block_m"] != (8 if m <= 8 else 16) else ""
        c += f"{cfg['num_warps']} warps{' over K' if cfg['wsplit'] else ''}, "
        c += f"{cfg['row_tiles']} row tiles, " if cfg["row_tiles"] > 1 else ""
        c += f"x in smem ({cfg['x_stages']} stages), " if cfg.get("x_smem") else ""
        c += f"{cfg['row_warps']} row warps, " if cfg.get("row_warps", 1) > 1 else ""
        c += f"maxnreg {cfg['maxnreg']}, " if cfg.get("maxnreg") else ""
        c += "scaled decode, " if cfg.get("scaled") else ""
        c += f"split {cfg['split_k']}, depth {cfg['depth']}"
        c += ", pdl" if cfg["pdl"] else ""
        c += ", weights first" if cfg.get("weights_first") else ""
        c += ", tile order" if cfg.get("tiled") else ""
        c += ", scales ahead" if cfg.get("s_ahead") else ""
        c += ", words in the ring" if cfg.get("w_ring") else ""
        print(f"| {k} x {n} | {m} | {tb:.1f} | {tt:.1f} | {tm:.1f} | {tb / tt:.2f}x | "
              f"{tb / tm:.2f}x | {worst:.1e} | {c} |")  # fmt: skip


if __name__ == "__main__":
    main()
