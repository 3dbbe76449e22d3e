"""Split-K on the swapped INT4 kernel: partials added with fp32 atomics (MODE 2, the reduction
before 2026-11-30's seventh session) against partials stored in slots and added by the tile's
last split (MODE 3, ``kernels/split_k.py``), for every split count, on the weights with N <=
8192 (qkv, o_proj, down_proj of Llama-3-8B), one H200; same harness as bench_int4_gemm.py
(CUDA-graph replays over weight copies that exceed L2; median of 10), weights in the engine's
word order.

    python3 benchmarks/bench_int4_splitk.py [--rows 1,4,16,32,64,128,256]

For each M the table's tiling (``choose_config``) is timed with 1, 2, 4 and 8 splits, each
reduction; "table" is the shipped config as it is. Every timed output is checked against the
reference.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import graph_time_us, shape_rows  # noqa: E402

from kernels.int4_gemm import choose_config, int4_gemm_ref  # noqa: E402
from kernels.int4_wgmma import int4_wgmma_swap  # noqa: E402

SHAPES = [(4096, 6144), (4096, 4096), (14336, 4096)]  # (K, N)
SPLITS = (1, 2, 4, 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4,16,32,64,128,256", help="M values")
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows = []
    for k, n, m, peers, _ in shape_rows(SHAPES, [int(m) for m in args.rows.split(",")]):
        w0 = peers.int4[0]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = int4_gemm_ref(x, w0).float()
        table = choose_config(m, n, k, w0.group_size, x.device, frag=w0.frag)
        cfg = table
        if not (cfg.strategy == "wgmma" and cfg.swap):  # M = 1 on canonical words: the gemv
            cfg = choose_config(2, n, k, w0.group_size, x.device, frag=w0.frag)
        times = {}
        for split in SPLITS:
            c = replace(cfg, split_k=split)
            for slots in (False, True):

                def run(i, c=c, slots=slots, x=x, w=peers.int4):
                    return int4_wgmma_swap(
                        x, w[i], c.block_m, c.block_n, c.block_k, c.split_k,
                        c.num_stages, c.num_warps, specialized=c.specialized, slots=slots,
                    )  # fmt: skip

                err = ((run(0).float() - ref).norm() / ref.norm()).item()
                if err > 1e-2:
                    raise SystemExit(f"K={k} N={n} M={m} {c} slots={slots}: rel. error {err}")
                times[split, slots] = graph_time_us(run, peers.num_int4)
        t_table = peers.time_ours(x, None)
        t_bf16 = peers.time_bf16(x)
        rows.append((k, n, m, w0.frag, table, t_bf16, t_table, times))
    print(
        "\n| K x N | words | M | tiling (x rows x weight rows) | bf16 | table (split) | "
        + " | ".join(f"split {s}: atomics / slots" for s in SPLITS)
        + " | bf16 / table |"
    )
    print("|---" * (7 + len(SPLITS)) + "|")
    for k, n, m, frag, table, t_bf16, t_table, times in rows:
        cells = " | ".join(f"{times[s, False]:.1f} / {times[s, True]:.1f}" for s in SPLITS)
        name = table.strategy if not table.swap else f"{table.split_k}"
        tiling = f"{table.block_m} x {table.block_n}" if table.swap else "gemv (M = 1)"
        print(
            f"| {k} x {n} | {'fragment' if frag else 'canonical'} | {m} | {tiling} | "
            f"{t_bf16:.1f} | {t_table:.1f} ({name}) | {cells} | {t_bf16 / t_table:.2f}x |"
        )


if __name__ == "__main__":
    main()
