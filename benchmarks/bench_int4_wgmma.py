"""The Gluon W4A16 kernel (``kernels/int4_wgmma.py``) against bf16 cuBLAS and the shipped
INT4 table, Llama-3-8B projection shapes, one H200; same harness as bench_int4_gemm.py
(CUDA-graph replays over weight copies that exceed L2; median of 10).

    python3 benchmarks/bench_int4_wgmma.py [--rows 256,1024]
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
from kernels.int4_wgmma import int4_wgmma  # noqa: E402

# (block_m, block_n, block_k, stages, warps)
TILES = [(128, 256, 64, 4, 8), (128, 256, 64, 5, 8), (256, 128, 64, 4, 8), (128, 128, 64, 6, 8),
         (128, 128, 64, 5, 8)]  # fmt: skip


def time_shape(k: int, n: int, row_values: list[int]) -> list[tuple]:
    """bf16, the table and every tile config of the Gluon kernel at each M for one weight."""
    peers = Peers(k, n, with_torch=False)
    rows = []
    for m in row_values:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        t_bf16 = peers.time_bf16(x)
        t_table = peers.time_ours(x, None)
        ref = int4_gemm_ref(x, peers.int4[0]).float()
        best = (float("inf"), None)
        for tiles in TILES:

            def run(i: int, tiles=tiles, x=x) -> torch.Tensor:
                return int4_wgmma(x, peers.int4[i], *tiles)

            try:
                out = run(0).float()
                err = ((out - ref).norm() / ref.norm()).item()
                t = graph_time_us(run, peers.num_int4)
            except Exception as exc:  # noqa: BLE001 - a config that fails is reported
                print(f"  K={k} N={n} M={m} {tiles} failed: {type(exc).__name__}: {exc}"[:300])
                continue
            flag = "" if err < 1e-2 else "  WRONG"
            print(f"  K={k} N={n} M={m} {tiles}: {t:.1f} us, rel. err {err:.1e}{flag}", flush=True)
            if err < 1e-2 and t < best[0]:
                best = (t, tiles)
        rows.append((k, n, m, t_bf16, t_table, *best))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="256,1024")
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows = []
    for k, n in SHAPES:
        rows += time_shape(k, n, [int(r) for r in args.rows.split(",")])
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
