"""The Gluon W4A16 kernels (``kernels/int4_wgmma.py``) against bf16 cuBLAS and the shipped
INT4 table, Llama-3-8B projection shapes, one H200; same harness as bench_int4_gemm.py
(CUDA-graph replays over weight copies that exceed L2; median of 10).

    python3 benchmarks/bench_int4_wgmma.py [--rows 256,1024]
    python3 benchmarks/bench_int4_wgmma.py --swap [--rows 1,16,64,256]

``--swap`` sweeps the swapped (small-M) kernel, the weight decoded into wgmma's register
operand: tiles (block_m, block_n, block_k, split_k, stages, warps) from ``swap_tiles``, each
plain and warp-specialized (a last element True: a producer warp issues the TMA refills).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import SHAPES, Peers, graph_time_us  # noqa: E402

from kernels.int4_gemm import int4_gemm_ref  # noqa: E402
from kernels.int4_wgmma import int4_wgmma, int4_wgmma_swap  # noqa: E402

# (block_m, block_n, block_k, stages, warps)
TILES = [(128, 256, 64, 4, 8), (128, 256, 64, 5, 8), (256, 128, 64, 4, 8), (128, 128, 64, 6, 8),
         (128, 128, 64, 5, 8)]  # fmt: skip


def swap_tiles(m: int, k: int, n: int) -> list[tuple]:
    """Swapped-kernel tiles for one M: wgmma's N the smallest power of two >= M (8 at M = 1;
    128 or 256 above 64), 64 or 128 weight rows, K tiles of 64 or 128, the two smallest
    power-of-two splits that give every multiprocessor a program; up to M = 64 also deeper
    rings (6 stages) and 8 warps (two warpgroups) for 128 weight rows."""
    if m == 1:
        block_ms = [8]
    elif m <= 64:
        block_ms = [max(16, 1 << (m - 1).bit_length())]
    else:
        block_ms = [128, 256]
    tiles = []
    for block_m in block_ms:
        for block_n in (64, 128):
            for block_k in (64, 128):
                per_stage = block_m * block_k * 2 + block_n * block_k // 2
                most = max(2, min(6 if block_k == 64 else 4, (160 << 10) // per_stage))
                num_tiles = -(-m // block_m) * (n // block_n)
                split = 1
                while split * num_tiles < 132 and k // (2 * split) >= 2 * block_k:
                    split *= 2
                warps = 8 if block_m * block_n > 128 * 128 else 4
                for s in {split, min(2 * split, k // (2 * block_k))}:
                    tiles.append((block_m, block_n, block_k, s, most, warps))
                if m <= 64 and block_k == 128:
                    tiles.append((block_m, block_n, block_k, split, 6, warps))
                    if block_n == 128:
                        tiles.append((block_m, block_n, block_k, split, 4, 8))
                        tiles.append((block_m, block_n, block_k, split, 6, 8))
    return tiles


def time_shape(
    k: int,
    n: int,
    row_values: list[int],
    swap: bool = False,
    frag: bool = False,
    only_tiles: list[tuple] | None = None,
    plain: bool = False,
    slots: bool = True,
    pipe: bool = False,
) -> list[tuple]:
    """bf16, the table and every tile config of a Gluon kernel at each M for one weight.
    ``frag``: the swapped kernel on canonical and on fragment-ordered words; ``only_tiles``:
    these swapped tilings instead of ``swap_tiles``; ``plain``: the swapped kernel without
    warp specialization only; ``slots`` False: split-K reduced with fp32 atomics, the
    reduction before the seventh session; ``pipe``: each tiling of 3 or more stages also with
    two wgmmas in flight. Swapped candidates print as (*tiles, specialized, fragment order,
    pipe)."""
    peers = Peers(k, n, with_torch=False, engine_order=False)
    if frag:
        peers.frag = [w.to_frag() for w in peers.int4]
    rows = []
    for m in row_values:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        t_bf16 = peers.time_bf16(x)
        t_table = peers.time_ours(x, None)
        ref = int4_gemm_ref(x, peers.int4[0]).float()
        best = {False: (float("inf"), None), True: (float("inf"), None)}  # by fragment order
        kernel = int4_wgmma_swap if swap else int4_wgmma
        candidates = TILES
        if swap:  # (*tiles, specialized, fragment order, pipe)
            candidates = [
                (*t, ws, fr, pp)
                for t in only_tiles or swap_tiles(m, k, n)
                if not frag or t[2] == 128  # the fragment order is per 128-column tile
                for ws in ((False,) if plain else (False, True))
                for fr in ((0, 1) if frag else (0,))
                for pp in ((False, True) if pipe and t[4] >= 3 else (False,))
            ]
        for tiles in candidates:

            def run(i: int, tiles=tiles, x=x, kernel=kernel) -> torch.Tensor:
                if swap:
                    weights = peers.frag if tiles[-2] else peers.int4
                    return kernel(x, weights[i], *tiles[:-3], specialized=tiles[-3],
                                  slots=slots, pipe=tiles[-1])  # fmt: skip
                return kernel(x, peers.int4[i], *tiles)

            try:
                out = run(0).float()
                err = ((out - ref).norm() / ref.norm()).item()
                t = graph_time_us(run, peers.num_int4)
            except Exception as exc:  # noqa: BLE001 - a config that fails is reported
                print(f"  K={k} N={n} M={m} {tiles} failed: {type(exc).__name__}: {exc}"[:300])
                continue
            flag = "" if err < 1e-2 else "  WRONG"
            print(f"  K={k} N={n} M={m} {tiles}: {t:.1f} us, rel. err {err:.1e}{flag}", flush=True)
            kind = bool(tiles[-2]) if swap and frag else False
            if err < 1e-2 and t < best[kind][0]:
                best[kind] = (t, tiles)
        rows.append((k, n, m, t_bf16, t_table, *best[False]))
        if swap and frag:
            rows.append((k, n, m, t_bf16, t_table, *best[True]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=None, help="M values (256,1024; with --swap 1,16,64,256)")
    parser.add_argument("--swap", action="store_true", help="the swapped small-M kernel")
    parser.add_argument(
        "--frag", action="store_true", help="with --swap: also on fragment-ordered words"
    )
    parser.add_argument("--shapes", default=None, help="K x N list (default: the 8B shapes)")
    parser.add_argument(
        "--tiles",
        default=None,
        help="with --swap: only these tilings, e.g. 256x128x128x1x3x8 "
        "(block_m x block_n x block_k x split_k x stages x warps), comma-separated",
    )
    parser.add_argument(
        "--plain", action="store_true", help="with --swap: skip the warp-specialized form"
    )
    parser.add_argument(
        "--atomics",
        action="store_true",
        help="with --swap: reduce split-K with fp32 atomics instead of slots (the old way)",
    )
    parser.add_argument(
        "--pipe", action="store_true", help="with --swap: also with two wgmmas in flight"
    )
    args = parser.parse_args()
    row_values = [
        int(r) for r in (args.rows or ("1,16,64,256" if args.swap else "256,1024")).split(",")
    ]
    shapes = (
        SHAPES
        if not args.shapes
        else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    )
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows = []
    for k, n in shapes:
        tiles = (
            [tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")]
            if args.tiles
            else None
        )
        rows += time_shape(
            k,
            n,
            row_values,
            args.swap,
            args.frag,
            tiles,
            args.plain,
            not args.atomics,
            args.pipe,
        )
        torch.cuda.empty_cache()
    print("\n| K x N | M | bf16 (us) | table (us) | wgmma (us) | tiles | vs bf16 | vs table |")
    print("|---|---|---|---|---|---|---|---|")
    for k, n, m, t_bf16, t_table, t, tiles in rows:
        print(
            f"| {k} x {n} | {m} | {t_bf16:.1f} | {t_table:.1f} | {t:.1f} | {tiles} | "
            f"{t_bf16 / t:.2f}x | {t_table / t:.2f}x |"
        )


if __name__ == "__main__":
    main()
