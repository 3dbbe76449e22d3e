"""The swapped Gluon INT4 kernel reading its words from a tile-contiguous copy
(``int4_wgmma_swap(..., tiled_words=)``: each [block_n, 16]-word K tile one contiguous run)
against the row-major words: the table's tiling and three others, Llama-3-8B shapes, M = 1,
16, 32, 64; bench_int4_gemm.py's harness. "P": row-major words, "T": tile-contiguous.

    python3 benchmarks/bench_int4_tiled.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import Peers, graph_time_us  # noqa: E402

from kernels.int4_gemm import choose_config, int4_gemm_ref  # noqa: E402
from kernels.int4_wgmma import int4_wgmma_swap  # noqa: E402


def tile_words(q: torch.Tensor, block_n: int) -> torch.Tensor:
    """Words [N, K / 8] -> [N / block_n * K tiles * block_n, 16], tile after tile."""
    n, w = q.shape
    tiles = q.view(n // block_n, block_n, w // 16, 16).permute(0, 2, 1, 3)
    return tiles.contiguous().view(-1, 16)


def time_variant(x, peers, ref, tiling, tiled_copies) -> str:
    block_m, block_n, split, stages, warps, ws = tiling

    def run(i: int) -> torch.Tensor:
        words = tiled_copies[i] if tiled_copies else None
        return int4_wgmma_swap(x, peers.int4[i], block_m, block_n, 128, split, stages, warps,
                               specialized=ws, tiled_words=words)  # fmt: skip

    err = ((run(0).float() - ref).norm() / ref.norm()).item()
    t = graph_time_us(run, peers.num_int4)
    kind = "T" if tiled_copies else "P"
    flag = "" if err < 1e-2 else " WRONG"
    return f"{block_n}r s{split}{' ws' if ws else ''} {kind} {t:.1f}{flag}"


def main() -> None:
    for k, n in ((4096, 28672), (14336, 4096), (4096, 6144), (4096, 4096)):
        peers = Peers(k, n, with_torch=False)
        for m in (1, 16, 32, 64):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w0 = peers.int4[0]
            ref = int4_gemm_ref(x, w0).float()
            cfg = choose_config(m, n, k, w0.group_size, x.device, frag=w0.frag)
            res = [
                f"{k}x{n} M={m} bf16 {peers.time_bf16(x):.1f} table {peers.time_ours(x, None):.1f}"
                f" ({cfg.strategy} {cfg.block_m}x{cfg.block_n} s{cfg.split_k})"
            ]
            block_m = max(8, 1 << (m - 1).bit_length())
            tilings = []
            if cfg.strategy == "wgmma":
                tilings.append((cfg.block_m, cfg.block_n, cfg.split_k, cfg.num_stages,
                                cfg.num_warps, cfg.specialized))  # fmt: skip
            for block_n, split in ((128, 1), (64, 4), (64, 8), (128, 2)):
                warps = 8 if block_m >= 64 and block_n == 128 else 4
                tiling = (block_m, block_n, split, 4, warps, False)
                if tiling not in tilings:
                    tilings.append(tiling)
            for tiling in tilings:
                copies = [tile_words(w.qweight, tiling[1]) for w in peers.int4]
                res.append(time_variant(x, peers, ref, tiling, None))
                res.append(time_variant(x, peers, ref, tiling, copies))
            print(" | ".join(res), flush=True)
        del peers
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
