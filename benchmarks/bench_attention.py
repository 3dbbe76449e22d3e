"""Paged attention on the GPU against ceilings measured in the same run and torch SDPA.

Llama-3-8B attention heads (32 query, 8 KV, head size 128), bf16, block size 16, blocks
placed in random order in the cache.

- decode, batch 1/16/64/256 x context 512/2048/8192: time, KV bytes read / time as a fraction
  of the device-to-device copy bandwidth, and SDPA on contiguous K/V of the same size;
- prefill, 8 x 2048 and 1 x 8192 causal: TFLOP/s against the bf16 8192^3 matmul rate, and
  SDPA's flash backend on the same shapes.

Decode is timed three ways: eager calls, one CUDA-graph replay with L2 flushed before it, and
layered (L calls back to back in one graph, each on its own cache, as a many-layer decode step
runs them). Each case also checks our output against SDPA's. ``--sweep`` adds a layered sweep
of the decode-only kernel (KV heads per program, tiles, splits, merge kernel plain, as a
programmatic dependent launch or fused) at batch 1 and 16 x 512/2048/8192 and 64 x 2048, and
of prefill tiles at both shapes. ``benchmarks/bench_decode_tiles.py`` compares warps per
program.

    python benchmarks/bench_attention.py [--sweep] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels.paged_attention import (
    DecodeConfig,
    _launch,
    _launch_decode,
    _tma_block,
    default_num_kv_splits,
    paged_attention,
)

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
DTYPE = torch.bfloat16
SCALE = HEAD_DIM**-0.5
SWEEP_SHAPES = ((1, 512), (1, 2048), (1, 8192), (16, 512), (16, 2048), (16, 8192), (64, 2048))
LAYERED_BYTES = 512 * 2**20


def bench_ms(fn) -> float:
    """Median time of ``fn`` in ms (CUDA events; L2 flushed before each call)."""
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def bench_graph_ms(fn) -> float:
    """Median time of one replay of ``fn`` captured in a CUDA graph (no host launch cost)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError as exc:  # report, keep the other numbers
        print(f"graph capture failed: {exc}")
        return float("nan")
    return bench_ms(graph.replay)


def bench_layers_us(fns) -> float:
    """Time per call of ``fns`` run back to back in one CUDA graph, in us.

    Like one decode step of a many-layer model: every call reads its own cache (together they
    exceed L2 several times), launches follow each other inside the graph, and the L2 flush
    before the replay is shared by all calls instead of preceding each.
    """
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for fn in fns:
                fn()
    except RuntimeError as exc:
        print(f"graph capture failed: {exc}")
        return float("nan")
    return bench_ms(graph.replay) * 1e3 / len(fns)


