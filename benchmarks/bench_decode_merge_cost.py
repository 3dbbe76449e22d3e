"""What the merge kernel costs a split decode: layered us of the whole call against the split
kernel alone (the merge launch skipped, so its output is not checked), at batch 1.

For each shape and split count, the shipped launch (``_pick_decode_config``) and the same with
``wait`` flipped (the split kernel launched as a programmatic dependent or not). Layered timing
as in ``bench_attention.py`` (L calls on L caches back to back in one CUDA graph).

    PYTHONPATH=. python3 benchmarks/bench_decode_merge_cost.py [--shapes 1x8192,1x2048] \
        [--splits 32,64]
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

import kernels.paged_attention as pa
from benchmarks.bench_attention import (
    DTYPE,
    HEAD_DIM,
    NUM_HEADS,
    NUM_KV_HEADS,
    bench_layers_us,
    copy_bandwidth,
    decode_fns,
    num_layers,
    paged_batch,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1x8192,1x4096,1x2048", help="batch x context list")
    parser.add_argument("--splits", default="32,64", help="split counts (above 8: merge kernel)")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda")
    copy = copy_bandwidth()
    print(torch.cuda.get_device_name(), torch.__version__, f"copy {copy / 1e12:.2f} TB/s")
    print("| batch x ctx | splits | launch | whole us (%copy) | split kernel alone us | merge us |")
    print("|---|---|---|---|---|---|")
    merge = pa._merge
    for shape in args.shapes.split(","):
        batch, ctx = (int(v) for v in shape.split("x"))
        query, key_cache, value_cache, _, seq_lens, tables = paged_batch(batch, ctx, 1)
        kv_bytes = 2 * batch * ctx * NUM_KV_HEADS * HEAD_DIM * key_cache.element_size()
        caches = [(key_cache, value_cache)] + [
            (torch.randn_like(key_cache), torch.randn_like(value_cache))
            for _ in range(num_layers(kv_bytes) - 1)
        ]
        tma_block = pa._tma_block(key_cache, value_cache)
        for splits in (int(s) for s in args.splits.split(",")):
            shipped = pa._pick_decode_config(
                device, DTYPE, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, splits, batch, tma_block
            )
            flipped = dataclasses.replace(shipped, wait=not shipped.wait)
            for name, config in (("shipped", shipped), (f"wait={flipped.wait}", flipped)):
                times = []
                for skip_merge in (False, True):
                    pa._merge = (lambda *a, **k: None) if skip_merge else merge
                    out = torch.empty_like(query)
                    fns = decode_fns(caches, query, seq_lens, tables, out, splits, config)
                    times.append(bench_layers_us(fns))
                pa._merge = merge
                whole, alone = times
                frac = kv_bytes / (whole * 1e-6) / copy
                print(
                    f"| {batch} x {ctx} | {splits} | {name} | {whole:.2f} ({100 * frac:.0f}%) "
                    f"| {alone:.2f} | {whole - alone:.2f} |"
                )
        del caches
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
