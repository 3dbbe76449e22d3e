"""The INT4 table at row counts M that are not a multiple of its x tile (a prompt's last
prefill chunk, a decode batch of any size) against the same call on x padded with zero rows
to a whole number of tiles, beside bf16 cuBLAS; harness of bench_int4_gemm.py (CUDA-graph
replays over weight copies that exceed L2, median time per call).

    python3 benchmarks/bench_int4_ragged.py [--rows 100,128,160,192,255,256] [--shapes ...]

"padded" times the kernel alone on a zero-padded copy of x made before the graph; "pad +
call" copies x into that buffer inside each call as well, as a launcher would. Since the
fifteenth session the table itself pads where ``int4_gemm_config.pad_rows`` says so (the
"table pads" column): its time is then the "pad + call" form.
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

from kernels.int4_gemm import choose_config, int4_gemm, int4_gemm_ref  # noqa: E402
from kernels.int4_gemm_config import pad_rows  # noqa: E402


def time_row(peers: Peers, m: int) -> tuple:
    """(padded M, bf16, table, padded, pad + call times in us, padded rel. error, rows the
    table pads, config)."""
    k, n, weights = peers.k, peers.n, peers.int4
    cfg = choose_config(m, n, k, 128, torch.device("cuda"), frag=weights[0].frag)
    tile = cfg.block_m if cfg.strategy in ("wgmma", "mma") else 1
    padded_m = -(-m // tile) * tile
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    x_pad = torch.zeros(padded_m, k, device="cuda", dtype=torch.bfloat16)
    x_pad[:m] = x
    ref = int4_gemm_ref(x, weights[0]).float()
    out = int4_gemm(x_pad, weights[0])[:m].float()
    err = ((out - ref).norm() / ref.norm()).item()

    def pad_call(i: int) -> torch.Tensor:
        x_pad[:m].copy_(x)
        return int4_gemm(x_pad, weights[i])

    times = (
        peers.time_bf16(x),
        graph_time_us(lambda i: int4_gemm(x, weights[i]), peers.num_int4),
        graph_time_us(lambda i: int4_gemm(x_pad, weights[i]), peers.num_int4),
        graph_time_us(pad_call, peers.num_int4),
    )
    kind = f"{cfg.strategy} {cfg.block_m}x{cfg.block_n} split {cfg.split_k}"
    kind += " ws" if cfg.specialized else ""
    kind += " pipe" if cfg.pipe else ""
    return padded_m, *times, err, pad_rows(m, cfg, k), kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="96,100,128,136,160,192,224,255,256")
    parser.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    table = []
    for k, n in tqdm(shapes, desc="shapes"):
        peers = Peers(k, n, with_torch=False)
        for m in tqdm(rows, desc=f"{k}x{n}", leave=False):
            table.append((k, n, m, *time_row(peers, m)))
        torch.cuda.empty_cache()
    print("\n| K x N | M | padded M | bf16 us | table us | padded us | pad + call us | "
          "padded rel. err | table pads | config |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k, n, m, pm, tb, tt, tp, tpc, err, pads, kind in table:
        print(f"| {k} x {n} | {m} | {pm} | {tb:.1f} | {tt:.1f} | {tp:.1f} | {tpc:.1f} | "
              f"{err:.1e} | {pads} | {kind} |")  # fmt: skip


if __name__ == "__main__":
    main()
