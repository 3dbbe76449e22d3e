"""Decode-only attention variants side by side with SDPA, CUDA-graph and layered timings.

Shapes where issue 3's targets are tight (batch 1 at long context, batch 8-32 at short), the
shipped decode config (``_pick_decode_config``) against the same with one field changed:

- ``pointer``: where the shipped launch reads K/V by TMA (sm_90+), the launch it replaced
  (per-thread pointer loads, ``_pick_decode_config`` without a TMA block size, at the split
  count of that rule unless ``--splits`` forces one; the table's splits column is the
  shipped launch's);
- ``wait``: the decode kernel launched as a programmatic dependent of the previous kernel
  (``wait=True``; sm_90+), so consecutive layers' launches overlap;
- with ``--caps 64,96,...``, ``cap N`` instead: the decode kernel's registers per thread
  capped at N (``maxnreg``);
- with ``--tiles 16x4x8,...`` (BLOCK_N x warps x stages), those launch shapes instead;
- with ``--tma`` as well as ``--tiles`` (sm_90+), each tile shape also with K/V by TMA
  (``tma BxWxS`` beside ``tiles BxWxS``, which has the pointer loads), and with ``--merge
  1,2,...`` by TMA with each of those query heads per program of the merge kernel (``tma BxWxS
  mH``; splits above 8 only);
- with ``--merges 1x32,2x0,...`` (query heads x columns per program of the merge kernel, 0:
  all columns), the shipped config with those instead (``m HxD``), and the same launched as a
  dependent (``wait m HxD``; splits above 8 only);
- ``--shapes 16x512,...`` (batch x context) in place of the default list, ``--splits 2,4`` the
  split counts to run each shape at (default: the launcher's own).

Timings as in ``bench_attention.py`` (graph: one replay, L2 flushed; layered: L calls on L
caches back to back in one graph). Every variant's output is checked against SDPA.

    PYTHONPATH=. python3 benchmarks/bench_decode_variants.py [--caps 64,96,128]
    PYTHONPATH=. python3 benchmarks/bench_decode_variants.py --tiles 16x4x8,32x4x8 \
        --shapes 16x512,1x8192 --splits 2,4
    PYTHONPATH=. python3 benchmarks/bench_decode_variants.py --tma --tiles 16x4x8,64x4x4
"""

from __future__ import annotations

import argparse
import dataclasses
from functools import partial

import torch
import torch.nn.functional as F

from benchmarks.bench_attention import (
    DTYPE,
    HEAD_DIM,
    NUM_HEADS,
    NUM_KV_HEADS,
    SCALE,
    bench_graph_ms,
    bench_layers_us,
    contiguous_kv,
    copy_bandwidth,
    max_diff,
    num_layers,
    paged_batch,
)
from kernels.paged_attention import (
    _launch_decode,
    _pick_decode_config,
    _tma_block,
    default_num_kv_splits,
)

SHAPES = [(1, 2048), (1, 8192), (8, 512), (12, 512), (16, 512), (16, 2048), (32, 512),
          (64, 2048), (256, 2048)]  # fmt: skip


