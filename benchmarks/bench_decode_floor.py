"""Where batch-1 decode attention time goes: floors of simpler kernels in the same harness.

Layered timing of ``bench_attention.py`` (L calls back to back in one CUDA graph, each on its
own 33.5 MB K/V: one sequence of 8192 positions, Llama-3-8B heads, bf16):

- launch floor: empty Triton launches of the decode grid, one and two per call;
- read floors: a contiguous streaming sum of the same bytes, and the same bytes gathered
  through a block table from the paged cache (no attention math);
- a minimal flash-decode split kernel (no merge) with the split range fixed on the host or
  read from ``seq_lens``, with and without load masks, beside our split kernel alone and
  our full call (split kernel + merge);
- the KV cache laid out head-major (``[blocks, kv_heads, block_size, head_dim]`` in memory,
  passed as the contract's view through strides) against the contract's token-major layout,
  at the default launch, for batch 1 x 8192, 16 x 512 and 16 x 2048.

    python benchmarks/bench_decode_floor.py
"""

from __future__ import annotations

from functools import partial

import torch
import triton
import triton.language as tl

import kernels.paged_attention as pa
from benchmarks.bench_attention import (
    BLOCK_SIZE,
    DTYPE,
    HEAD_DIM,
    NUM_HEADS,
    NUM_KV_HEADS,
    SCALE,
    bench_layers_us,
    copy_bandwidth,
    num_layers,
)
from kernels.paged_attention import DecodeConfig, _launch_decode, paged_attention

SEQ_LEN = 8192
LAYERS = 16


@triton.jit
def _empty_kernel(x_ptr, n):
    v = tl.load(x_ptr + tl.program_id(1) % n)
    if v == -12345:  # never: keeps the load
        tl.store(x_ptr, v)


@triton.jit
def _stream_kernel(x_ptr, out_ptr, chunk, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    base = x_ptr + tl.program_id(0).to(tl.int64) * chunk
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.range(0, chunk, BLOCK, num_stages=STAGES):
        acc += tl.load(base + i + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc))


