"""Decode-only attention launch shapes on the GPU: warps per program, tiles and splits.

Two tables, Llama-3-8B heads in bf16 as in ``bench_attention.py`` (its harness and shapes):

- layered timing (``bench_attention.bench_layers_us``) of (BLOCK_N, warps, stages) variants,
  fused merge or merge kernel as a dependent launch, at 16 x 512 (2 and 4 splits), 16 x 2048
  (4 splits) and 1 x 8192 (32 splits);
- split count x warps at 16 x 512, 8 x 512 and 8 x 2048 (fused merge, 32-position tiles, 6
  stages): one CUDA-graph replay with L2 flushed (SDPA beside it) and the layered timing.

    python benchmarks/bench_decode_tiles.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.bench_attention import (
    HEAD_DIM,
    NUM_HEADS,
    NUM_KV_HEADS,
    bench_graph_ms,
    bench_layers_us,
    contiguous_kv,
    decode_fns,
    num_layers,
    paged_batch,
)
from kernels.paged_attention import DecodeConfig

TILES = [(32, 4, 6), (32, 2, 6), (32, 2, 4), (16, 2, 8), (16, 1, 8), (32, 1, 6), (64, 2, 3),
         (64, 8, 3), (128, 8, 3), (128, 4, 2), (64, 4, 4), (16, 4, 12), (32, 8, 6)]  # fmt: skip
SPLITS_WARPS = [(2, 4), (2, 1), (4, 1), (4, 4), (8, 1)]


def case(batch: int, seq_len: int):
    """Paged inputs, the layered caches and an output buffer for one shape."""
    query, key_cache, value_cache, _, seq_lens, tables = paged_batch(batch, seq_len, 1)
    layers = num_layers(2 * batch * seq_len * NUM_KV_HEADS * HEAD_DIM * key_cache.element_size())
    caches = [(key_cache, value_cache)] + [
        (torch.randn_like(key_cache), torch.randn_like(value_cache)) for _ in range(layers - 1)
    ]
    return query, seq_lens, tables, caches, torch.empty_like(query)


def tiles_table() -> None:
    print("layered us per call: shape, splits, (BLOCK_N, warps, stages), merge")
    for batch, seq_len, split_counts in [(16, 512, (2, 4)), (16, 2048, (4,)), (1, 8192, (32,))]:
        query, seq_lens, tables, caches, out = case(batch, seq_len)
        for splits in split_counts:
            for block_n, warps, stages in TILES:
                merges = [(True, False), (False, True)] if splits <= 8 else [(False, True)]
                for fused, pdl in merges:
                    config = DecodeConfig(block_n, warps, stages, 4, 1, fused, pdl)
                    fns = decode_fns(caches, query, seq_lens, tables, out, splits, config)
                    try:
                        us = f"{bench_layers_us(fns):.1f}"
                    except Exception as exc:  # a tile that does not fit, say
                        us = f"failed: {type(exc).__name__}"
                    merge = "fused" if fused else "PDL"
                    print(f"{batch}x{seq_len} s{splits} {(block_n, warps, stages)} {merge}: {us}")
        del caches
        torch.cuda.empty_cache()


def splits_table() -> None:
    print("\nshape, splits, warps: one graph replay us (ours / SDPA) | layered us")
    for batch, seq_len in [(16, 512), (8, 512), (8, 2048)]:
        splits_rows(batch, seq_len)
        torch.cuda.empty_cache()


def splits_rows(batch: int, seq_len: int) -> None:
    query, seq_lens, tables, caches, out = case(batch, seq_len)
    k = contiguous_kv(caches[0][0], tables, seq_len)
    v = contiguous_kv(caches[0][1], tables, seq_len)
    q = query.view(batch, NUM_HEADS, 1, HEAD_DIM)
    sdpa_us = 1e3 * bench_graph_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    for splits, warps in SPLITS_WARPS:
        config = DecodeConfig(32, warps, 6, fused_merge=True)
        fns = decode_fns(caches, query, seq_lens, tables, out, splits, config)
        graph_us = 1e3 * bench_graph_ms(fns[0])
        layered_us = bench_layers_us(fns)
        print(
            f"{batch}x{seq_len} s{splits} w{warps}: graph {graph_us:.1f} us (SDPA {sdpa_us:.1f}, "
            f"{graph_us / sdpa_us:.2f}x), layered {layered_us:.1f}"
        )


def main() -> None:
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), torch.__version__)
    tiles_table()
    splits_table()


if __name__ == "__main__":
    main()