def main() -> None:
    torch.manual_seed(0)
    device = torch.device("cuda")
    copy = copy_bandwidth()
    print(torch.cuda.get_device_name(), torch.__version__, f"copy {copy / 1e12:.2f} TB/s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--caps", default="", help="register caps to time instead of the leads")
    parser.add_argument("--tiles", default="", help="BLOCK_N x warps x stages list instead")
    parser.add_argument("--shapes", default="", help="batch x context list (default: SHAPES)")
    parser.add_argument("--splits", default="", help="split counts per shape (default: own)")
    parser.add_argument("--tma", action="store_true", help="K/V by TMA beside the pointer loads")
    parser.add_argument("--merge", default="", help="merge kernel heads per program, a list")
    parser.add_argument("--merges", default="", help="merge kernel heads x columns, a list")
    args = parser.parse_args()
    caps = [int(c) for c in args.caps.split(",") if c]
    # "pointer": the launch the shipped one replaced where K/V come by TMA (sm_90+)
    variants = {"shipped": {}, "pointer": None, "wait": {"wait": True}}
    if caps:
        variants = {"shipped": {}, **{f"cap {c}": {"maxnreg": c} for c in caps}}
    if args.tiles:
        variants = {"shipped": {}, "pointer": None}
        for tile in args.tiles.split(","):
            block_n, warps, stages = (int(v) for v in tile.split("x"))
            change = dict(block_n=block_n, num_warps=warps, num_stages=stages, tma=False)
            variants[f"tiles {tile}"] = change
            if args.tma:
                variants[f"tma {tile}"] = {**change, "tma": True}
            for heads in (int(h) for h in args.merge.split(",") if h):
                variants[f"tma {tile} m{heads}"] = {**change, "tma": True, "merge_block_h": heads}
    if args.merges:
        variants = {"shipped": {}, "wait": {"wait": True}}
        for merge in args.merges.split(","):
            heads, cols = (int(v) for v in merge.split("x"))
            change = {"merge_block_h": heads, "merge_block_d": cols}
            variants[f"m {merge}"] = change
            variants[f"wait m {merge}"] = {**change, "wait": True}
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    forced_splits = [int(v) for v in args.splits.split(",") if v]
    head = " | ".join(f"{name} graph / layered us (/SDPA)" for name in variants)
    print(f"| batch x ctx | splits | {head} | SDPA graph / layered us | shipped layered %copy |")
    print("|" + "---|" * (len(variants) + 4))
    for (batch, ctx), forced in (
        (shape, split) for shape in shapes for split in (forced_splits or [None])
    ):
        query, key_cache, value_cache, _, seq_lens, tables = paged_batch(batch, ctx, 1)
        kv_bytes = 2 * batch * ctx * NUM_KV_HEADS * HEAD_DIM * key_cache.element_size()
        layers = num_layers(kv_bytes)
        caches = [(key_cache, value_cache)] + [
            (torch.randn_like(key_cache), torch.randn_like(value_cache)) for _ in range(layers - 1)
        ]
        k = contiguous_kv(key_cache, tables, ctx)
        v = contiguous_kv(value_cache, tables, ctx)
        q = query.view(batch, NUM_HEADS, 1, HEAD_DIM)
        ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).view_as(query)
        sdpa = [partial(F.scaled_dot_product_attention, q, torch.randn_like(k),
                        torch.randn_like(v), enable_gqa=True) for _ in range(layers)]  # fmt: skip
        sdpa_graph, sdpa_layered = 1e3 * bench_graph_ms(sdpa[0]), bench_layers_us(sdpa)
        del sdpa, k, v
        tma_block = _tma_block(key_cache, value_cache)
        splits = forced or default_num_kv_splits(batch, NUM_KV_HEADS, 1, ctx, device, tma_block)
        # the pointer loads at their own rule's count, unless forced
        pointer_splits = forced or default_num_kv_splits(batch, NUM_KV_HEADS, 1, ctx, device)
        shape = (device, DTYPE, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM)
        shipped = _pick_decode_config(*shape, splits, batch, tma_block)
        pointer = _pick_decode_config(*shape, pointer_splits, batch, 0)
        cells, layered_shipped = [], 0.0
        for name, change in variants.items():
            config = pointer if change is None else dataclasses.replace(shipped, **change)
            out = torch.empty_like(query)
            count = pointer_splits if change is None else splits
            args = (seq_lens, tables, SCALE, None, out, count, config)
            _launch_decode(query, key_cache, value_cache, *args)
            diff = max_diff(out, ref)
            if diff > 0.02:
                raise SystemExit(f"{name} {batch}x{ctx}: max diff {diff:.3f} against SDPA")
            fns = [partial(_launch_decode, query, kc, vc, *args) for kc, vc in caches]
            graph, layered = 1e3 * bench_graph_ms(fns[0]), bench_layers_us(fns)
            layered_shipped = layered_shipped or layered
            cells.append(
                f"{graph:.1f} / {layered:.1f} ({graph / sdpa_graph:.2f} / "
                f"{layered / sdpa_layered:.2f})"
            )
        frac = kv_bytes / (layered_shipped * 1e-6) / copy
        print(
            f"| {batch} x {ctx} | {splits} | " + " | ".join(cells)
            + f" | {sdpa_graph:.1f} / {sdpa_layered:.1f} | {100 * frac:.0f}% |"
        )  # fmt: skip
        del caches
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
