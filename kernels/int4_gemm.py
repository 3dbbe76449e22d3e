"""W4A16 GEMM: ``y = x @ dequant(W)^T`` with a canonical packed INT4 weight.

Canonical form (``Int4Weight``), chosen for wide contiguous loads along K:

- ``qweight`` int32 ``[N, K // 8]``: word ``w`` of row ``n`` holds ``k = 8*w + j`` in bits
  ``4*j .. 4*j+3`` (low nibble first), codes 0..15.
- ``scales`` and ``offsets`` ``[K // group_size, N]`` (fp16, bf16 or fp32): the value of code
  ``q`` in group ``g`` of output ``n`` is ``q * scales[g, n] + offsets[g, n]``. Integer zero
  points (GPTQ, AWQ) become ``offset = -zero * scale``; GGUF Q4_1's float min is the offset.
- ``group_size`` 32, 64, 128 or ``K`` (per-channel); any multiple of 8 dividing K works.
- ``in_perm`` int64 ``[K]`` or None: act-order checkpoints are permuted once at load so groups
  are contiguous, and the activations are gathered ``x[:, in_perm]`` before the product.

On Hopper, wide (N > 8192) and long-K (K >= 8192) weights are held with their words in
fragment order instead (``frag``, put there once at load by ``Int4Linear`` where
``frag_preferred``): the same codes permuted within each 128-column tile so that the swapped
wgmma kernel's lanes each read their own bytes (``int4_weight.frag_order``); only that
kernel (M <= 256) and the dequantizers read them.

Concatenating weights along N (fused ``qkv_proj``, ``gate_up_proj``) is a ``cat`` of every
tensor along its N dimension (``Int4Weight.cat_n``); slicing on group boundaries along N or K
(tensor parallelism) is plain slicing (``narrow_n``, ``narrow_k``).

Strategies, picked by ``choose_config`` from M and the shape: ``gemv`` (M = 1, reduction in
registers, split-K), ``mm`` (each weight tile dequantized in registers, one ``tl.dot`` chain,
split-K for small M so every multiprocessor has work), ``tiled`` (``tl.dot`` on raw codes
nibble plane by nibble plane, scale and offset per group tile) and ``dequant`` (dequantize
to the activation dtype, then cuBLAS) for large M; on sm_90, ``wgmma`` (the Gluon kernels of
``kernels.int4_wgmma``: the weight decoded into wgmma's register operand for small M, or
into shared memory beside asynchronous products for large M).
Settings come from a fixed table per shape bucket, never autotuned at run time, so the
launch is safe inside CUDA graph capture.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.int4_gemm_config import (
    STRATEGIES,
    Int4GemmConfig,
    _narrow_swap,
    choose_config,
    pad_rows,
    split_rows,
    wgmma_fallback,
)
from kernels.int4_tiles import (
    _asm_k_order,
    _dequant_asm,
    _dequant_words,
    _epilogue,
    _load_words,
    _nibble_dot,
    _nibble_dot_fold,
    _nibble_dot_fold_asm,
    _nibble_mma,
    _unpack,
    _x_planes,
)
from kernels.int4_weight import (
    Int4Weight,
    frag_shape_ok,
    tma_tiles_ok,
    unpack_words,
)
from kernels.launch import FastLaunch
from kernels.pdl import has_pdl, is_sm90
from kernels.split_k import split_k_output

try:  # Gluon is experimental in Triton: without it the wgmma strategy falls back to mm
    from kernels.int4_mma import Int4MmaWeight, int4_mma, int4_mma_ok
    from kernels.int4_wgmma import int4_wgmma, int4_wgmma_swap, wgmma_ok, wgmma_swap_ok
except (ImportError, AttributeError):  # pragma: no cover - depends on the Triton build
    int4_wgmma = int4_wgmma_swap = wgmma_ok = wgmma_swap_ok = None
    Int4MmaWeight = int4_mma = int4_mma_ok = None

__all__ = [
    "Int4Weight",
    "Int4GemmConfig",
    "int4_gemm",
    "int4_gemm_ref",
    "dequantize_int4",
    "device_form",
    "frag_preferred",
]


@triton.jit
def _gemv_words(qw_ptr, offs_n, n_mask, sub0, sub_end, stride_qw_n, SUB_W: tl.constexpr,
                NUM_SUB: tl.constexpr, EVEN: tl.constexpr):  # fmt: skip
    """Packed words [BLOCK_N, NUM_SUB, SUB_W] of sub-groups sub0 .. sub0 + NUM_SUB; unless
    EVEN (whole tiles), those from sub_end on and rows past N read as 0."""
    subs = sub0 + tl.arange(0, NUM_SUB)
    offs_w = tl.arange(0, SUB_W)
    words = subs[:, None] * SUB_W + offs_w[None, :]  # [NUM_SUB, SUB_W]
    ptrs = qw_ptr + offs_n[:, None, None] * stride_qw_n + words[None, :, :]
    if EVEN:
        q = tl.load(ptrs)
    else:
        mask = (subs < sub_end)[:, None] & (offs_w[None, :] < SUB_W)
        q = tl.load(ptrs, mask=n_mask[:, None, None] & mask[None, :, :], other=0)
    return q


@triton.jit
def _prefetch_l2(rows_ptr, nbytes):
    """Bring ``nbytes`` (a multiple of 16) from each 16-byte aligned address of ``rows_ptr``
    into L2 with one bulk prefetch each (sm_90: ``cp.async.bulk.prefetch.L2``). A prefetch
    reads nothing into the program and L2 is where every write lands, so it may run before
    ``gdc_wait``: a kernel still writing that memory leaves L2 up to date either way."""
    tl.inline_asm_elementwise(
        asm="cp.async.bulk.prefetch.L2.global [$1], $2;\nmov.u32 $0, 0;",
        constraints="=r,l,r",
        args=[rows_ptr.to(tl.int64, bitcast=True), tl.zeros(rows_ptr.shape, tl.int32) + nbytes],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _int4_gemv_kernel(
    x_ptr,
    x32_ptr,
    qw_ptr,
    s_ptr,
    o_ptr,
    out_ptr,
    ws_ptr,
    lock_ptr,
    N,
    K,
    group_size,
    subs_per_split,
    num_splits,
    stride_x_m,
    stride_x32_m,
    stride_qw_n,
    stride_s_g,
    stride_out_m,
    BLOCK_N: tl.constexpr,
    SUB_W: tl.constexpr,
    NUM_SUB: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    MODE: tl.constexpr,
    X16: tl.constexpr,
    IS_BF16: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_K: tl.constexpr,
    FOLD: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
    L2_PREFETCH: tl.constexpr = False,
    NUM_G: tl.constexpr = 1,
):
    # One row of x per program along axis 2. K is cut into sub-groups of SUB_W words that
    # never straddle a quantization group; a step loads [BLOCK_N, NUM_SUB, SUB_W] words (one
    # 16-byte load per thread and row where SUB_W >= 4), so the scale and offset of each
    # sub-group apply after its reduction: sum_k x_k (q s + o) = s sum_k x_k q + o sum_k x_k.
    # PREFETCH: the next step's words are loaded into registers before this step's math.
    # PDL (launched as a programmatic dependent): the launch overlaps the previous kernel's
    # tail; nothing is read or written before it has finished (gdc_wait), not even the
    # weight, which a kernel still in flight may have written.
    # L2_PREFETCH (with PDL, sm_90): before waiting, the program's words, scales and offsets
    # are prefetched into L2 (``_prefetch_l2``; at most NUM_G groups per split), so the DRAM
    # reads overlap the previous kernel instead of following it.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    num_subs = K // (8 * SUB_W)
    sub_start = pid_k * subs_per_split
    sub_end = tl.minimum(sub_start + subs_per_split, num_subs)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        if L2_PREFETCH:
            if m == 0:
                rows = tl.minimum(offs_n, N - 1)
                words = qw_ptr + rows * stride_qw_n + sub_start * SUB_W
                _prefetch_l2(words, (sub_end - sub_start) * SUB_W * 4)
                g0 = sub_start * (8 * SUB_W) // group_size
                g1 = (sub_end * (8 * SUB_W) - 1) // group_size
                gs = tl.minimum(g0 + tl.arange(0, NUM_G), g1)
                n0 = tl.minimum(pid_n * BLOCK_N, N - BLOCK_N)
                S_BYTES: tl.constexpr = s_ptr.dtype.element_ty.primitive_bitwidth // 8
                _prefetch_l2(s_ptr + gs * stride_s_g + n0, BLOCK_N * S_BYTES)
                _prefetch_l2(o_ptr + gs * stride_s_g + n0, BLOCK_N * S_BYTES)
        tl.extra.cuda.gdc_wait()
    EVEN: tl.constexpr = EVEN_N and EVEN_K
    if PREFETCH:
        q_next = _gemv_words(
            qw_ptr, offs_n, n_mask, sub_start, sub_end, stride_qw_n, SUB_W, NUM_SUB, EVEN
        )
    acc = tl.zeros([BLOCK_N, NUM_SUB], dtype=tl.float32)
    x_row = x_ptr + m * stride_x_m
    x32_row = x32_ptr + m * stride_x32_m
    offs_w = tl.arange(0, SUB_W)
    for sub0 in tl.range(sub_start, sub_end, NUM_SUB, num_stages=NUM_STAGES):
        if PREFETCH:
            q = q_next
            # whole splits (EVEN) re-read their last step instead of reading past it
            if EVEN:
                nxt = tl.minimum(sub0 + NUM_SUB, sub_end - NUM_SUB)
            else:
                nxt = sub0 + NUM_SUB
            q_next = _gemv_words(
                qw_ptr, offs_n, n_mask, nxt, sub_end, stride_qw_n, SUB_W, NUM_SUB, EVEN
            )
        else:
            q = _gemv_words(
                qw_ptr, offs_n, n_mask, sub0, sub_end, stride_qw_n, SUB_W, NUM_SUB, EVEN
            )
        subs = sub0 + tl.arange(0, NUM_SUB)
        words = subs[:, None] * SUB_W + offs_w[None, :]  # [NUM_SUB, SUB_W]
        sub_mask = subs < sub_end
        x_mask = sub_mask[:, None] & (offs_w[None, :] < SUB_W)
        x0, x1, x2, x3, x4, x5, x6, x7 = _x_planes(
            x_row, x32_row, words, x_mask, X16, IS_BF16, EVEN_K
        )
        if FOLD == 2:
            qx, x_sum = _nibble_dot_fold_asm(q, x0, x1, x2, x3, x4, x5, x6, x7)
        elif FOLD == 1:
            qx, x_sum = _nibble_dot_fold(q, x0, x1, x2, x3, x4, x5, x6, x7)
        else:
            qx, x_sum = _nibble_dot(q, x0, x1, x2, x3, x4, x5, x6, x7)
        g = subs * (8 * SUB_W) // group_size
        s_ptrs = g[None, :] * stride_s_g + offs_n[:, None]
        if EVEN:
            s = tl.load(s_ptr + s_ptrs).to(tl.float32)
            o = tl.load(o_ptr + s_ptrs).to(tl.float32)
        else:
            mask = n_mask[:, None] & sub_mask[None, :]
            s = tl.load(s_ptr + s_ptrs, mask=mask, other=0.0).to(tl.float32)
            o = tl.load(o_ptr + s_ptrs, mask=mask, other=0.0).to(tl.float32)
        acc += s * qx + o * x_sum[None, :]
    _epilogue(
        tl.sum(acc, axis=1),
        out_ptr + m * stride_out_m + offs_n,
        ws_ptr + m * N + offs_n,
        n_mask,
        lock_ptr,
        m * tl.num_programs(0) + pid_n,
        num_splits,
        MODE,
        0,  # no slots: the gemv reduces splits with atomics (MODE 2)
        0,
    )


_GEMV = FastLaunch(_int4_gemv_kernel)


@triton.jit
def _tile_coords(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of program ``pid``, GROUP_M row tiles swept per column (L2 reuse)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_rows
    pid_n = (pid % num_pid_in_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _group_scales(s_ptr, o_ptr, row_offset, offs_n, n_mask, EVEN_N: tl.constexpr):
    """One group's scales and offsets for columns ``offs_n``, as float32."""
    if EVEN_N:
        s = tl.load(s_ptr + row_offset + offs_n).to(tl.float32)
        o = tl.load(o_ptr + row_offset + offs_n).to(tl.float32)
    else:
        s = tl.load(s_ptr + row_offset + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        o = tl.load(o_ptr + row_offset + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    return s, o


@triton.jit
def _int4_gemm_kernel(
    x_ptr,
    x32_ptr,
    qw_ptr,
    s_ptr,
    o_ptr,
    out_ptr,
    ws_ptr,
    lock_ptr,
    M,
    N,
    K,
    group_size,
    k_per_split,
    num_splits,
    stride_x_m,
    stride_x32_m,
    stride_qw_n,
    stride_s_g,
    stride_out_m,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    MODE: tl.constexpr,
    IEEE: tl.constexpr,
    NIBBLE: tl.constexpr,
    MAGIC: tl.constexpr,
    BIAS: tl.constexpr,
    IS_BF16: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_M: tl.constexpr,
):
    # Tiles of x [BLOCK_M, BLOCK_K] times raw codes [BLOCK_K, BLOCK_N] on the tensor cores;
    # scale and offset are applied to the partial product of each tile (one group per tile).
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = _tile_coords(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_x_m
    x32_ptrs = x32_ptr + offs_m[:, None] * stride_x32_m
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_w = tl.multiple_of(k0 // 8, BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
        q = _load_words(qw_ptr, offs_n, offs_w, n_mask, stride_qw_n, K, EVEN_N, EVEN_K)
        if NIBBLE:
            part = tl.zeros(acc.shape, dtype=tl.float32)
            x_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
            part, x_sum = _nibble_mma(
                q,
                x_ptrs,
                x32_ptrs,
                offs_w,
                m_mask,
                k_end,
                part,
                x_sum,
                MAGIC,
                IS_BF16,
                EVEN_M and EVEN_K,
            )
            if MAGIC != 0:
                part -= BIAS * x_sum[:, None]  # the codes were bias + n
        else:
            offs_k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(
                x_ptrs + offs_k[None, :],
                mask=m_mask[:, None] & (offs_k[None, :] < k_end),
                other=0.0,
            )
            qv = _unpack(q).to(x.dtype)
            if IEEE:
                part = tl.dot(x, tl.trans(qv), input_precision="ieee")
            else:
                part = tl.dot(x, tl.trans(qv))
            x_sum = tl.sum(x.to(tl.float32), axis=1)
        g = k0 // group_size
        s, o = _group_scales(s_ptr, o_ptr, g * stride_s_g, offs_n, n_mask, EVEN_N)
        acc += part * s[None, :] + x_sum[:, None] * o[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    _epilogue(
        acc,
        out_ptr + offs_m[:, None] * stride_out_m + offs_n[None, :],
        ws_ptr + offs_m[:, None] * N + offs_n[None, :],
        mask,
        lock_ptr,
        pid,
        num_splits,
        MODE,
        pid_k,
        M * N,
    )


_TILED = FastLaunch(_int4_gemm_kernel)


@triton.jit
def _mm_step(
    acc,
    q,
    x_ptrs,
    k0,
    K,
    m_mask,
    s_ptr,
    o_ptr,
    s_row,
    offs_n,
    n_mask,
    BLOCK_K,
    IEEE,
    MAGIC_DQ: tl.constexpr,
    SWAP: tl.constexpr,
    EVEN_N,
    EVEN_K,
    ASM: tl.constexpr,
):
    """acc += x[:, k0:k0+BLOCK_K] @ dequant(q)^T (acc [BM, BN]), or its transpose with SWAP
    (acc [BN, BM]: the dequantized weight is the left operand, kept in registers).

    ASM (16-bit x, CUDA): the tile is dequantized by inline PTX two weights at a time
    (``_dequant_asm``); with SWAP its K positions are permuted within each word (the order of
    a register operand) and x is read in that order."""
    offs_k = tl.multiple_of(k0, BLOCK_K) + tl.arange(0, BLOCK_K)
    if EVEN_K:
        x = tl.load(x_ptrs + offs_k[None, :], mask=m_mask[:, None], other=0.0)
    else:
        x = tl.load(
            x_ptrs + offs_k[None, :], mask=m_mask[:, None] & (offs_k[None, :] < K), other=0.0
        )
    s, o = _group_scales(s_ptr, o_ptr, s_row, offs_n, n_mask, EVEN_N)
    if ASM:
        w = _dequant_asm(q, s.to(x.dtype), o.to(x.dtype), SWAP)
        if SWAP:
            x = _asm_k_order(x)
    elif MAGIC_DQ:
        w = _dequant_words(q, s, o, x.dtype)
    else:
        w = (_unpack(q).to(tl.float32) * s[:, None] + o[:, None]).to(x.dtype)
    if SWAP:
        if IEEE:
            acc = tl.dot(w, tl.trans(x), acc=acc, input_precision="ieee")
        else:
            acc = tl.dot(w, tl.trans(x), acc=acc)
    else:
        if IEEE:
            acc = tl.dot(x, tl.trans(w), acc=acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc=acc)
    return acc


@triton.jit
def _int4_mm_kernel(
    x_ptr,
    qw_ptr,
    s_ptr,
    o_ptr,
    out_ptr,
    ws_ptr,
    lock_ptr,
    M,
    N,
    K,
    group_size,
    k_per_split,
    num_splits,
    stride_x_m,
    stride_qw_n,
    stride_s_g,
    stride_out_m,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    MODE: tl.constexpr,
    IEEE: tl.constexpr,
    MAGIC_DQ: tl.constexpr,
    SWAP: tl.constexpr,
    PIPELINED: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_K: tl.constexpr,
    ASM: tl.constexpr,
):
    # Each weight tile is dequantized in registers to x's dtype (one group per tile; codes by
    # the magic-number trick with MAGIC_DQ, else unpacked and converted) and fed to one
    # accumulating tl.dot chain, as in a plain GEMM. PIPELINED: tl.range streams the packed
    # words through shared memory (NUM_STAGES deep); else the words of the next tile are
    # loaded into registers before the current product.
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = _tile_coords(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    if SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    x_ptrs = x_ptr + offs_m[:, None] * stride_x_m
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    if PIPELINED:
        for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
            offs_w = tl.multiple_of(k0 // 8, BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
            q = _load_words(qw_ptr, offs_n, offs_w, n_mask, stride_qw_n, K, EVEN_N, EVEN_K)
            acc = _mm_step(
                acc,
                q,
                x_ptrs,
                k0,
                K,
                m_mask,
                s_ptr,
                o_ptr,
                (k0 // group_size) * stride_s_g,
                offs_n,
                n_mask,
                BLOCK_K,
                IEEE,
                MAGIC_DQ,
                SWAP,
                EVEN_N,
                EVEN_K,
                ASM,
            )
    else:
        offs_w = tl.multiple_of(k_start // 8, BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
        q_next = _load_words(qw_ptr, offs_n, offs_w, n_mask, stride_qw_n, K, EVEN_N, EVEN_K)
        for k0 in range(k_start, k_end, BLOCK_K):
            q = q_next
            offs_w = tl.multiple_of((k0 + BLOCK_K) // 8, BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
            q_next = tl.load(
                qw_ptr + offs_n[:, None] * stride_qw_n + offs_w[None, :],
                mask=n_mask[:, None] & (tl.full([1, BLOCK_K // 8], k0 + BLOCK_K, tl.int32) < k_end),
                other=0,
            )
            acc = _mm_step(
                acc,
                q,
                x_ptrs,
                k0,
                K,
                m_mask,
                s_ptr,
                o_ptr,
                (k0 // group_size) * stride_s_g,
                offs_n,
                n_mask,
                BLOCK_K,
                IEEE,
                MAGIC_DQ,
                SWAP,
                EVEN_N,
                EVEN_K,
                ASM,
            )
    if SWAP:
        mask = n_mask[:, None] & m_mask[None, :]
        out_ptrs = out_ptr + offs_m[None, :] * stride_out_m + offs_n[:, None]
        ws_ptrs = ws_ptr + offs_m[None, :] * N + offs_n[:, None]
    else:
        mask = m_mask[:, None] & n_mask[None, :]
        out_ptrs = out_ptr + offs_m[:, None] * stride_out_m + offs_n[None, :]
        ws_ptrs = ws_ptr + offs_m[:, None] * N + offs_n[None, :]
    _epilogue(acc, out_ptrs, ws_ptrs, mask, lock_ptr, pid, num_splits, MODE, pid_k, M * N)


_MM = FastLaunch(_int4_mm_kernel)


@triton.jit
def _int4_mm_tma_kernel(
    x_desc,  # TMA descriptor of x [M, K], block [BLOCK_M, BLOCK_K]
    qw_desc,  # TMA descriptor of the packed words [N, K // 8], block [BLOCK_N, BLOCK_K // 8]
    s_ptr,
    o_ptr,
    out_ptr,
    ws_ptr,
    lock_ptr,
    M,
    N,
    K,
    k_per_split,
    num_splits,
    stride_s_g,
    stride_out_m,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_TILES: tl.constexpr,  # K tiles per quantization group; 0: one group (per channel)
    GROUP_M: tl.constexpr,
    MODE: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    EVEN_N: tl.constexpr,
    SWAP: tl.constexpr,
):
    # The mm kernel's asm path with both operand tiles fetched by the TMA engine (no
    # per-thread addresses; rows and columns past M, N, K read as 0), K tiles within one
    # quantization group. SWAP: acc [BN, BM] += dequant(W tile) @ x tile^T, the weight a
    # register operand (K permuted within words in both). Else acc [BM, BN] += x tile @
    # dequant(W tile)^T in K order: x feeds the MMA from the TMA buffer in shared memory, and
    # the dequantized tile is stored there once (large M).
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = _tile_coords(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    if SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        q = qw_desc.load([pid_n * BLOCK_N, k0 // 8])
        x = x_desc.load([pid_m * BLOCK_M, k0])
        row = 0 if GROUP_TILES == 0 else (k0 // BLOCK_K) // GROUP_TILES
        s, o = _group_scales(s_ptr, o_ptr, row * stride_s_g, offs_n, n_mask, EVEN_N)
        w = _dequant_asm(q, s.to(x.dtype), o.to(x.dtype), SWAP)
        if SWAP:
            acc = tl.dot(w, tl.trans(_asm_k_order(x)), acc=acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc=acc)
    if SWAP:
        mask = n_mask[:, None] & (offs_m < M)[None, :]
        out_ptrs = out_ptr + offs_m[None, :] * stride_out_m + offs_n[:, None]
        ws_ptrs = ws_ptr + offs_m[None, :] * N + offs_n[:, None]
    else:
        mask = (offs_m < M)[:, None] & n_mask[None, :]
        out_ptrs = out_ptr + offs_m[:, None] * stride_out_m + offs_n[None, :]
        ws_ptrs = ws_ptr + offs_m[:, None] * N + offs_n[None, :]
    _epilogue(acc, out_ptrs, ws_ptrs, mask, lock_ptr, pid, num_splits, MODE, pid_k, M * N)


@triton.jit
def _int4_dequant_kernel(
    qw_ptr,
    s_ptr,
    o_ptr,
    out_ptr,
    N,
    K,
    group_size,
    stride_qw_n,
    stride_s_g,
    stride_out_n,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FRAG: tl.constexpr,
    TILED: tl.constexpr = False,
):
    # Writes dequant(W) [N, K] in the output dtype, for the cuBLAS path at large M.
    # BLOCK_K divides group_size (or K is one group): one scale per row of the tile.
    # FRAG (fragment-ordered words, BLOCK_K = 128): code j of word w of the tile is column
    # 32b + 16c + 8e + 2t + h with w = 4t + b, j = 4h + 2c + e (int4_weight.frag_order); the
    # tile is put in column order in registers, so the stores stay contiguous. TILED (with
    # FRAG, words in int4_weight.tile_order): row n's tile t is 16 words at 256 (T (n // 16)
    # + t) + 16 (n % 16), T = K // 128 tiles per row.
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    offs_k = k0 + tl.arange(0, BLOCK_K)
    offs_w = tl.multiple_of(k0 // 8, BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
    n_mask = offs_n < N
    if TILED:
        rows = (offs_n // 16) * (16 * stride_qw_n) + (offs_n % 16) * 16 + 16 * k0 // 8
        ptrs = qw_ptr + rows[:, None] + tl.arange(0, BLOCK_K // 8)[None, :]
    else:
        ptrs = qw_ptr + offs_n[:, None] * stride_qw_n + offs_w[None, :]
    q = tl.load(ptrs, mask=n_mask[:, None] & (offs_w[None, :] < K // 8), other=0)
    g = k0 // group_size
    s = tl.load(s_ptr + g * stride_s_g + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    o = tl.load(o_ptr + g * stride_s_g + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    w = _unpack(q).to(tl.float32) * s[:, None] + o[:, None]
    if FRAG:  # [n, t, b, h, c, e] -> [n, b, c, e, t, h]
        w = tl.reshape(w, [BLOCK_N, 4, 4, 2, 2, 2])
        w = tl.reshape(tl.permute(w, (0, 2, 4, 5, 1, 3)), [BLOCK_N, BLOCK_K])
    mask = n_mask[:, None] & (offs_k[None, :] < K)
    tl.store(
        out_ptr + offs_n[:, None] * stride_out_n + offs_k[None, :],
        w.to(out_ptr.dtype.element_ty),
        mask=mask,
    )


_DEQUANT = FastLaunch(_int4_dequant_kernel)


# 16-bit float bit patterns of 1024.0 (fp16) and 128.0 (bf16): MAGIC | n is bias + n exactly.
_MAGIC = {torch.float16: 0x6400, torch.bfloat16: 0x4300}
_BIAS = {torch.float16: 1024.0, torch.bfloat16: 128.0}


def _check(x: torch.Tensor, weight: Int4Weight) -> None:
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be fp16, bf16 or fp32, got {x.dtype}")
    if x.shape[-1] != weight.in_features:
        raise ValueError(f"x has {x.shape[-1]} input features, the weight {weight.in_features}")


def dequantize_int4_triton(weight: Int4Weight, dtype: torch.dtype) -> torch.Tensor:
    """dequant(W) [N, K] in ``dtype`` through the Triton dequant kernel (K in stored order)."""
    n, k = weight.out_features, weight.in_features
    out = torch.empty((n, k), dtype=dtype, device=weight.qweight.device)
    g = weight.group_size
    block_n, block_k = 32, 128 if g == k or g % 128 == 0 else g  # 128 for a fragment order
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, block_k))
    _DEQUANT[grid](
        weight.qweight,
        weight.scales,
        weight.offsets,
        out,
        n,
        k,
        weight.group_size,
        weight.qweight.stride(0),
        weight.scales.stride(0),
        out.stride(0),
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        FRAG=weight.frag,
        TILED=weight.tiled,
    )
    return out


def int4_gemm(
    x: torch.Tensor,
    weight: Int4Weight,
    bias: torch.Tensor | None = None,
    config: Int4GemmConfig | None = None,
) -> torch.Tensor:
    """``x @ dequant(weight)^T (+ bias)`` on the Triton kernels.

    x: [..., K] fp16/bf16/fp32; weight: ``Int4Weight`` with N outputs; bias: [N] or None.
    Returns [..., N] in x's dtype. ``config`` overrides the table (tests, benchmarks). With
    the table, where the swapped wgmma kernel applies (16-bit x on sm_90+), x of a few rows
    past a multiple of 256 may run as two calls, the rows up to the multiple and the rest,
    joined (``split_rows``).
    """
    _check(x, weight)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if weight.in_perm is not None:
        x2 = x2.index_select(1, weight.in_perm)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, k = x2.shape
    n = weight.out_features
    g = weight.group_size
    main = 0 if config is not None else split_rows(m, n, k, g, x2.device, weight.frag)
    # the cost model is of the swapped wgmma kernel (16-bit x on sm_90+, K tiles of 128);
    # asked only where a split is wanted (a lookup per eager call, not the TMA checks)
    if main and (int4_wgmma is None or not wgmma_swap_ok(x2, weight, 128)):
        main = 0
    if main:
        out = torch.cat([_gemm_2d(x2[:main], weight, None), _gemm_2d(x2[main:], weight, None)])
    else:
        out = _gemm_2d(x2, weight, config)
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, n)


def _gemm_2d(x2: torch.Tensor, weight: Int4Weight, config: Int4GemmConfig | None) -> torch.Tensor:
    """``int4_gemm`` on 2-D x in the weight's K order, in one call: ``config`` or the
    table's."""
    m, k = x2.shape
    cfg = config or choose_config(
        m, weight.out_features, k, weight.group_size, x2.device, frag=weight.frag
    )
    if weight.frag and not (
        cfg.strategy in ("dequant", "mma") or cfg.strategy == "wgmma" and cfg.swap
    ):
        raise ValueError(
            "fragment-ordered weights (Int4Weight.frag) run on the swapped wgmma kernel, the "
            f"register mma kernel or dequantize + cuBLAS; got strategy {cfg.strategy!r} "
            f"(swap={cfg.swap})"
        )
    if cfg.strategy == "dequant":
        return torch.nn.functional.linear(x2, dequantize_int4_triton(weight, x2.dtype))
    return _launch(x2, weight, cfg)


def frag_preferred(weight: Int4Weight) -> bool:
    """Whether ``weight`` should be held in fragment order (``Int4Weight.to_frag``): on an
    sm_90+ GPU whose Triton has Gluon, with groups of 128 or more and scale rows TMA can
    address (N a multiple of 8). There the table runs fragment-ordered words on the register
    mma kernel at M = 1 for N <= 8192 (ahead of the gemv, which reads only canonical words;
    twelfth session of 2026-11-30) and on the swapped wgmma kernel from M = 2 and for wide
    weights, which leads or ties canonical words at every M it runs (``_frag_config``)."""
    return (
        int4_wgmma is not None
        and int4_mma is not None
        and is_sm90(weight.qweight.device)
        and weight.out_features % 8 == 0
        and frag_shape_ok(weight.in_features, weight.group_size)
    )


def device_form(weight: Int4Weight) -> Int4Weight:
    """``weight`` in the word order the engine holds it in on its device: where
    ``frag_preferred``, fragment order, and with N a multiple of 16 also ``tile_order``
    (every 16 rows by 128 K one 1 KB run, which the register mma kernel, the swapped wgmma
    kernel and the dequantizer read alike: on the H200 the mma kernel at M = 1-16 was 0.2-1.7
    us faster per call on Llama-3-8B shapes, BENCHMARKS.md, twenty-third session); else
    itself."""
    if weight.frag or not frag_preferred(weight):
        return weight
    return weight.to_frag(tiled=weight.out_features % 16 == 0)


def _sub_k(group_size: int) -> int:
    """K values of a gemv sub-group: the largest power of two dividing the group, <= 128."""
    return min(group_size & -group_size, 128)


def _with_pairs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, x viewed as int32 pairs along K) for 16-bit x (rows made even-strided), else
    (x, x): the nibble kernels read 16-bit activations two at a time."""
    if x.dtype not in _MAGIC:
        return x, x
    if x.stride(0) % 2:
        x = x.contiguous()
    return x, x.view(torch.int32)


@functools.cache  # the eager launcher asks on every call; callers only unpack the dict
def mma_kwargs(cfg: Int4GemmConfig) -> dict:
    """The ``int4_mma`` arguments of an ``mma`` config (``num_stages`` is the words' tiles
    ahead: in registers, or with ``w_ring`` in x's shared ring of ``num_stages`` + 1)."""
    return dict(
        block_m=cfg.block_m, num_warps=cfg.num_warps, split_k=cfg.split_k,
        depth=1 if cfg.w_ring else cfg.num_stages, pdl=cfg.pdl,
        weights_first=cfg.weights_first, wsplit=cfg.wsplit, row_tiles=cfg.row_tiles,
        x_smem=cfg.x_smem, row_warps=cfg.row_warps, maxnreg=cfg.maxnreg, scaled=cfg.scaled,
        s_ahead=cfg.s_ahead, w_ring=cfg.w_ring, x_stages=cfg.num_stages + 1 if cfg.w_ring else 2,
    )  # fmt: skip


def _launch_mma(x: torch.Tensor, weight: Int4Weight, cfg: Int4GemmConfig) -> torch.Tensor:
    """The register mma kernel on fragment-ordered words (its view of them made once per
    weight, ``Int4Weight.memo``); where it does not apply (no Gluon, canonical words, fp32 x,
    pre-sm_80), the swapped kernel's tiling for that M (fragment order, ``_narrow_swap``) or
    the table's choice for canonical words. Fragment order itself guarantees groups of a
    multiple of 128 or one per row."""
    g, k = weight.group_size, weight.in_features
    if int4_mma is not None and weight.frag and int4_mma_ok(x):
        view = weight.memo.get(("mma",))
        if view is None:  # the words in place; x already gathered by in_perm (act-order)
            view = Int4MmaWeight(
                weight.qweight, weight.scales, weight.offsets, g, False, weight.tiled
            )
            weight.memo["mma",] = view
        return int4_mma(x, view, **mma_kwargs(cfg))
    m, n = x.shape[0], weight.out_features
    if weight.frag:
        return _launch(x, weight, _narrow_swap(m, n, k, frag=True))
    return _launch(x, weight, choose_config(m, n, k, g, x.device))


def _launch(x: torch.Tensor, weight: Int4Weight, cfg: Int4GemmConfig) -> torch.Tensor:
    if cfg.strategy == "mma":
        return _launch_mma(x, weight, cfg)
    if cfg.strategy == "gemv":
        return _launch_gemv(x, weight, cfg)
    if cfg.strategy == "tiled":
        return _launch_tiled(x, weight, cfg)
    if cfg.strategy == "mm":
        return _launch_mm(x, weight, cfg)
    if cfg.strategy == "wgmma":
        if cfg.swap and int4_wgmma is not None and wgmma_swap_ok(x, weight, cfg.block_k):
            m = x.shape[0]
            pad = pad_rows(m, cfg, x.shape[1])
            if pad:  # whole x tiles (``pad_rows``); a row past M reaches only its own output
                # row, which is cut off, so the added rows are left as they come
                x_pad = x.new_empty(m + pad, x.shape[1])
                x_pad[:m].copy_(x)
                x = x_pad
            out = int4_wgmma_swap(
                x, weight, cfg.block_m, cfg.block_n, cfg.block_k, cfg.split_k, cfg.num_stages,
                cfg.num_warps, cfg.specialized, pipe=cfg.pipe,
                pdl=3 if cfg.weights_first else cfg.pdl, maxnreg=cfg.maxnreg,
                vector_store=cfg.vector_store, wsplit=cfg.wsplit,
                thread_release=cfg.thread_release, early_ticket=cfg.early_ticket,
            )  # fmt: skip
            return out[:m] if pad else out
        # fp32 x, unaligned rows, pre-sm_90: only the dequantizer reads fragment-ordered words,
        # and above M = 256 it is what the table took before the swapped kernel ran there
        if weight.frag or x.shape[0] > 256:
            return torch.nn.functional.linear(x, dequantize_int4_triton(weight, x.dtype))
        if not cfg.swap and int4_wgmma is not None and wgmma_ok(x, weight, cfg.block_k):
            return int4_wgmma(
                x, weight, cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_stages, cfg.num_warps
            )
        return _launch_mm(x, weight, wgmma_fallback(cfg))
    raise ValueError(f"unknown strategy {cfg.strategy!r}; allowed: {', '.join(STRATEGIES)}")


def _launch_gemv(x: torch.Tensor, weight: Int4Weight, cfg: Int4GemmConfig) -> torch.Tensor:
    m, k = x.shape
    n, g = weight.out_features, weight.group_size
    sub_k = min(_sub_k(g), cfg.block_k)
    num_sub = cfg.block_k // sub_k
    num_subs = k // sub_k
    subs_per_split = triton.cdiv(triton.cdiv(num_subs, cfg.split_k), num_sub) * num_sub
    num_splits = triton.cdiv(num_subs, subs_per_split)
    num_pid_n = triton.cdiv(n, cfg.block_n)
    mode, out, ws, locks = split_k_output(x, m, n, num_splits, m * num_pid_n)
    x, x32 = _with_pairs(x)
    pdl = cfg.pdl and has_pdl(x.device)
    l2 = pdl and cfg.l2_prefetch and _bulk_prefetch_ok(weight, cfg.block_n, sub_k)
    fold = 0  # 1: the fold decode in Triton, 2: in inline PTX (CUDA)
    if cfg.fold and x.dtype in _MAGIC:
        fold = 2 if cfg.asm and x.device.type == "cuda" else 1
    _GEMV[(num_pid_n, num_splits, m)](
        x,
        x32,
        weight.qweight,
        weight.scales,
        weight.offsets,
        out,
        ws,
        locks,
        n,
        k,
        g,
        subs_per_split,
        num_splits,
        x.stride(0),
        x32.stride(0),
        weight.qweight.stride(0),
        weight.scales.stride(0),
        out.stride(0),
        BLOCK_N=cfg.block_n,
        SUB_W=sub_k // 8,
        NUM_SUB=num_sub,
        NUM_STAGES=cfg.num_stages,
        MODE=mode,
        X16=x.dtype in _MAGIC,
        IS_BF16=x.dtype == torch.bfloat16,
        EVEN_N=n % cfg.block_n == 0,
        EVEN_K=num_subs % subs_per_split == 0,
        FOLD=fold,
        PREFETCH=cfg.prefetch,
        PDL=pdl,
        L2_PREFETCH=l2,
        NUM_G=triton.next_power_of_2(triton.cdiv(subs_per_split * sub_k, g) + 1) if l2 else 1,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **({"launch_pdl": True} if pdl else {}),
    )
    return out.to(x.dtype) if mode == 1 else out


def _bulk_prefetch_ok(weight: Int4Weight, block_n: int, sub_k: int) -> bool:
    """Whether the gemv's bulk L2 prefetches apply: every row of words, scales and offsets a
    program prefetches starts 16-byte aligned and spans a multiple of 16 bytes (looked up
    once per weight and tiling: the launcher asks on every eager call)."""
    key = ("bulk_prefetch_ok", block_n, sub_k)
    ok = weight.memo.get(key)
    if ok is None:
        qw, s, o = weight.qweight, weight.scales, weight.offsets
        n = weight.out_features
        ok = (
            n >= block_n
            and qw.data_ptr() % 16 == 0
            and qw.stride(1) == 1
            and (qw.stride(0) * 4) % 16 == 0
            and (sub_k // 2) % 16 == 0
            and all(
                t.data_ptr() % 16 == 0
                and t.stride(1) == 1
                and (t.stride(0) * t.element_size()) % 16 == 0
                and (block_n * t.element_size()) % 16 == 0
                and (n * t.element_size()) % 16 == 0
                for t in (s, o)
            )
            and s.element_size() == o.element_size()
        )
        weight.memo[key] = ok
    return ok


def _launch_tiled(x: torch.Tensor, weight: Int4Weight, cfg: Int4GemmConfig) -> torch.Tensor:
    m, k = x.shape
    n, g = weight.out_features, weight.group_size
    block_k = cfg.block_k if g == k else min(cfg.block_k, g)
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), block_k) * block_k
    num_splits = triton.cdiv(k, k_per_split)
    num_tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    mode, out, ws, locks = split_k_output(x, m, n, num_splits, num_tiles, slots=True)
    nibble = cfg.nibble and block_k >= 128  # tl.dot needs K >= 16 words
    x, x32 = _with_pairs(x)
    _TILED[(num_tiles, num_splits)](
        x,
        x32,
        weight.qweight,
        weight.scales,
        weight.offsets,
        out,
        ws,
        locks,
        m,
        n,
        k,
        g,
        k_per_split,
        num_splits,
        x.stride(0),
        x32.stride(0),
        weight.qweight.stride(0),
        weight.scales.stride(0),
        out.stride(0),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=block_k,
        GROUP_M=8,
        MODE=mode,
        IEEE=x.dtype == torch.float32,
        NIBBLE=nibble,
        MAGIC=_MAGIC.get(x.dtype, 0),
        BIAS=_BIAS.get(x.dtype, 0.0),
        IS_BF16=x.dtype == torch.bfloat16,
        EVEN_N=n % cfg.block_n == 0,
        EVEN_K=k % block_k == 0,
        EVEN_M=m % cfg.block_m == 0,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out.to(x.dtype) if mode == 1 else out


def _tma_ok(x: torch.Tensor, weight: Int4Weight, cfg: Int4GemmConfig, block_k: int) -> bool:
    """Whether the TMA variant applies: ``cfg.tma`` with ``asm``, and ``tma_tiles_ok``."""
    return cfg.tma and cfg.asm and tma_tiles_ok(x, weight, block_k)


def _launch_mm(x: torch.Tensor, weight: Int4Weight, cfg: Int4GemmConfig) -> torch.Tensor:
    m, k = x.shape
    n, g = weight.out_features, weight.group_size
    block_k = cfg.block_k if g == k else min(cfg.block_k, g)
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), block_k) * block_k
    num_splits = triton.cdiv(k, k_per_split)
    num_tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    mode, out, ws, locks = split_k_output(x, m, n, num_splits, num_tiles, slots=True)
    if _tma_ok(x, weight, cfg, block_k):
        _int4_mm_tma_kernel[(num_tiles, num_splits)](
            TensorDescriptor.from_tensor(x, [cfg.block_m, block_k]),
            TensorDescriptor.from_tensor(weight.qweight, [cfg.block_n, block_k // 8]),
            weight.scales,
            weight.offsets,
            out,
            ws,
            locks,
            m,
            n,
            k,
            k_per_split,
            num_splits,
            weight.scales.stride(0),
            out.stride(0),
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=block_k,
            GROUP_TILES=0 if g == k else g // block_k,
            GROUP_M=8,
            MODE=mode,
            NUM_STAGES=cfg.num_stages,
            EVEN_N=n % cfg.block_n == 0,
            SWAP=cfg.swap,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
        return out.to(x.dtype) if mode == 1 else out
    _MM[(num_tiles, num_splits)](
        x,
        weight.qweight,
        weight.scales,
        weight.offsets,
        out,
        ws,
        locks,
        m,
        n,
        k,
        g,
        k_per_split,
        num_splits,
        x.stride(0),
        weight.qweight.stride(0),
        weight.scales.stride(0),
        out.stride(0),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=block_k,
        GROUP_M=8,
        MODE=mode,
        IEEE=x.dtype == torch.float32,
        MAGIC_DQ=cfg.magic,
        SWAP=cfg.swap,
        PIPELINED=cfg.pipelined,
        NUM_STAGES=cfg.num_stages,
        EVEN_N=n % cfg.block_n == 0,
        EVEN_K=k % block_k == 0,
        ASM=cfg.asm and x.dtype in _MAGIC and x.device.type == "cuda",
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out.to(x.dtype) if mode == 1 else out


def dequantize_int4(weight: Int4Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """dequant(W) [N, K] in plain PyTorch, columns in the ORIGINAL input order.

    For an act-order weight the stored columns follow ``in_perm``; they are scattered back so
    that ``x @ dequantize_int4(w).T`` needs no gather.
    """
    n, k, g = weight.out_features, weight.in_features, weight.group_size
    qweight = weight.to_canonical().qweight
    codes = unpack_words(qweight).reshape(n, k).float()
    scales = weight.scales.float().t().repeat_interleave(g, dim=1)
    offsets = weight.offsets.float().t().repeat_interleave(g, dim=1)
    w = codes * scales + offsets
    if weight.in_perm is not None:
        w = torch.empty_like(w).index_copy_(1, weight.in_perm, w)
    return w.to(dtype)


def int4_gemm_ref(
    x: torch.Tensor,
    weight: Int4Weight,
    bias: torch.Tensor | None = None,
    config: Int4GemmConfig | None = None,
) -> torch.Tensor:
    """Reference: dequantize in fp32, matmul in fp32, cast to x's dtype.

    x: [..., K]; weight: ``Int4Weight`` [N outputs]; bias: [N] or None -> [..., N].
    ``config`` is accepted for signature parity and ignored.
    """
    _check(x, weight)
    y = x.float() @ dequantize_int4(weight).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