def num_layers(kv_bytes: int) -> int:
    """Back-to-back calls for the layered timing: >= 512 MB read in all, 2 to 32 calls."""
    return max(2, min(32, -(-LAYERED_BYTES // kv_bytes)))


def decode_fns(caches, query, seq_lens, tables, out, splits: int, config: DecodeConfig) -> list:
    """One decode-only launch per (key, value) cache, for ``bench_layers_us``."""
    return [
        lambda kc=kc, vc=vc: _launch_decode(
            query, kc, vc, seq_lens, tables, SCALE, None, out, splits, config
        )
        for kc, vc in caches
    ]


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second."""
    src = torch.randn(2**29, device="cuda", dtype=DTYPE)  # 1 GiB
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def matmul_rate() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=DTYPE)
    b = torch.randn(8192, 8192, device="cuda", dtype=DTYPE)
    ms = bench_ms(lambda: a @ b)
    return 2 * 8192**3 / (ms * 1e-3)


def paged_batch(batch: int, seq_len: int, q_len: int):
    """Random paged cache and metadata for ``batch`` sequences of equal length."""
    blocks_per_seq = -(-seq_len // BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    key_cache = torch.randn(shape, device="cuda", dtype=DTYPE)
    value_cache = torch.randn(shape, device="cuda", dtype=DTYPE)
    block_tables = torch.randperm(num_blocks, device="cuda", dtype=torch.int32)
    block_tables = block_tables.view(batch, blocks_per_seq)
    seq_lens = torch.full((batch,), seq_len, device="cuda", dtype=torch.int32)
    query_start_loc = torch.arange(0, batch * q_len + 1, q_len, device="cuda", dtype=torch.int32)
    query = torch.randn(batch * q_len, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    return query, key_cache, value_cache, query_start_loc, seq_lens, block_tables


def contiguous_kv(cache: torch.Tensor, block_tables: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[batch, num_kv_heads, seq_len, head_dim] copy of the paged cache, for SDPA."""
    batch = block_tables.shape[0]
    dense = cache[block_tables.long()].view(batch, -1, NUM_KV_HEADS, HEAD_DIM)[:, :seq_len]
    return dense.transpose(1, 2).contiguous()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def decode_case(batch: int, seq_len: int, copy_bytes_per_s: float, sweep: bool) -> dict:
    query, key_cache, value_cache, qsl, seq_lens, tables = paged_batch(batch, seq_len, 1)
    args = (query, key_cache, value_cache, qsl, seq_lens, tables, SCALE, 1, seq_len)
    out = torch.empty_like(query)
    ours_ms = bench_ms(lambda: paged_attention(*args, out=out))
    ours_graph_ms = bench_graph_ms(lambda: paged_attention(*args, out=out))
    k = contiguous_kv(key_cache, tables, seq_len)
    v = contiguous_kv(value_cache, tables, seq_len)
    q = query.view(batch, NUM_HEADS, 1, HEAD_DIM)
    sdpa_ms = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    sdpa_graph_ms = bench_graph_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    sdpa_out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).view_as(query)
    kv_bytes = 2 * batch * seq_len * NUM_KV_HEADS * HEAD_DIM * key_cache.element_size()
    row = {
        "batch": batch,
        "seq_len": seq_len,
        "num_kv_splits": default_num_kv_splits(
            batch, NUM_KV_HEADS, 1, seq_len, query.device, _tma_block(key_cache, value_cache)
        ),
        "ours_us": ours_ms * 1e3,
        "sdpa_us": sdpa_ms * 1e3,
        "ours_frac_copy": kv_bytes / (ours_ms * 1e-3) / copy_bytes_per_s,
        "sdpa_frac_copy": kv_bytes / (sdpa_ms * 1e-3) / copy_bytes_per_s,
        "ours_over_sdpa": ours_ms / sdpa_ms,
        "graph_ours_us": ours_graph_ms * 1e3,
        "graph_sdpa_us": sdpa_graph_ms * 1e3,
        "graph_ours_frac_copy": kv_bytes / (ours_graph_ms * 1e-3) / copy_bytes_per_s,
        "graph_sdpa_frac_copy": kv_bytes / (sdpa_graph_ms * 1e-3) / copy_bytes_per_s,
        "graph_ours_over_sdpa": ours_graph_ms / sdpa_graph_ms,
        "max_diff_vs_sdpa": max_diff(out, sdpa_out),
    }
    caches = layered_case(row, args, k, v, q, out, kv_bytes, copy_bytes_per_s)
    if sweep:  # the decode-only kernel, layered timing: KV heads per program, (BLOCK_N, warps,
        # stages), splits, merge kernel (M), the same as a programmatic dependent (PDL) or
        # fused into the last split (F)
        row["sweep"] = {}
        variants = [(1, (32, 4, 6)), (1, (64, 4, 3)), (1, (32, 4, 4)), (1, (16, 4, 8)),
                    (2, (16, 4, 6)), (2, (32, 4, 3)), (4, (16, 4, 3))]  # fmt: skip
        split_counts = [1, 2, 4, 8] if batch >= 16 else [8, 16, 32, 64]
        for kv_heads, tiles in variants:
            counts = split_counts
            if (kv_heads, tiles) == variants[0]:  # the default tiles: every merge at 4-64 splits
                counts = sorted({*split_counts, 4, 8, 16, 32, 64})
            for splits in counts:
                merges = [("M", False, False), ("PDL", False, True)]
                merges += [("F", True, False)] if 1 < splits <= 8 else []
                for tag, fused, pdl in merges if splits > 1 else [("-", False, False)]:
                    config = DecodeConfig(*tiles, 4, kv_heads, fused, pdl)
                    fns = decode_fns(caches, query, seq_lens, tables, out, splits, config)
                    key = f"kv{kv_heads}-tiles{tiles}-splits{splits}-{tag}"
                    try:
                        row["sweep"][key] = bench_layers_us(fns)
                    except triton.runtime.errors.OutOfResources:
                        row["sweep"][key] = float("nan")
    return row


def layered_case(row, args, k, v, q, out, kv_bytes: int, copy_bytes_per_s: float) -> list:
    """Add the layered timing (``bench_layers_us``) of ours and SDPA to ``row``, each call
    on its own copy of the cache; returns the caches [(key, value)] for the sweep."""
    query, key_cache, value_cache = args[:3]
    layers = num_layers(kv_bytes)
    caches = [(key_cache, value_cache)] + [
        (torch.randn_like(key_cache), torch.randn_like(value_cache)) for _ in range(layers - 1)
    ]
    ours = [
        lambda kc=kc, vc=vc: paged_attention(query, kc, vc, *args[3:], out=out) for kc, vc in caches
    ]
    row["layers"] = layers
    row["layered_ours_us"] = bench_layers_us(ours)
    sdpa = [lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)]
    sdpa += [
        lambda kk=torch.randn_like(k), vv=torch.randn_like(v): F.scaled_dot_product_attention(
            q, kk, vv, enable_gqa=True
        )
        for _ in range(layers - 1)
    ]
    row["layered_sdpa_us"] = bench_layers_us(sdpa)
    del sdpa
    for name in ("ours", "sdpa"):
        row[f"layered_{name}_frac_copy"] = (
            kv_bytes / (row[f"layered_{name}_us"] * 1e-6) / (copy_bytes_per_s)
        )
    row["layered_ours_over_sdpa"] = row["layered_ours_us"] / row["layered_sdpa_us"]
    return caches


def prefill_case(batch: int, seq_len: int, matmul_flops_per_s: float, sweep: bool) -> dict:
    query, key_cache, value_cache, qsl, seq_lens, tables = paged_batch(batch, seq_len, seq_len)
    args = (query, key_cache, value_cache, qsl, seq_lens, tables, SCALE, seq_len, seq_len)
    out = torch.empty_like(query)
    ours_ms = bench_ms(lambda: paged_attention(*args, out=out))
    k = contiguous_kv(key_cache, tables, seq_len)
    v = contiguous_kv(value_cache, tables, seq_len)
    q = query.view(batch, seq_len, NUM_HEADS, HEAD_DIM).transpose(1, 2).contiguous()
    peer = "flash, enable_gqa"
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    except RuntimeError:  # flash without native GQA: give it K/V repeated per query head
        peer = "flash, K/V repeated to 32 heads"
        k = k.repeat_interleave(NUM_HEADS // NUM_KV_HEADS, dim=1)
        v = v.repeat_interleave(NUM_HEADS // NUM_KV_HEADS, dim=1)
    gqa = k.shape[1] != NUM_HEADS

    def sdpa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    sdpa_ms = bench_ms(sdpa)
    sdpa_out = sdpa().transpose(1, 2).reshape_as(query)
    flops = 4 * batch * NUM_HEADS * HEAD_DIM * seq_len * seq_len / 2  # causal: half of QK^T, PV
    row = {
        "batch": batch,
        "seq_len": seq_len,
        "sdpa_peer": peer,
        "ours_ms": ours_ms,
        "sdpa_ms": sdpa_ms,
        "ours_tflops": flops / (ours_ms * 1e-3) / 1e12,
        "sdpa_tflops": flops / (sdpa_ms * 1e-3) / 1e12,
        "ours_frac_matmul": flops / (ours_ms * 1e-3) / matmul_flops_per_s,
        "sdpa_frac_matmul": flops / (sdpa_ms * 1e-3) / matmul_flops_per_s,
        "sdpa_over_ours": sdpa_ms / ours_ms,
        "max_diff_vs_sdpa": max_diff(out, sdpa_out),
    }
    if sweep:
        row["sweep"] = {}
        for tiles in [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 64, 4, 3),
                      (128, 32, 8, 4), (64, 128, 4, 3), (128, 64, 8, 4)]:  # fmt: skip
            fn = lambda t=tiles: _launch(*args[:7], None, out, 1, *t)  # noqa: E731
            try:
                row["sweep"][f"tiles{tiles}"] = bench_ms(fn)
            except Exception as exc:  # a tile that does not fit shared memory, say
                row["sweep"][f"tiles{tiles}"] = f"failed: {type(exc).__name__}"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also sweep tiles and splits")
    parser.add_argument("--out", help="write all results as JSON here")
    options = parser.parse_args()
    torch.manual_seed(0)
    started = time.time()
    results = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_bytes_per_s": copy_bandwidth(),
        "matmul_flops_per_s": matmul_rate(),
    }
    print(f"{results['device']}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"copy {results['copy_bytes_per_s'] / 1e12:.2f} TB/s (read + write), "
          f"bf16 matmul {results['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s")  # fmt: skip
    results["decode"] = []
    print(
        "\ndecode: eager launches | one CUDA-graph replay (no host cost) | layered: per call"
        " of L calls back to back in one graph, each on its own cache; %copy of copy BW"
    )
    print(
        "batch  ctx splits  ours_us sdpa_us ours/sdpa | ours_us sdpa_us ours/sdpa ours%copy "
        "sdpa%copy  diff |  L ours_us sdpa_us ours/sdpa ours%copy sdpa%copy"
    )
    for batch in (1, 16, 64, 256):
        for seq_len in (512, 2048, 8192):
            sweep = options.sweep and (batch, seq_len) in SWEEP_SHAPES
            r = decode_case(batch, seq_len, results["copy_bytes_per_s"], sweep)
            results["decode"].append(r)
            print(f"{batch:5d} {seq_len:4d} {r['num_kv_splits']:6d} {r['ours_us']:8.1f} "
                  f"{r['sdpa_us']:7.1f} {r['ours_over_sdpa']:9.2f} | {r['graph_ours_us']:7.1f} "
                  f"{r['graph_sdpa_us']:7.1f} {r['graph_ours_over_sdpa']:9.2f} "
                  f"{100 * r['graph_ours_frac_copy']:8.0f}% "
                  f"{100 * r['graph_sdpa_frac_copy']:8.0f}% "
                  f"{r['max_diff_vs_sdpa']:.3f} | {r['layers']:2d} {r['layered_ours_us']:7.1f} "
                  f"{r['layered_sdpa_us']:7.1f} {r['layered_ours_over_sdpa']:9.2f} "
                  f"{100 * r['layered_ours_frac_copy']:8.0f}% "
                  f"{100 * r['layered_sdpa_frac_copy']:8.0f}%")  # fmt: skip
            if "sweep" in r:
                print(
                    "    sweep (us):", json.dumps({k: round(v, 1) for k, v in r["sweep"].items()})
                )
            torch.cuda.empty_cache()
    results["prefill"] = []
    print("\nprefill batch x len  ours_ms  sdpa_ms  ours_TF  sdpa_TF  sdpa/ours  ours%mm  diff")
    for batch, seq_len in ((8, 2048), (1, 8192)):
        r = prefill_case(batch, seq_len, results["matmul_flops_per_s"], options.sweep)
        results["prefill"].append(r)
        print(f"{batch:9d} x {seq_len:4d} {r['ours_ms']:8.3f} {r['sdpa_ms']:8.3f} "
              f"{r['ours_tflops']:8.0f} {r['sdpa_tflops']:8.0f} {r['sdpa_over_ours']:9.2f} "
              f"{100 * r['ours_frac_matmul']:7.0f}% {r['max_diff_vs_sdpa']:.3f}  "
              f"({r['sdpa_peer']})")  # fmt: skip
        if "sweep" in r:
            print("    sweep (ms):", json.dumps(r["sweep"]))
        torch.cuda.empty_cache()
    results["wall_s"] = time.time() - started
    print(f"\nwall {results['wall_s']:.0f} s")
    if options.out:
        with open(options.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
