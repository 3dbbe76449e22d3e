"""The decode split-count rule against its neighbours, batch 1-32 x context 512-8192.

For each shape, ``default_num_kv_splits`` (marked ``*``) and the counts around it (half,
double, and ``p``: the rule's count for the pointer loads, where the launch reads K/V by
TMA), each launched as ``paged_attention`` would launch it (``_pick_decode_config`` for that
count), timed as in ``bench_attention.py``: one CUDA-graph
replay with L2 flushed, and layered (back-to-back calls on their own caches). SDPA on
contiguous K/V is the peer; ratios are ours / SDPA. Llama-3-8B heads, bf16, block size 16.

    python benchmarks/bench_decode_splits.py
"""

from __future__ import annotations

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
    num_layers,
    paged_batch,
)
from kernels.paged_attention import (
    _launch_decode,
    _pick_decode_config,
    _tma_block,
    default_num_kv_splits,
)

SHAPES = [(b, c) for b in (1, 2, 4, 8, 12) for c in (512, 1024, 2048, 4096, 8192)]
SHAPES += [(16, 512), (16, 1024), (16, 2048), (16, 8192), (24, 512), (24, 2048), (32, 512),
           (32, 2048), (64, 2048)]  # fmt: skip


def main() -> None:
    torch.manual_seed(0)
    device = torch.device("cuda")
    print(torch.cuda.get_device_name(), torch.__version__)
    print("shape | splits (* rule, p pointer rule): graph us (/SDPA) / layered us (/SDPA) | SDPA")
    for batch, ctx in SHAPES:
        query, key_cache, value_cache, _, seq_lens, tables = paged_batch(batch, ctx, 1)
        layers = num_layers(2 * batch * ctx * NUM_KV_HEADS * HEAD_DIM * key_cache.element_size())
        caches = [(key_cache, value_cache)] + [
            (torch.randn_like(key_cache), torch.randn_like(value_cache)) for _ in range(layers - 1)
        ]
        out = torch.empty_like(query)
        k = contiguous_kv(key_cache, tables, ctx)
        v = contiguous_kv(value_cache, tables, ctx)
        q = query.view(batch, NUM_HEADS, 1, HEAD_DIM)
        sdpa = [partial(F.scaled_dot_product_attention, q, torch.randn_like(k),
                        torch.randn_like(v), enable_gqa=True) for _ in range(layers)]  # fmt: skip
        sdpa_graph, sdpa_layered = 1e3 * bench_graph_ms(sdpa[0]), bench_layers_us(sdpa)
        del sdpa
        tma_block = _tma_block(key_cache, value_cache)
        rule = default_num_kv_splits(batch, NUM_KV_HEADS, 1, ctx, device, tma_block)
        before = default_num_kv_splits(batch, NUM_KV_HEADS, 1, ctx, device)
        cells = []
        for splits in sorted({max(1, rule // 2), rule, min(64, rule * 2), before}):
            config = _pick_decode_config(
                device, DTYPE, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, splits, batch, tma_block
            )
            args = (seq_lens, tables, SCALE, None, out, splits, config)
            fns = [partial(_launch_decode, query, kc, vc, *args) for kc, vc in caches]
            graph, layered = 1e3 * bench_graph_ms(fns[0]), bench_layers_us(fns)
            mark = ("*" if splits == rule else "") + ("p" if splits == before else "")
            cells.append(
                f"s{splits}{mark}: {graph:.1f} ({graph / sdpa_graph:.2f}) / "
                f"{layered:.1f} ({layered / sdpa_layered:.2f})"
            )
        print(f"{batch}x{ctx} | " + " | ".join(cells) + f" | {sdpa_graph:.1f} / {sdpa_layered:.1f}")
        del caches
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