@triton.jit
def _paged_stream_kernel(
    k_ptr, v_ptr, table_ptr, out_ptr, tiles, stride_b, stride_s, stride_h,
    BLOCK_N: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    head, split = tl.program_id(0), tl.program_id(1)
    offs_d = tl.arange(0, D)
    acc = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    for t in tl.range(0, tiles, num_stages=STAGES):
        offs_n = (split * tiles + t) * BLOCK_N + tl.arange(0, BLOCK_N)
        block = tl.load(table_ptr + offs_n // BS).to(tl.int64)
        off = block * stride_b + (offs_n % BS) * stride_s + head * stride_h
        acc += tl.load(k_ptr + off[:, None] + offs_d[None, :]).to(tl.float32)
        acc += tl.load(v_ptr + off[:, None] + offs_d[None, :]).to(tl.float32)
    tl.store(out_ptr + head * tl.num_programs(1) + split, tl.sum(acc))


@triton.jit
def _min_decode_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, part_out_ptr, part_lse_ptr, fixed_tiles,
    num_splits, scale_log2, stride_b, stride_s, stride_h,
    BLOCK_N: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, GROUP: tl.constexpr,
    FIXED: tl.constexpr, MASK: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    # One KV head's GROUP query heads over one split of one sequence; partials out, no merge.
    head, split = tl.program_id(0), tl.program_id(1)
    offs_d = tl.arange(0, D)
    offs_m = tl.arange(0, 16)
    q_ptrs = q_ptr + (head * GROUP + offs_m[:, None]) * D + offs_d[None, :]
    q = tl.load(q_ptrs, mask=offs_m[:, None] < GROUP, other=0.0)
    if FIXED:  # the host's tile count: nothing waits for seq_lens
        t0 = split * fixed_tiles
        t1 = t0 + fixed_tiles
        seq_len = fixed_tiles * num_splits * BLOCK_N
    else:
        seq_len = tl.load(seq_lens_ptr)
        num_tiles = (seq_len + BLOCK_N - 1) // BLOCK_N
        per_split = (num_tiles + num_splits - 1) // num_splits
        t0 = tl.minimum(split * per_split, num_tiles)
        t1 = tl.minimum(t0 + per_split, num_tiles)
    acc = tl.zeros([16, D], dtype=tl.float32)
    m_i = tl.full([16], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([16], dtype=tl.float32)
    for t in tl.range(t0, t1, num_stages=STAGES):
        offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
        valid = offs_n < seq_len
        if MASK:
            block = tl.load(table_ptr + offs_n // BS, mask=valid, other=0).to(tl.int64)
        else:
            block = tl.load(table_ptr + offs_n // BS).to(tl.int64)
        off = block * stride_b + (offs_n % BS) * stride_s + head * stride_h
        if MASK:
            k = tl.load(k_ptr + off[None, :] + offs_d[:, None], mask=valid[None, :], other=0.0)
        else:
            k = tl.load(k_ptr + off[None, :] + offs_d[:, None])
        s = tl.dot(q, k) * scale_log2
        if MASK:
            s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASK:
            v = tl.load(v_ptr + off[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        else:
            v = tl.load(v_ptr + off[:, None] + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    row = head * GROUP + offs_m
    part_ptrs = part_out_ptr + (row[:, None] * num_splits + split) * D + offs_d[None, :]
    tl.store(part_ptrs, acc / l_i[:, None], mask=offs_m[:, None] < GROUP)
    tl.store(part_lse_ptr + row * num_splits + split, m_i + tl.log2(l_i), mask=offs_m < GROUP)


def paged_caches(batch: int, seq_len: int, layers: int, head_major: bool = False):
    """``layers`` (key, value) caches in the contract's view and one shared block table."""
    num_blocks = batch * (-(-seq_len // BLOCK_SIZE))

    def cache() -> torch.Tensor:
        if head_major:
            shape = (num_blocks, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM)
            return torch.randn(shape, device="cuda", dtype=DTYPE).permute(0, 2, 1, 3)
        shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        return torch.randn(shape, device="cuda", dtype=DTYPE)

    caches = [(cache(), cache()) for _ in range(layers)]
    table = torch.randperm(num_blocks, device="cuda", dtype=torch.int32).view(batch, -1)
    return caches, table


def main() -> None:
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), torch.__version__, "triton", triton.__version__)
    copy = copy_bandwidth()
    nbytes = 2 * SEQ_LEN * NUM_KV_HEADS * HEAD_DIM * 2
    print(f"copy {copy / 1e12:.2f} TB/s; 1 x {SEQ_LEN}: {nbytes / 1e6:.1f} MB of K/V per call")

    def report(name: str, us: float, kv_bytes: int = nbytes) -> None:
        print(f"{name}: {us:.2f} us/call, {kv_bytes / (us * 1e-6) / copy * 100:.0f}% of copy")

    flags = torch.zeros(64, dtype=torch.int32, device="cuda")
    for per_call in (1, 2):
        fns = [partial(_empty_kernel[(NUM_KV_HEADS, 32)], flags, 64)] * (LAYERS * per_call)
        us = per_call * bench_layers_us(fns)
        report(f"launch floor, {per_call} empty launch(es) per call", us)

    flat = [torch.randn(nbytes // 2, device="cuda", dtype=DTYPE) for _ in range(LAYERS)]
    sums = torch.empty(4096, device="cuda", dtype=torch.float32)
    for programs in (256, 512, 1024):
        for block, stages, warps in ((2048, 4, 4), (4096, 3, 8), (1024, 6, 4)):
            chunk = flat[0].numel() // programs
            launch = _stream_kernel[(programs,)]
            fns = [
                partial(launch, x, sums, chunk, BLOCK=block, STAGES=stages, num_warps=warps)
                for x in flat
            ]
            name = f"contiguous stream, {programs} programs x {block} ({stages}, {warps} warps)"
            report(name, bench_layers_us(fns))
    del flat

    caches, table = paged_caches(1, SEQ_LEN, LAYERS)
    strides = caches[0][0].stride()[:3]
    consts = dict(D=HEAD_DIM, BS=BLOCK_SIZE)
    for splits in (16, 32, 64):
        launch = _paged_stream_kernel[(NUM_KV_HEADS, splits)]
        for block_n, stages, warps in ((32, 6, 4), (16, 8, 4), (32, 4, 2)):
            tiles = SEQ_LEN // splits // block_n
            tile = dict(BLOCK_N=block_n, STAGES=stages, num_warps=warps)
            fns = [
                partial(launch, k, v, table, sums, tiles, *strides, **consts, **tile)
                for k, v in caches
            ]
            name = f"paged gather stream, {splits} splits, ({block_n}, {stages}, {warps})"
            report(name, bench_layers_us(fns))

    query = torch.randn(1, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    out = torch.empty_like(query)
    seq_lens = torch.full((1,), SEQ_LEN, device="cuda", dtype=torch.int32)
    qsl = torch.arange(2, device="cuda", dtype=torch.int32)
    full = [
        partial(paged_attention, query, k, v, qsl, seq_lens, table, SCALE, 1, SEQ_LEN)
        for k, v in caches
    ]
    report("ours, default call (split kernel + merge)", bench_layers_us(full))
    merge, pa._merge = pa._merge, lambda *args, **kwargs: None
    try:
        for splits in (32, 64):
            config = DecodeConfig(32, 4, 6, 4)
            args = (seq_lens, table, SCALE, None, out, splits, config)
            fns = [partial(_launch_decode, query, k, v, *args) for k, v in caches]
            report(f"ours, split kernel alone, {splits} splits (32, 4, 6)", bench_layers_us(fns))
    finally:
        pa._merge = merge
    for splits in (32, 64):
        part_out = torch.empty(NUM_HEADS, splits, HEAD_DIM, device="cuda", dtype=torch.float32)
        part_lse = torch.empty(NUM_HEADS, splits, device="cuda", dtype=torch.float32)
        launch = _min_decode_kernel[(NUM_KV_HEADS, splits)]
        for block_n, stages, warps in ((32, 6, 4), (32, 6, 2), (64, 3, 4)):
            for fixed, mask in ((True, False), (False, True)):
                args = (table, seq_lens, part_out, part_lse, SEQ_LEN // splits // block_n, splits,
                        SCALE * 1.4426950408889634, *strides)  # fmt: skip
                kwargs = dict(BLOCK_N=block_n, GROUP=NUM_HEADS // NUM_KV_HEADS, FIXED=fixed,
                              MASK=mask, STAGES=stages, num_warps=warps, **consts)  # fmt: skip
                fns = [partial(launch, query, k, v, *args, **kwargs) for k, v in caches]
                range_from = "host" if fixed else "seq_lens"
                name = (f"minimal split kernel, {splits} splits ({block_n}, {stages}, {warps}), "
                        f"range from {range_from}, masks {mask}")  # fmt: skip
                report(name, bench_layers_us(fns))
    del caches

    for batch, seq_len in ((1, 8192), (16, 512), (16, 2048)):
        kv_bytes = 2 * batch * seq_len * NUM_KV_HEADS * HEAD_DIM * 2
        layers = num_layers(kv_bytes)
        query = torch.randn(batch, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        qsl = torch.arange(batch + 1, device="cuda", dtype=torch.int32)
        lens = torch.full((batch,), seq_len, device="cuda", dtype=torch.int32)
        for head_major in (False, True):
            caches, table = paged_caches(batch, seq_len, layers, head_major)
            args = (qsl, lens, table, SCALE, 1, seq_len)
            fns = [partial(paged_attention, query, k, v, *args) for k, v in caches]
            layout = "head-major" if head_major else "token-major (contract)"
            report(f"{batch} x {seq_len}, {layout}, default call", bench_layers_us(fns), kv_bytes)
            del caches
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
