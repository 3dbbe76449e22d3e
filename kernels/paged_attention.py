"""Attention over the paged KV cache for one step's flattened batch.

Contract (DESIGN.md): ``key_cache``/``value_cache`` are
``[num_blocks, block_size, num_kv_heads, head_dim]``; a step's tokens are flattened, sequence
``i`` owning query rows ``query_start_loc[i]:query_start_loc[i+1]``; ``seq_lens[i]`` is its
context length after this step's tokens were written to the cache, so its new tokens sit at
positions ``seq_lens[i] - q_len_i ... seq_lens[i] - 1``.

The Triton kernel tiles the flattened query rows into blocks of ``BLOCK_Q`` tokens of one
sequence; a block carries all ``group`` query heads that share one KV head (``BLOCK_M =
BLOCK_Q * group_pad`` rows), so each K/V tile is read once per group. A program finds its
sequence by binary search over ``query_start_loc`` (the grid never depends on a host read).
A decode-only step (one new token per sequence) takes a second kernel whose program id names
its (KV heads, split, sequence) directly. For decode with few sequences, each sequence's KV
range is split across ``num_kv_splits`` programs whose partial results are merged with
log-sum-exp, by a third kernel or (few splits) by the last of the splits to finish.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.launch import FastLaunch
from kernels.pdl import chain_launch, has_pdl, num_sms
from kernels.scratch import zeroed_int32

_LOG2E = 1.4426950408889634
# Decode splits the KV range until the (sequence, KV head) programs number more than
# _MIN_PROGRAMS_PER_SM per SM, then further while they stay within _SPLIT_PROGRAMS_PER_SM per
# SM and each split keeps _LONG_SPLIT positions; no split is shorter than _MIN_SPLIT positions
# (fitted on the H200 at batch 1-32 x context 512-8192: BENCHMARKS.md).
_MIN_PROGRAMS_PER_SM = 1.5
_SPLIT_PROGRAMS_PER_SM = 4
_LONG_SPLIT = 512
# With K/V by TMA a program's fixed cost is smaller, and on the H200 shorter splits were
# faster wherever they kept few programs per SM (twentieth session, `bench_decode_splits.py`,
# BENCHMARKS.md, us layered): 64 positions (1 x 8192: 64 splits 14.1 against 15.4 for 32; 16 x
# 512: 4 splits 13.6 against 15.2 for 2; 4 x 1024: 16 splits 9.0 against 10.0 for 8; 8 x 512:
# 8 splits 9.2 against 10.0 for 4, though 12 x 512 lost 0.4 us at 8) ...
_LONG_SPLIT_TMA = 64
# ... up to 6 programs per SM (12 x 8192 with 8 splits 102.6 against 106.6 with 4, 24 x 2048
# with 4 56.1 against 57.5; 16 x 2048 with 8, 7.8 per SM, lost 0.5 us) ...
_SPLIT_PROGRAMS_PER_SM_TMA = 6
# ... and none shorter than 32 positions (1 x 512: 16 splits 5.3 against 6.3 for 8).
_MIN_SPLIT_TMA = 32
_MIN_SPLIT = 64
_MAX_KV_SPLITS = 64


@triton.jit
def _attend_tile(
    acc,
    m_i,
    l_i,
    q,
    q_pos,
    kv_start,
    seq_len,
    sliding_window,
    scale_log2,
    k_head_ptr,
    v_head_ptr,
    block_table_ptr,
    stride_k_b,
    stride_k_s,
    stride_k_d,
    stride_v_b,
    stride_v_s,
    stride_v_d,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_MASKED: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    IS_FP32: tl.constexpr,
):
    offs_n = kv_start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_valid = offs_d < HEAD_DIM
    if IS_MASKED:
        kv_valid = offs_n < seq_len
        block_ids = tl.load(block_table_ptr + offs_n // BLOCK_SIZE, mask=kv_valid, other=0)
    else:
        kv_valid = offs_n >= 0
        block_ids = tl.load(block_table_ptr + offs_n // BLOCK_SIZE)
    block_ids = block_ids.to(tl.int64)
    in_block = offs_n % BLOCK_SIZE
    k_off = block_ids * stride_k_b + in_block * stride_k_s  # [BLOCK_N]
    v_off = block_ids * stride_v_b + in_block * stride_v_s
    k = tl.load(
        k_head_ptr + k_off[None, :] + offs_d[:, None] * stride_k_d,
        mask=kv_valid[None, :] & d_valid[:, None],
        other=0.0,
    )  # [HEAD_DIM_PAD, BLOCK_N]
    if IS_FP32:
        s = tl.dot(q, k, input_precision="ieee")
    else:
        s = tl.dot(q, k)
    s = s * scale_log2  # [BLOCK_M, BLOCK_N], log2 domain
    if IS_MASKED:
        allowed = (offs_n[None, :] <= q_pos[:, None]) & kv_valid[None, :]
        if HAS_WINDOW:
            allowed = allowed & (offs_n[None, :] > q_pos[:, None] - sliding_window)
        s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row that has seen no key yet keeps m = -inf; shift by 0 so exp2 gives 0, not NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(
        v_head_ptr + v_off[:, None] + offs_d[None, :] * stride_v_d,
        mask=kv_valid[:, None] & d_valid[None, :],
        other=0.0,
    )  # [BLOCK_N, HEAD_DIM_PAD]
    if IS_FP32:
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    acc = acc * alpha[:, None] + pv
    return acc, m_new, l_i


@triton.jit
def _paged_attention_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]
    part_out_ptr,  # [num_tokens, num_heads, NUM_SPLITS, HEAD_DIM_PAD] fp32 (NUM_SPLITS > 1)
    part_lse_ptr,  # [num_tokens, num_heads, NUM_SPLITS] fp32, log2 domain
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    scale_log2,
    num_seqs,
    sliding_window,
    stride_q_t,
    stride_q_h,
    stride_q_d,
    stride_o_t,
    stride_o_h,
    stride_o_d,
    stride_k_b,
    stride_k_s,
    stride_k_h,
    stride_k_d,
    stride_v_b,
    stride_v_s,
    stride_v_h,
    stride_v_d,
    stride_bt_s,
    stride_bt_b,
    stride_po_t,
    stride_po_h,
    stride_po_s,
    stride_pl_t,
    stride_pl_h,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    IS_FP32: tl.constexpr,
):
    q_block_idx = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # Sequence s owns the q blocks from query_start_loc[s] // BLOCK_Q + s on (an upper bound on
    # the blocks of the sequences before it): binary-search the last s starting at or before
    # this program's block. (Inline: the interpreter pays for every nested jit call.)
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= q_block_idx:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block_local = q_block_idx - (q_start // BLOCK_Q + seq)
    if q_block_local * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    first_new_pos = seq_len - q_len

    # Row r of the tile is token r // GROUP_PAD of this block, query head r % GROUP_PAD of
    # this KV head's group.
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    tok = q_block_local * BLOCK_Q + offs_m // GROUP_PAD
    head_in_group = offs_m % GROUP_PAD
    row_valid = (tok < q_len) & (head_in_group < GROUP)
    head = kv_head * GROUP + head_in_group
    q_pos = first_new_pos + tok
    row = (q_start + tok).to(tl.int64)
    row_mask = row_valid[:, None] & (offs_d < HEAD_DIM)[None, :]
    q_ptrs = q_ptr + row[:, None] * stride_q_t + head[:, None] * stride_q_h
    q = tl.load(q_ptrs + offs_d[None, :] * stride_q_d, mask=row_mask, other=0.0)

    # KV positions this block needs: [kv_lo, kv_hi), cut into tiles, the tiles cut into splits.
    min_pos = first_new_pos + q_block_local * BLOCK_Q
    kv_hi = tl.minimum(min_pos + BLOCK_Q, seq_len)
    kv_lo = 0
    if HAS_WINDOW:
        kv_lo = tl.maximum(min_pos - sliding_window + 1, 0) // BLOCK_N * BLOCK_N
    num_tiles = (kv_hi - kv_lo + BLOCK_N - 1) // BLOCK_N
    tiles_per_split = (num_tiles + NUM_SPLITS - 1) // NUM_SPLITS
    tile_begin = tl.minimum(split * tiles_per_split, num_tiles)
    tile_end = tl.minimum(tile_begin + tiles_per_split, num_tiles)
    kv_begin = kv_lo + tile_begin * BLOCK_N
    kv_end = kv_lo + tile_end * BLOCK_N
    # Tiles wholly at or before the block's first query position need no mask.
    if HAS_WINDOW:
        kv_mid = kv_begin
    else:
        kv_mid = tl.minimum(tl.maximum((min_pos + 1) // BLOCK_N * BLOCK_N, kv_begin), kv_end)

    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    k_head_ptr = k_cache_ptr + kv_head * stride_k_h
    v_head_ptr = v_cache_ptr + kv_head * stride_v_h
    table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_s
    for kv_start in range(kv_begin, kv_mid, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_pos, kv_start, seq_len, sliding_window, scale_log2,
            k_head_ptr, v_head_ptr, table_ptr, stride_k_b, stride_k_s, stride_k_d,
            stride_v_b, stride_v_s, stride_v_d, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, BLOCK_N,
            False, HAS_WINDOW, IS_FP32,
        )  # fmt: skip
    for kv_start in range(kv_mid, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_pos, kv_start, seq_len, sliding_window, scale_log2,
            k_head_ptr, v_head_ptr, table_ptr, stride_k_b, stride_k_s, stride_k_d,
            stride_v_b, stride_v_s, stride_v_d, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, BLOCK_N,
            True, HAS_WINDOW, IS_FP32,
        )  # fmt: skip

    has_keys = l_i > 0.0
    o = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if NUM_SPLITS == 1:
        out_ptrs = (
            out_ptr + row[:, None] * stride_o_t + head[:, None] * stride_o_h
            + offs_d[None, :] * stride_o_d
        )  # fmt: skip
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_mask)
    else:
        part_ptrs = (
            part_out_ptr + row[:, None] * stride_po_t + head[:, None] * stride_po_h
            + split * stride_po_s + offs_d[None, :]
        )  # fmt: skip
        tl.store(part_ptrs, o, mask=row_mask)
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        lse_ptrs = part_lse_ptr + row * stride_pl_t + head * stride_pl_h + split
        tl.store(lse_ptrs, lse, mask=row_valid)


_ATTENTION = FastLaunch(_paged_attention_kernel)


@triton.jit
def _decode_tile(
    acc,
    m_i,
    l_i,
    q,
    kv_start,
    seq_len,
    sliding_window,
    scale_log2,
    k_base_ptr,
    v_base_ptr,
    table_ptr,
    col_off_k,
    col_off_v,
    col_valid,
    stride_k_b,
    stride_k_s,
    stride_v_b,
    stride_v_s,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_COL_MASK: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    IS_FP32: tl.constexpr,
    IS_FULL: tl.constexpr,
):
    # One decode token's heads against positions kv_start + [0, BLOCK_N): a position is valid
    # below seq_len (and inside the window); the query sits at seq_len - 1, so no causal mask.
    # Column c of a K/V tile is element col_off_* [c] of a position's row of KV heads.
    # IS_FULL: every position of the tile is valid (no window), so no load is predicated.
    offs_n = kv_start + tl.arange(0, BLOCK_N)
    if IS_FULL:
        block_ids = tl.load(table_ptr + offs_n // BLOCK_SIZE)
    else:
        kv_valid = offs_n < seq_len
        if HAS_WINDOW:
            kv_valid = kv_valid & (offs_n >= seq_len - sliding_window)
        block_ids = tl.load(table_ptr + offs_n // BLOCK_SIZE, mask=kv_valid, other=0)
    block_ids = block_ids.to(tl.int64)
    in_block = offs_n % BLOCK_SIZE
    k_off = block_ids * stride_k_b + in_block * stride_k_s  # [BLOCK_N]
    v_off = block_ids * stride_v_b + in_block * stride_v_s
    k_ptrs = k_base_ptr + k_off[None, :] + col_off_k[:, None]  # [COLS, BLOCK_N]
    v_ptrs = v_base_ptr + v_off[:, None] + col_off_v[None, :]  # [BLOCK_N, COLS]
    if IS_FULL:
        if HAS_COL_MASK:
            k = tl.load(k_ptrs, mask=col_valid[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
    else:
        if HAS_COL_MASK:
            k_mask = kv_valid[None, :] & col_valid[:, None]
            v_mask = kv_valid[:, None] & col_valid[None, :]
        else:
            k_mask = kv_valid[None, :]
            v_mask = kv_valid[:, None]
        k = tl.load(k_ptrs, mask=k_mask, other=0.0)
    if IS_FP32:
        s = tl.dot(q, k, input_precision="ieee")
    else:
        s = tl.dot(q, k)
    if IS_FULL:
        s = s * scale_log2  # log2 domain
    else:
        s = tl.where(kv_valid[None, :], s * scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if IS_FULL:
        if HAS_COL_MASK:
            v = tl.load(v_ptrs, mask=col_valid[None, :], other=0.0)
        else:
            v = tl.load(v_ptrs)
    else:
        v = tl.load(v_ptrs, mask=v_mask, other=0.0)
    if IS_FP32:
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    acc = acc * alpha[:, None] + pv
    return acc, m_new, l_i


@triton.jit
def _tma_scores(
    q, k_desc, table_ptr, blk, col, seq_len, sliding_window, scale_log2,
    BLOCK_SIZE: tl.constexpr, HAS_WINDOW: tl.constexpr, IS_FP32: tl.constexpr,
):  # fmt: skip
    # Scores of one cache block (table entry blk) whose K rows come by TMA: [BLOCK_M,
    # BLOCK_SIZE]. The box starts `shift` rows before the block, shift being the block's rows
    # past the sequence, so those rows fall before row 0 and the TMA engine fills them with
    # zeros instead of reading them: box row c holds position blk * BLOCK_SIZE + c - shift,
    # and rows c < shift are masked here (a block wholly past the sequence is all fill, from
    # block 0). V's box (_tma_pv) is shifted the same way, so its rows past the sequence are
    # zeros too: stale values there, even NaN, never reach the output.
    rows = tl.arange(0, BLOCK_SIZE)
    in_block = tl.minimum(seq_len - blk * BLOCK_SIZE, BLOCK_SIZE)
    shift = BLOCK_SIZE - tl.maximum(in_block, 0)
    valid = rows >= shift
    if HAS_WINDOW:
        valid = valid & (blk * BLOCK_SIZE + rows - shift >= seq_len - sliding_window)
    block_id = tl.load(table_ptr + blk, mask=in_block > 0, other=0)
    k = k_desc.load([block_id, -shift, col]).reshape(BLOCK_SIZE, k_desc.block_shape[2])
    if IS_FP32:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    return tl.where(valid[None, :], s * scale_log2, float("-inf")), block_id, shift


@triton.jit
def _tma_pv(acc, p, v_desc, block_id, shift, col, BLOCK_SIZE: tl.constexpr, IS_FP32: tl.constexpr):
    v = v_desc.load([block_id, -shift, col]).reshape(BLOCK_SIZE, v_desc.block_shape[2])
    if IS_FP32:
        return tl.dot(p, v, acc, input_precision="ieee")
    return tl.dot(p.to(v.dtype), v, acc)


@triton.jit
def _decode_tile_tma(
    acc, m_i, l_i, q, kv_start, seq_len, sliding_window, scale_log2, k_desc, v_desc,
    table_ptr, col,
    BLOCK_SIZE: tl.constexpr, BLOCKS: tl.constexpr, HAS_WINDOW: tl.constexpr,
    IS_FP32: tl.constexpr,
):  # fmt: skip
    # _decode_tile over BLOCKS (1, 2 or 4) whole cache blocks, each block's K and V rows of
    # one KV head fetched by the TMA engine as one [BLOCK_SIZE, HEAD_DIM] box: no per-thread
    # addresses or predicates (rows past the sequence come as zeros: _tma_scores).
    blk = kv_start // BLOCK_SIZE
    s0, b0, h0 = _tma_scores(
        q, k_desc, table_ptr, blk, col, seq_len, sliding_window, scale_log2,
        BLOCK_SIZE, HAS_WINDOW, IS_FP32,
    )  # fmt: skip
    m_new = tl.maximum(m_i, tl.max(s0, 1))
    if BLOCKS >= 2:
        s1, b1, h1 = _tma_scores(
            q, k_desc, table_ptr, blk + 1, col, seq_len, sliding_window, scale_log2,
            BLOCK_SIZE, HAS_WINDOW, IS_FP32,
        )  # fmt: skip
        m_new = tl.maximum(m_new, tl.max(s1, 1))
    if BLOCKS == 4:
        s2, b2, h2 = _tma_scores(
            q, k_desc, table_ptr, blk + 2, col, seq_len, sliding_window, scale_log2,
            BLOCK_SIZE, HAS_WINDOW, IS_FP32,
        )  # fmt: skip
        s3, b3, h3 = _tma_scores(
            q, k_desc, table_ptr, blk + 3, col, seq_len, sliding_window, scale_log2,
            BLOCK_SIZE, HAS_WINDOW, IS_FP32,
        )  # fmt: skip
        m_new = tl.maximum(m_new, tl.maximum(tl.max(s2, 1), tl.max(s3, 1)))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    acc = acc * alpha[:, None]
    p = tl.exp2(s0 - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = _tma_pv(acc, p, v_desc, b0, h0, col, BLOCK_SIZE, IS_FP32)
    if BLOCKS >= 2:
        p = tl.exp2(s1 - m_safe[:, None])
        l_i += tl.sum(p, 1)
        acc = _tma_pv(acc, p, v_desc, b1, h1, col, BLOCK_SIZE, IS_FP32)
    if BLOCKS == 4:
        p = tl.exp2(s2 - m_safe[:, None])
        l_i += tl.sum(p, 1)
        acc = _tma_pv(acc, p, v_desc, b2, h2, col, BLOCK_SIZE, IS_FP32)
        p = tl.exp2(s3 - m_safe[:, None])
        l_i += tl.sum(p, 1)
        acc = _tma_pv(acc, p, v_desc, b3, h3, col, BLOCK_SIZE, IS_FP32)
    return acc, m_new, l_i


@triton.jit
def _merge_heads(
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    token,
    heads,
    h_valid,
    num_splits,
    stride_o_t,
    stride_o_h,
    stride_o_d,
    stride_po_t,
    stride_po_h,
    stride_po_s,
    stride_pl_t,
    stride_pl_h,
    d_start,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One token's heads, columns [d_start, d_start + BLOCK_D): out = sum_s 2^(lse_s - max) o_s
    # / sum_s 2^(lse_s - max). Partials are read through L2 (.cg): they may have been written
    # by other SMs during this launch.
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = d_start + tl.arange(0, BLOCK_D)
    hs_valid = h_valid[:, None] & (offs_s < num_splits)[None, :]
    lse_ptrs = part_lse_ptr + token * stride_pl_t + heads[:, None] * stride_pl_h + offs_s[None, :]
    lse = tl.load(lse_ptrs, mask=hs_valid, other=float("-inf"), cache_modifier=".cg")
    lse_max = tl.max(lse, 1)  # [BLOCK_H]
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weight = tl.exp2(lse - lse_max[:, None])  # 0 for splits that saw no key
    part_ptrs = (
        part_out_ptr + token * stride_po_t + heads[:, None, None] * stride_po_h
        + offs_s[None, :, None] * stride_po_s + offs_d[None, None, :]
    )  # fmt: skip
    part_mask = hs_valid[:, :, None] & (offs_d < HEAD_DIM)[None, None, :]
    part = tl.load(part_ptrs, mask=part_mask, other=0.0, cache_modifier=".cg")
    total = tl.sum(weight, 1)
    o = tl.sum(part * weight[:, :, None], 1) / tl.where(total > 0.0, total, 1.0)[:, None]
    out_ptrs = (
        out_ptr + token * stride_o_t + heads[:, None] * stride_o_h + offs_d[None, :] * stride_o_d
    )
    out_mask = h_valid[:, None] & (offs_d < HEAD_DIM)[None, :]
    tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _paged_decode_kernel(
    out_ptr,  # [num_seqs, num_heads, head_dim]
    part_out_ptr,  # [num_seqs, num_heads, num_splits, HEAD_DIM_PAD] fp32 (IS_SPLIT)
    part_lse_ptr,  # [num_seqs, num_heads, num_splits] fp32, log2 domain
    tickets_ptr,  # [num_seqs * num_kv_heads / KV_HEADS] int32, all 0 (FUSED_MERGE)
    k_desc,  # TMA: TensorDescriptors of the caches as [blocks, block_size, kv_heads * head_dim]
    v_desc,
    q_ptr,  # [num_seqs, num_heads, head_dim]: one query token per sequence
    k_cache_ptr,
    v_cache_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    scale_log2,
    num_splits,
    sliding_window,
    stride_q_t,
    stride_q_h,
    stride_q_d,
    stride_o_t,
    stride_o_h,
    stride_o_d,
    stride_k_b,
    stride_k_s,
    stride_k_h,
    stride_k_d,
    stride_v_b,
    stride_v_s,
    stride_v_h,
    stride_v_d,
    stride_bt_s,
    stride_po_t,
    stride_po_h,
    stride_po_s,
    stride_pl_t,
    stride_pl_h,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_SPLIT: tl.constexpr,
    FUSED_MERGE: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    IS_FP32: tl.constexpr,
    TRIGGER: tl.constexpr,
    WAIT: tl.constexpr,
    WHOLE_TILES: tl.constexpr,
    TMA: tl.constexpr,
):
    if WAIT:  # launched as a programmatic dependent: nothing is read before the previous
        tl.extra.cuda.gdc_wait()  # kernel on the stream has finished
    if TRIGGER:  # a programmatic dependent (the merge) may be scheduled now; it waits for us
        tl.extra.cuda.gdc_launch_dependents()
    # Decode-only step: sequence s owns query row s, so the program id names its work directly
    # (no search over query_start_loc). A program takes KV_HEADS neighbouring KV heads: its
    # K/V tiles hold all of their columns (one contiguous run per position) and row r (query
    # head r of the program's GROUP * KV_HEADS) keeps q only in its KV head's columns, so one
    # dot gives every row its own scores; of P @ V a row keeps its KV head's columns.
    kv_group = tl.program_id(0)
    split = tl.program_id(1)
    seq = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    row = seq.to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_c = tl.arange(0, KV_HEADS * HEAD_DIM_PAD)
    head = kv_group * (GROUP * KV_HEADS) + offs_m
    if KV_HEADS == 1:
        col_d = offs_c
        col_head = offs_c * 0
        row_mask = (offs_m < GROUP)[:, None] & (col_d < HEAD_DIM)[None, :]
    else:
        col_d = offs_c % HEAD_DIM_PAD
        col_head = offs_c // HEAD_DIM_PAD
        row_mask = (offs_m // GROUP)[:, None] == col_head[None, :]
        row_mask = row_mask & (offs_m < GROUP * KV_HEADS)[:, None] & (col_d < HEAD_DIM)[None, :]
    col_valid = col_d < HEAD_DIM
    q_ptrs = q_ptr + row * stride_q_t + head[:, None] * stride_q_h + col_d[None, :] * stride_q_d
    q = tl.load(q_ptrs, mask=row_mask, other=0.0)  # [BLOCK_M, COLS], 0 off the row's KV head

    # This sequence's positions [kv_lo, seq_len), cut into tiles, the tiles cut into splits.
    kv_lo = 0
    if HAS_WINDOW:
        kv_lo = tl.maximum(seq_len - sliding_window, 0) // BLOCK_N * BLOCK_N
    num_tiles = (seq_len - kv_lo + BLOCK_N - 1) // BLOCK_N
    tiles_per_split = (num_tiles + num_splits - 1) // num_splits
    tile_begin = tl.minimum(split * tiles_per_split, num_tiles)
    tile_end = tl.minimum(tile_begin + tiles_per_split, num_tiles)
    kv_begin = kv_lo + tile_begin * BLOCK_N
    kv_end = kv_lo + tile_end * BLOCK_N

    acc = tl.zeros([BLOCK_M, KV_HEADS * HEAD_DIM_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    first_kv_head = kv_group * KV_HEADS
    k_base_ptr = k_cache_ptr + first_kv_head * stride_k_h
    v_base_ptr = v_cache_ptr + first_kv_head * stride_v_h
    col_off_k = col_head * stride_k_h + col_d * stride_k_d
    col_off_v = col_head * stride_v_h + col_d * stride_v_d
    table_ptr = block_tables_ptr + row * stride_bt_s
    if TMA:  # whole cache blocks of one KV head (KV_HEADS == 1, HEAD_DIM == HEAD_DIM_PAD)
        col = kv_group * HEAD_DIM
        for kv_start in range(kv_begin, kv_end, BLOCK_N):
            acc, m_i, l_i = _decode_tile_tma(
                acc, m_i, l_i, q, kv_start, seq_len, sliding_window, scale_log2, k_desc,
                v_desc, table_ptr, col, BLOCK_SIZE, BLOCK_N // BLOCK_SIZE, HAS_WINDOW, IS_FP32,
            )  # fmt: skip
    else:
        if HAS_WINDOW or not WHOLE_TILES:  # a window's first tile may be partial: all masked
            full_end = kv_begin
        else:  # whole tiles unpredicated, then at most one partial tile (the sequence's last)
            full_end = tl.maximum(tl.minimum(kv_end, seq_len // BLOCK_N * BLOCK_N), kv_begin)
            for kv_start in range(kv_begin, full_end, BLOCK_N):
                acc, m_i, l_i = _decode_tile(
                    acc, m_i, l_i, q, kv_start, seq_len, sliding_window, scale_log2,
                    k_base_ptr, v_base_ptr, table_ptr, col_off_k, col_off_v, col_valid,
                    stride_k_b, stride_k_s, stride_v_b, stride_v_s,
                    BLOCK_SIZE, BLOCK_N, HEAD_DIM != HEAD_DIM_PAD, HAS_WINDOW, IS_FP32, True,
                )  # fmt: skip
        for kv_start in range(full_end, kv_end, BLOCK_N):
            acc, m_i, l_i = _decode_tile(
                acc, m_i, l_i, q, kv_start, seq_len, sliding_window, scale_log2,
                k_base_ptr, v_base_ptr, table_ptr, col_off_k, col_off_v, col_valid,
                stride_k_b, stride_k_s, stride_v_b, stride_v_s,
                BLOCK_SIZE, BLOCK_N, HEAD_DIM != HEAD_DIM_PAD, HAS_WINDOW, IS_FP32, False,
            )  # fmt: skip

    has_keys = l_i > 0.0
    o = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if IS_SPLIT:
        part_ptrs = (
            part_out_ptr + row * stride_po_t + head[:, None] * stride_po_h
            + split * stride_po_s + col_d[None, :]
        )  # fmt: skip
        tl.store(part_ptrs, o, mask=row_mask)
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        lse_ptrs = part_lse_ptr + row * stride_pl_t + head * stride_pl_h + split
        tl.store(lse_ptrs, lse, mask=offs_m < GROUP * KV_HEADS)
        if FUSED_MERGE:
            # The last of this (sequence, KV heads)'s splits to finish merges them all: the
            # barrier orders every thread's partial stores before the ticket's release, and
            # the winner resets the ticket to 0 for the next launch.
            tl.debug_barrier()
            ticket_ptr = tickets_ptr + seq * tl.num_programs(0) + kv_group
            ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
            if ticket == num_splits - 1:
                offs_h = tl.arange(0, HEADS_PAD)
                _merge_heads(
                    out_ptr, part_out_ptr, part_lse_ptr, row,
                    kv_group * (GROUP * KV_HEADS) + offs_h, offs_h < GROUP * KV_HEADS,
                    num_splits, stride_o_t, stride_o_h, stride_o_d,
                    stride_po_t, stride_po_h, stride_po_s, stride_pl_t, stride_pl_h, 0,
                    SPLITS_PAD, HEAD_DIM, HEAD_DIM_PAD,
                )  # fmt: skip
                tl.store(ticket_ptr, 0)
    else:
        out_ptrs = (
            out_ptr + row * stride_o_t + head[:, None] * stride_o_h + col_d[None, :] * stride_o_d
        )
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_mask)


_DECODE = FastLaunch(_paged_decode_kernel)


@triton.jit
def _merge_kv_splits_kernel(
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    num_heads,
    stride_o_t,
    stride_o_h,
    stride_o_d,
    stride_po_t,
    stride_po_h,
    stride_po_s,
    stride_pl_t,
    stride_pl_h,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
    TRIGGER: tl.constexpr,
):
    if TRIGGER:  # a programmatic dependent (the next kernel) may be scheduled now
        tl.extra.cuda.gdc_launch_dependents()
    # One token, BLOCK_H heads, BLOCK_D of their columns.
    token = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    if PDL:  # launched before the split kernel finished: wait for its partials
        tl.extra.cuda.gdc_wait()
    _merge_heads(
        out_ptr, part_out_ptr, part_lse_ptr, token, heads, heads < num_heads, NUM_SPLITS,
        stride_o_t, stride_o_h, stride_o_d, stride_po_t, stride_po_h, stride_po_s,
        stride_pl_t, stride_pl_h, tl.program_id(2) * BLOCK_D, SPLITS_PAD, HEAD_DIM, BLOCK_D,
    )  # fmt: skip


_MERGE = FastLaunch(_merge_kv_splits_kernel)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def default_num_kv_splits(
    num_seqs: int,
    num_kv_heads: int,
    max_query_len: int,
    max_seq_len: int,
    device: torch.device,
    tma_block: int = 0,
) -> int:
    """How many programs share one sequence's KV range when the launcher is not told.

    Only decode-only steps on CUDA split. With P = sequences x KV heads programs unsplit, the
    count is the smallest power of two that makes more than 1.5 programs per SM, then doubled
    while the programs stay at most 4 per SM and each split keeps 512 positions, and never so
    many that a split gets fewer than 64 positions or more than 64 splits; where the decode
    kernel reads K/V by TMA (``tma_block`` from ``_tma_block``) 6 per SM, 64 positions and 32.
    On the H200 (132 SMs) that gives 8, 32, 32 splits for one sequence of 512, 2048, 8192
    positions (16, 32, 64 with TMA); 4 for 8 sequences of 512 (was 2: 14.8 against 16.8 us; 8
    with TMA); 2, 4, 4 for 16 sequences of 512, 2048, 8192 (4, 4, 4 with TMA); 2 for 24
    sequences of 2048 (was 1: 65.2 against 85.7 us; 4 with TMA); none from 64 sequences.
    """
    if device.type != "cuda" or max_query_len > 1:
        return 1
    num_programs = num_seqs * num_kv_heads
    sms = num_sms(device)
    min_split = _MIN_SPLIT_TMA if tma_block else _MIN_SPLIT
    max_splits = max(1, min(max_seq_len // min_split, _MAX_KV_SPLITS))
    long_split = _LONG_SPLIT_TMA if tma_block else _LONG_SPLIT
    per_sm = _SPLIT_PROGRAMS_PER_SM_TMA if tma_block else _SPLIT_PROGRAMS_PER_SM
    splits = 1
    while 2 * splits <= max_splits and num_programs * splits <= _MIN_PROGRAMS_PER_SM * sms:
        splits *= 2
    while (
        2 * splits <= max_splits
        and num_programs * 2 * splits <= per_sm * sms
        and max_seq_len // (2 * splits) >= long_split
    ):
        splits *= 2
    return splits


def _pick_tiles(
    device: torch.device, max_query_len: int, group_pad: int, head_dim_pad: int
) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for one launch."""
    if device.type != "cuda":
        # The CPU interpreter pays per program and per op: few query blocks, but KV tiles
        # small enough that short test contexts cross several of them.
        return max(32, group_pad), 16, 4, 1
    # Tuned on the H200 with Llama-3-8B heads (bench_attention.py --sweep, BENCHMARKS.md).
    if max_query_len * group_pad <= 16 or max_query_len <= 4:
        block_n = 128 if head_dim_pad <= 128 else 32
        return max(16, group_pad), block_n, 4, 3
    block_n = 64 if head_dim_pad <= 128 else 32
    return max(128, group_pad), block_n, 4, 3


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
    *,
    num_kv_splits: int | None = None,
) -> torch.Tensor:
    """Triton version of :func:`paged_attention_ref` (same arguments and result).

    ``max_query_len`` picks the tile shape and, with ``max_seq_len``, the number of KV splits;
    results do not depend on them. ``num_kv_splits`` (keyword only) forces how many programs
    share each sequence's KV range (``None``: :func:`default_num_kv_splits`). Never reads a
    device tensor on the host, so the launch can be captured in a CUDA graph.
    """
    if query.dim() != 3 or key_cache.dim() != 4:
        raise ValueError(
            "query must be [num_tokens, num_heads, head_dim] and key_cache "
            f"[num_blocks, block_size, num_kv_heads, head_dim]; got {tuple(query.shape)} and "
            f"{tuple(key_cache.shape)}"
        )
    if value_cache.shape != key_cache.shape:
        raise ValueError(
            f"value_cache shape {tuple(value_cache.shape)} must equal key_cache shape "
            f"{tuple(key_cache.shape)}"
        )
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_head_dim = key_cache.shape
    if cache_head_dim != head_dim or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"query heads x dim {num_heads}x{head_dim} do not fit cache heads x dim "
            f"{num_kv_heads}x{cache_head_dim}: head_dim must match and num_heads must be a "
            "multiple of num_kv_heads"
        )
    if query.dtype not in (torch.float16, torch.bfloat16, torch.float32) or not (
        key_cache.dtype == value_cache.dtype == query.dtype
    ):
        raise ValueError(
            f"query, key_cache and value_cache must share one dtype of float16, bfloat16 or "
            f"float32; got {query.dtype}, {key_cache.dtype}, {value_cache.dtype}"
        )
    num_seqs = seq_lens.shape[0]
    if (
        query_start_loc.shape != (num_seqs + 1,)
        or block_tables.dim() != 2
        or (block_tables.shape[0] != num_seqs)
    ):
        raise ValueError(
            f"with {num_seqs} sequences query_start_loc must be [{num_seqs + 1}] and "
            f"block_tables [{num_seqs}, max_blocks_per_seq]; got {tuple(query_start_loc.shape)}"
            f" and {tuple(block_tables.shape)}"
        )
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be None or >= 1, got {sliding_window}")
    if num_kv_splits is not None and num_kv_splits < 1:
        raise ValueError(f"num_kv_splits must be None or >= 1, got {num_kv_splits}")
    if out is None:
        out = torch.empty_like(query)
    elif out.shape != query.shape or out.dtype != query.dtype:
        raise ValueError(
            f"out must be {tuple(query.shape)} {query.dtype}, got {tuple(out.shape)} {out.dtype}"
        )
    if num_tokens == 0 or num_seqs == 0:
        return out

    tma_block = _tma_block(key_cache, value_cache)
    if num_kv_splits is None:
        num_kv_splits = default_num_kv_splits(
            num_seqs, num_kv_heads, max_query_len, max_seq_len, query.device, tma_block
        )
    if max_query_len == 1 and num_tokens == num_seqs:  # every sequence has one new token
        config = _pick_decode_config(
            query.device, query.dtype, num_heads, num_kv_heads, head_dim, num_kv_splits,
            num_seqs, tma_block,
        )  # fmt: skip
        return _launch_decode(
            query, key_cache, value_cache, seq_lens, block_tables, scale, sliding_window, out,
            num_kv_splits, config,
        )  # fmt: skip
    group_pad = _next_pow2(num_heads // num_kv_heads)
    tiles = _pick_tiles(query.device, max_query_len, group_pad, max(16, _next_pow2(head_dim)))
    return _launch(
        query, key_cache, value_cache, query_start_loc, seq_lens, block_tables, scale,
        sliding_window, out, num_kv_splits, *tiles,
    )  # fmt: skip


def _launch(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    out: torch.Tensor,
    num_kv_splits: int,
    block_m: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
) -> torch.Tensor:
    """Launch with explicit tiles on checked inputs (benchmarks sweep tiles through this)."""
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    num_seqs = seq_lens.shape[0]
    group = num_heads // num_kv_heads
    group_pad = _next_pow2(group)
    head_dim_pad = max(16, _next_pow2(head_dim))
    block_q = block_m // group_pad
    if num_kv_splits > 1:
        part_out = torch.empty(
            (num_tokens, num_heads, num_kv_splits, head_dim_pad),
            dtype=torch.float32,
            device=query.device,
        )
        part_lse = torch.empty(
            (num_tokens, num_heads, num_kv_splits), dtype=torch.float32, device=query.device
        )
    else:  # never touched by the kernel; any float32 tensor stands in
        part_out = part_lse = torch.empty((1, 1, 1, 1), dtype=torch.float32, device=query.device)
    grid = (num_tokens // block_q + num_seqs, num_kv_heads, num_kv_splits)
    _ATTENTION[grid](
        out, part_out, part_lse, query, key_cache, value_cache,
        query_start_loc, seq_lens, block_tables,
        scale * _LOG2E, num_seqs, sliding_window or 0,
        *query.stride(), *out.stride(), *key_cache.stride()[:4], *value_cache.stride()[:4],
        *block_tables.stride(), part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        BLOCK_SIZE=block_size, GROUP=group, GROUP_PAD=group_pad,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=block_n,
        NUM_SPLITS=num_kv_splits, HAS_WINDOW=sliding_window is not None,
        IS_FP32=query.dtype == torch.float32,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if num_kv_splits > 1:
        # The interpreter pays per program: merge all heads of a token in one there.
        block_h = 1 if query.device.type == "cuda" else _next_pow2(num_heads)
        _merge(out, part_out, part_lse, num_kv_splits, block_h)
    return out


@dataclass(frozen=True)
class DecodeConfig:
    """Launch shape of the decode-only kernel (benchmarks sweep these through _launch_decode).

    ``merge_block_h``: query heads per program of the split merge kernel, ``merge_block_d``
    their columns per program (0: all, else a power of two). ``kv_heads``: KV
    heads per program (must divide the cache's). ``fused_merge``: with splits, the last
    program of each (sequence, KV heads) merges them instead of a second launch. ``pdl``
    (CUDA, sm_90+): the merge kernel is launched as a programmatic dependent of the split
    kernel, so its launch overlaps the split kernel's tail instead of following it. ``wait``
    (sm_90+): the decode kernel itself is launched as a programmatic dependent of whatever
    kernel precedes it and waits for it on entry, so only its launch overlaps that kernel
    (also done, whatever ``wait`` says, where ``kernels.pdl.chain_launch`` holds and the grid
    is at most one wave).
    ``whole_tiles``: tiles wholly below the sequence's length run in a loop of their own
    without predicated loads or masks, the partial last tile in a second loop (measured
    slower on the H200, 1-2 us per call: BENCHMARKS.md, so off by default). ``wait`` is off
    by default for the same reason, except for TMA launches whose splits go to the merge
    kernel, where it gained. ``maxnreg`` (CUDA): registers per thread capped at that
    (ptxas schedules differently under a cap; the INT4 mma kernel gained from it, this one
    did not at any cap from 40 to 168: BENCHMARKS.md, so off).
    ``tma`` (sm_90+, or the interpreter): each cache block's K and V rows of a KV head come by
    the TMA engine, one box per block (tiles of 1, 2 or 4 whole blocks), the rows past the
    sequence filled with zeros by the engine, never read (``_tma_scores``); where it does not
    apply (several KV heads per program, a padded head size, a cache that is not contiguous)
    the pointer loads run.
    """

    block_n: int
    num_warps: int
    num_stages: int
    merge_block_h: int = 1
    merge_block_d: int = 0
    kv_heads: int = 1
    fused_merge: bool = False
    pdl: bool = False
    wait: bool = False
    whole_tiles: bool = False
    maxnreg: int | None = None
    tma: bool = False

    def __post_init__(self) -> None:
        # a slice must divide the padded head size, a power of two
        if self.merge_block_d and self.merge_block_d != _next_pow2(self.merge_block_d):
            raise ValueError(f"merge_block_d must be 0 or a power of two, got {self.merge_block_d}")


# The fused merge holds [query heads of a program, splits, head_dim] fp32 partials in
# registers at once; past this many splits the merge kernel takes over.
_MAX_FUSED_SPLITS = 8


def _pick_decode_config(
    device: torch.device, dtype: torch.dtype, num_heads: int, num_kv_heads: int,
    head_dim: int, num_kv_splits: int, num_seqs: int, tma_block: int = 0,
) -> DecodeConfig:  # fmt: skip
    """The decode launch for this shape; ``tma_block``: the cache's block size where its K/V
    can come by TMA (``_tma_block``), else 0."""
    if device.type != "cuda":  # the interpreter pays per program: merge a token in one
        return DecodeConfig(16, 4, 1, merge_block_h=_next_pow2(num_heads))
    head_dim_pad = max(16, _next_pow2(head_dim))
    if head_dim_pad > 128:
        return DecodeConfig(32, 4, 3)
    if dtype == torch.float32:
        return DecodeConfig(128, 4, 3)
    # Merge one KV head's query heads per program while the partials stay ~64 fp32 per thread;
    # on sm_90+ the merge launch overlaps the split kernel's tail (PDL).
    splits_pad = _next_pow2(num_kv_splits)
    merge_block_h = 16384 // (splits_pad * head_dim_pad)
    merge_block_h = max(1, min(_next_pow2(num_heads // num_kv_heads), merge_block_h))
    # Past 8192 partial values per program (32 or more splits), slice the columns down to
    # ~4096: the merge's programs each pull their partials from L2 at one SM's rate, so more
    # and smaller ones finish sooner (H200, 1 x 8192 at 64 splits, layered: 13.0 us against
    # 13.6 with the columns whole; 32 splits within 0.3; BENCHMARKS.md).
    merge_block_d = 0
    if merge_block_h * splits_pad * head_dim_pad > 8192:
        merge_block_d = max(16, min(head_dim_pad, 4096 // (merge_block_h * splits_pad)))
    if tma_block:
        # K/V by TMA, one-warp programs (the warp only does the math), 6 tiles in flight: one
        # cache block per tile when split, 32 positions unsplit. On the H200 with Llama-3-8B
        # heads, layered us: 1 x 8192 14.5 against 16.0 with the pointer loads below, 16 x 512
        # 14.3 against 15.4, 32 x 512 22.2 against 27.3, 64 x 2048 131.3 against 137.3
        # (twentieth session, BENCHMARKS.md). Launches with the merge kernel wait as
        # programmatic dependents of the kernel before them: 0.4-0.7 us less per layered call
        # (1 x 2048, 1 x 8192); with the fused merge the same gain in the harness did not hold
        # in an 8B model's decode step (batch 32: 10-20 us slower per step), and unsplit
        # launches lost 3.7-6.0 us per call (twenty-first session).
        if num_kv_splits > _MAX_FUSED_SPLITS:
            return DecodeConfig(
                tma_block, 1, 6, merge_block_h, merge_block_d, pdl=has_pdl(device),
                wait=chain_launch(device), tma=True,
            )  # fmt: skip
        if num_kv_splits > 1:
            return DecodeConfig(tma_block, 1, 6, fused_merge=True, tma=True)
        # Unsplit, more than 4 programs per SM (256 x 8 KV heads): the pointer loads below
        # (256 x 8192 2137 us by TMA against 1924-1934 in earlier runs).
        if num_seqs * num_kv_heads <= _SPLIT_PROGRAMS_PER_SM * num_sms(device):
            return DecodeConfig(32, 1, 6, tma=True)
    # Tuned on the H200 with Llama-3-8B heads (BENCHMARKS.md): split ranges are short, so keep
    # many small tiles in flight; long unsplit ranges prefer 64-position tiles.
    if num_kv_splits == 1:
        return DecodeConfig(64, 4, 3)
    if num_kv_splits <= _MAX_FUSED_SPLITS:
        # Many (sequence, KV head) pairs in 4+ splits (batch 16 x 8 KV heads): one-warp
        # programs, more of them resident per SM (H200: 16 x 2048 48.4 us against 50.9 with 4
        # warps; with 2 splits, or 64 pairs, 4 warps stayed faster; BENCHMARKS.md).
        warps = 1 if num_seqs * num_kv_heads >= 128 and num_kv_splits >= 4 else 4
        return DecodeConfig(32, warps, 6, fused_merge=True)
    return DecodeConfig(32, 4, 6, merge_block_h, merge_block_d, pdl=has_pdl(device))


def _tma_block(key_cache: torch.Tensor, value_cache: torch.Tensor) -> int:
    """The caches' block size where the default decode launch reads K/V by TMA (a GPU,
    16-bit, blocks of 16 or 32 positions, a head size of at most 128, and ``_tma_caches_ok``),
    else 0."""
    _, block_size, _, head_dim = key_cache.shape
    if (
        key_cache.device.type == "cuda"
        and key_cache.dtype in (torch.float16, torch.bfloat16)
        and block_size in (16, 32)
        and head_dim <= 128
        and _tma_caches_ok(key_cache, value_cache)
    ):
        return block_size
    return 0


def _tma_caches_ok(key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """Whether the decode kernel can read these caches by TMA: a GPU with a TMA engine
    (sm_90+) or the interpreter, a power-of-two head size and block size of at least 16 (whole
    mma operands), contiguous caches on 16-byte boundaries."""
    _, block_size, _, head_dim = key_cache.shape
    if (
        key_cache.device.type == "cuda"
        and torch.cuda.get_device_capability(key_cache.device)[0] < 9
    ):
        return False
    return (
        head_dim >= 16
        and head_dim == _next_pow2(head_dim)
        and block_size >= 16
        and block_size == _next_pow2(block_size)
        and all(c.is_contiguous() and c.data_ptr() % 16 == 0 for c in (key_cache, value_cache))
    )


def _launch_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    out: torch.Tensor,
    num_kv_splits: int,
    config: DecodeConfig,
) -> torch.Tensor:
    """Decode-only launch (one query row per sequence, row i for sequence i) on checked inputs."""
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    head_dim_pad = max(16, _next_pow2(head_dim))
    kv_heads = config.kv_heads if num_kv_heads % config.kv_heads == 0 else 1
    is_split = num_kv_splits > 1
    is_fused = is_split and config.fused_merge
    trigger = has_pdl(query.device)
    pdl = config.pdl and is_split and not is_fused and trigger
    num_groups = num_kv_heads // kv_heads
    grid = (num_groups, num_kv_splits, num_seqs)
    # In the chain of dependent launches (kernels.pdl.chain_launch) only a grid of at most one
    # wave waits early: at batch 32 (256 programs) waiting made an 8B decode step slower on the
    # H200 (3048 against 3020 us), at batch 1 it saved 25 us (BENCHMARKS.md).
    wait = trigger and (
        config.wait
        or (
            chain_launch(query.device)
            and num_groups * num_kv_splits * num_seqs <= num_sms(query.device)
        )
    )
    if is_split:
        part_out = torch.empty(
            (num_seqs, num_heads, num_kv_splits, head_dim_pad),
            dtype=torch.float32,
            device=query.device,
        )
        part_lse = torch.empty(
            (num_seqs, num_heads, num_kv_splits), dtype=torch.float32, device=query.device
        )
    else:  # never touched by the kernel; any float32 tensor stands in
        part_out = part_lse = torch.empty((1, 1, 1, 1), dtype=torch.float32, device=query.device)
    use_tma = config.tma and _tma_applies(query, key_cache, value_cache, config, kv_heads)
    if use_tma:
        k_desc, v_desc = (
            TensorDescriptor.from_tensor(
                cache.view(-1, block_size, num_kv_heads * head_dim), [1, block_size, head_dim]
            )
            for cache in (key_cache, value_cache)
        )
    else:  # never touched
        k_desc = v_desc = None
    if is_fused:
        # all zero before and after every launch (the last program of each ticket resets it)
        tickets = zeroed_int32(query.device, num_seqs * num_groups, "paged_attention")
    else:  # never touched
        tickets = torch.empty(1, dtype=torch.int32, device=query.device)
    options = dict(
        BLOCK_SIZE=block_size, GROUP=group, KV_HEADS=kv_heads,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        BLOCK_M=max(16, _next_pow2(group * kv_heads)), BLOCK_N=config.block_n,
        IS_SPLIT=is_split, FUSED_MERGE=is_fused, SPLITS_PAD=_next_pow2(num_kv_splits),
        HEADS_PAD=_next_pow2(group * kv_heads),
        HAS_WINDOW=sliding_window is not None, IS_FP32=query.dtype == torch.float32,
        TRIGGER=trigger, WAIT=wait, WHOLE_TILES=config.whole_tiles, TMA=use_tma,
        num_warps=config.num_warps, num_stages=config.num_stages,
        **({"launch_pdl": True} if wait else {}),
        **({"maxnreg": config.maxnreg} if config.maxnreg else {}),
    )  # fmt: skip
    # the descriptors' type (dtype, box) follows from the options and the cache's dtype
    key = (*options.values(), key_cache.dtype if use_tma else None)
    _DECODE(
        grid, key,
        out, part_out, part_lse, tickets, k_desc, v_desc, query, key_cache, value_cache,
        seq_lens, block_tables, scale * _LOG2E, num_kv_splits, sliding_window or 0,
        *query.stride(), *out.stride(), *key_cache.stride()[:4], *value_cache.stride()[:4],
        block_tables.stride(0), part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        **options,
    )  # fmt: skip
    if is_split and not is_fused:
        _merge(
            out, part_out, part_lse, num_kv_splits, config.merge_block_h, pdl,
            config.merge_block_d,
        )  # fmt: skip
    return out


def _tma_applies(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    config: DecodeConfig,
    kv_heads: int,
) -> bool:
    """Whether ``DecodeConfig.tma`` can run: one KV head per program, tiles of 1, 2 or 4
    whole blocks, and ``_tma_caches_ok``."""
    block_size = key_cache.shape[1]
    blocks = config.block_n // block_size
    return (
        kv_heads == 1
        and blocks in (1, 2, 4)
        and blocks * block_size == config.block_n
        and _tma_caches_ok(key_cache, value_cache)
    )


def _merge(
    out: torch.Tensor,
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    num_kv_splits: int,
    block_h: int,
    pdl: bool = False,
    block_d: int = 0,
) -> None:
    """Merge the splits' partials into ``out``: a program per token, ``block_h`` heads and
    ``block_d`` columns (0: all)."""
    num_tokens, num_heads, head_dim = out.shape
    block_h = min(block_h, _next_pow2(num_heads))
    block_d = min(block_d or part_out.shape[-1], part_out.shape[-1])
    grid = (num_tokens, triton.cdiv(num_heads, block_h), part_out.shape[-1] // block_d)
    launch = {"launch_pdl": True} if pdl else {}  # a launch option of CUDA builds only
    _MERGE[grid](
        out, part_out, part_lse, num_heads, *out.stride(),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        NUM_SPLITS=num_kv_splits, SPLITS_PAD=_next_pow2(num_kv_splits),
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_H=block_h, PDL=pdl,
        TRIGGER=has_pdl(out.device), **launch,
    )  # fmt: skip


_DECODE_GROUP = 8  # decode rows per padded reference computation


def paged_attention_ref(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal GQA attention of each new token over its sequence's cached context.

    query:        [num_tokens, num_heads, head_dim]
    key_cache:    [num_blocks, block_size, num_kv_heads, head_dim] (value_cache alike)
    query_start_loc [num_seqs + 1] int32, seq_lens [num_seqs] int32,
    block_tables [num_seqs, max_blocks_per_seq] int32
    scale:        softmax scale; sliding_window: a token sees only the last ``sliding_window``
                  positions (itself included) when set.
    max_query_len / max_seq_len: host-side maxima (the Triton launcher sizes its grid with them).
    Returns (or writes into ``out``) [num_tokens, num_heads, head_dim] in query's dtype.
    """
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    num_seqs = len(lens)
    q_lens = [starts[i + 1] - starts[i] for i in range(num_seqs)]

    # Decode rows (one new token each) are batched into one padded computation; sequences with
    # longer query runs go one at a time. The query heads sharing a KV head sit in the
    # "query length" axis of scaled_dot_product_attention, so K/V are never repeated.
    decode_idx = sorted((i for i in range(num_seqs) if q_lens[i] == 1), key=lambda i: lens[i])
    other_idx = [i for i in range(num_seqs) if q_lens[i] > 1]
    # Groups of similar context length keep the padding (and the gathered bytes) small.
    for g in range(0, len(decode_idx), _DECODE_GROUP):
        group_idx = decode_idx[g : g + _DECODE_GROUP]
        num_dec = len(group_idx)
        idx = torch.tensor(group_idx, device=query.device, dtype=torch.long)
        ctx = max(lens[i] for i in group_idx)
        nblk = (ctx + block_size - 1) // block_size
        tables = block_tables[idx, :nblk].long()  # [B, nblk]
        flat = tables.reshape(-1)  # index_select copies whole blocks, far faster than indexing
        k = key_cache.index_select(0, flat).view(num_dec, nblk * block_size, num_kv_heads, head_dim)
        v = value_cache.index_select(0, flat).view(
            num_dec, nblk * block_size, num_kv_heads, head_dim
        )
        k = k[:, :ctx].float().transpose(1, 2)  # [B, Hkv, ctx, D]
        v = v[:, :ctx].float().transpose(1, 2)
        rows = torch.tensor([starts[i] for i in group_idx], device=query.device)
        q = query[rows].float().view(num_dec, num_kv_heads, group, head_dim)
        kpos = torch.arange(ctx, device=query.device)
        slens = seq_lens[idx].long()
        mask = kpos[None, :] < slens[:, None]
        if sliding_window is not None:
            mask &= kpos[None, :] > (slens[:, None] - 1 - sliding_window)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :], scale=scale)
        out[rows] = o.reshape(num_dec, num_heads, head_dim).to(out.dtype)
    for i in other_idx:
        ctx = lens[i]
        q_len = q_lens[i]
        nblk = (ctx + block_size - 1) // block_size
        table = block_tables[i, :nblk].long()
        k = key_cache.index_select(0, table).view(nblk * block_size, num_kv_heads, head_dim)[:ctx]
        v = value_cache.index_select(0, table).view(nblk * block_size, num_kv_heads, head_dim)[:ctx]
        k = k.float().transpose(0, 1)  # [Hkv, ctx, D]
        v = v.float().transpose(0, 1)
        q = query[starts[i] : starts[i + 1]].float().view(q_len, num_kv_heads, group, head_dim)
        q = q.permute(1, 2, 0, 3).reshape(num_kv_heads, group * q_len, head_dim)
        qpos = torch.arange(ctx - q_len, ctx, device=query.device)
        kpos = torch.arange(ctx, device=query.device)
        mask = kpos[None, :] <= qpos[:, None]
        if sliding_window is not None:
            mask &= kpos[None, :] > (qpos[:, None] - sliding_window)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.repeat(group, 1), scale=scale)
        o = o.view(num_kv_heads, group, q_len, head_dim).permute(2, 0, 1, 3)
        out[starts[i] : starts[i + 1]] = o.reshape(q_len, num_heads, head_dim).to(out.dtype)
    return out
