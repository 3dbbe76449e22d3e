"""Triton building blocks of ``kernels.int4_gemm``: packed-word loads, the two ways of
multiplying packed INT4 words by activations (unpack to K order, or nibble by nibble with the
magic-number conversion), and the split-K epilogue."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _unpack(q):
    """int32 [R, W] packed words -> int32 [R, 8W] codes in natural K order (no reshapes: the
    interleaves keep the 8 nibbles of a word in one thread's registers)."""
    even = tl.interleave(
        tl.interleave(q & 0xF, (q >> 16) & 0xF), tl.interleave((q >> 8) & 0xF, (q >> 24) & 0xF)
    )
    odd = tl.interleave(
        tl.interleave((q >> 4) & 0xF, (q >> 20) & 0xF),
        tl.interleave((q >> 12) & 0xF, (q >> 28) & 0xF),
    )
    return tl.interleave(even, odd)


@triton.jit
def _load_words(qw_ptr, offs_n, offs_w, n_mask, stride_qw_n, K, EVEN_N, EVEN_K):
    """Packed words [len(offs_n), len(offs_w)]; no masks when the tile is whole (16-byte
    vector loads)."""
    ptrs = qw_ptr + offs_n[:, None] * stride_qw_n + offs_w[None, :]
    if EVEN_N and EVEN_K:
        q = tl.load(ptrs)
    elif EVEN_K:
        q = tl.load(ptrs, mask=n_mask[:, None], other=0)
    else:
        q = tl.load(ptrs, mask=n_mask[:, None] & (offs_w[None, :] < K // 8), other=0)
    return q


@triton.jit
def _nibble_dot(q, x_row, words, x_mask, EVEN_K):
    """sum_k x_k q_k over each sub-group of the words q [R, S, W] (k = 8w + j for the word
    indices ``words`` [S, W]) -> [R, S], and sum_k x_k per sub-group -> [S], in fp32.

    No unpacking to K order: nibble j of every word meets x[8w + j] (a strided load of x,
    which stays in L1). Codes become floats by the magic-number trick: OR the nibble, left in
    place at bit 4i of its 16-bit half, into the mantissa of 2^23 and subtract 2^23 (exact:
    n * 16^i); the 16^-i goes into x. Three instructions per weight, no conversions.
    """
    hi = q >> 16
    part = tl.zeros(q.shape, dtype=tl.float32)
    x_sum = tl.zeros([q.shape[1], q.shape[2]], dtype=tl.float32)
    for j in tl.static_range(8):
        offs_k = words * 8 + j
        if EVEN_K:
            xj = tl.load(x_row + offs_k).to(tl.float32)
        else:
            xj = tl.load(x_row + offs_k, mask=x_mask, other=0.0).to(tl.float32)
        x_sum += xj
        if j < 4:
            src = q
        else:
            src = hi
        bits = (src & (0xF << (4 * (j % 4)))) | 0x4B000000
        f = bits.to(tl.float32, bitcast=True) - 8388608.0
        if j % 4 == 0:
            part += f * xj[None, :, :]
        elif j % 4 == 1:
            part += f * (xj * 0.0625)[None, :, :]
        elif j % 4 == 2:
            part += f * (xj * 0.00390625)[None, :, :]
        else:
            part += f * (xj * 0.000244140625)[None, :, :]
    return tl.sum(part, axis=2), tl.sum(x_sum, axis=1)


@triton.jit
def _as_16bit(v, IS_BF16: tl.constexpr):
    """The low 16 bits of the int32 tensor v as bf16 or fp16 values."""
    if IS_BF16:
        return v.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        return v.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _nibble_codes(q, hi, j: tl.constexpr):
    """Nibble j (codes 0..15) of the words q [R, W]; hi = q >> 16."""
    if j < 4:
        src = q
    else:
        src = hi
    return (src >> (4 * (j % 4))) & 0xF


@triton.jit
def _nibble_plane(q, hi, j: tl.constexpr, MAGIC: tl.constexpr, IS_BF16: tl.constexpr):
    """Nibble j of the words q [R, W] as the 16-bit float MAGIC | n (bias + n, exact)."""
    return _as_16bit(_nibble_codes(q, hi, j) | MAGIC, IS_BF16)


@triton.jit
def _plane_dot(c, xj, part, SWAP: tl.constexpr):
    """part += xj [BM, W] @ c [BN, W]^T, or its transpose [BN, BM] when SWAP (the codes are
    then the register operand A of the tensor-core product)."""
    if SWAP:
        return tl.dot(c, tl.trans(xj), acc=part)
    else:
        return tl.dot(xj, tl.trans(c), acc=part)


@triton.jit
def _nibble_mma(
    q, x_ptrs, x32_ptrs, offs_w, m_mask, k_end, part, x_sum, MAGIC, IS_BF16, SWAP, EVEN_MK
):
    """part += x[:, 8w + j] @ codes_j^T over the 8 nibbles j of the words q [BN, W]
    (transposed, [BN, BM], when SWAP); x_sum [BM] += sum_k x_k.

    fp16/bf16 (MAGIC != 0): x is read as int32 pairs (x[8w + 2i], x[8w + 2i + 1]) through
    ``x32_ptrs`` [BM, 1] (4-byte loads the pipeliner can issue asynchronously), split into
    two 16-bit halves; code n becomes the 16-bit float MAGIC | n (1024 + n in fp16, 128 + n
    in bf16; no int-to-float conversion); the caller subtracts bias * sum_k x_k afterwards.
    fp32 (MAGIC == 0): strided loads of x and an exact conversion of n (IEEE dot).
    """
    hi = q >> 16
    if MAGIC == 0:
        for j in tl.static_range(8):
            offs_k = offs_w * 8 + j
            if EVEN_MK:
                xj = tl.load(x_ptrs + offs_k[None, :])
            else:
                mask = m_mask[:, None] & (offs_k[None, :] < k_end)
                xj = tl.load(x_ptrs + offs_k[None, :], mask=mask, other=0.0)
            x_sum += tl.sum(xj, axis=1)
            c = _nibble_codes(q, hi, j).to(tl.float32)
            if SWAP:
                part = tl.dot(c, tl.trans(xj), acc=part, input_precision="ieee")
            else:
                part = tl.dot(xj, tl.trans(c), acc=part, input_precision="ieee")
    else:
        for i in tl.static_range(4):
            offs_p = offs_w * 4 + i
            if EVEN_MK:
                v = tl.load(x32_ptrs + offs_p[None, :])
            else:
                mask = m_mask[:, None] & (offs_p[None, :] < k_end // 2)
                v = tl.load(x32_ptrs + offs_p[None, :], mask=mask, other=0)
            x_lo = _as_16bit(v, IS_BF16)
            x_hi = _as_16bit(v >> 16, IS_BF16)
            x_sum += tl.sum(x_lo.to(tl.float32), axis=1) + tl.sum(x_hi.to(tl.float32), axis=1)
            part = _plane_dot(_nibble_plane(q, hi, 2 * i, MAGIC, IS_BF16), x_lo, part, SWAP)
            part = _plane_dot(_nibble_plane(q, hi, 2 * i + 1, MAGIC, IS_BF16), x_hi, part, SWAP)
    return part, x_sum


@triton.jit
def _epilogue(acc, out_ptrs, ws_ptrs, mask, lock_ptr, tile_id, num_splits, MODE: tl.constexpr):
    # MODE 0: one split, store. MODE 1: fp32 atomics into a zeroed fp32 output (cast later).
    # MODE 2: atomics into a self-cleaning fp32 workspace; the last split of a tile (ticket
    # from the lock) reads the sum, writes the output and resets workspace and lock to 0.
    if MODE == 0:
        tl.store(out_ptrs, acc.to(out_ptrs.dtype.element_ty), mask=mask)
    elif MODE == 1:
        tl.atomic_add(out_ptrs, acc, mask=mask, sem="relaxed")
    else:
        tl.atomic_add(ws_ptrs, acc, mask=mask, sem="relaxed")
        tl.debug_barrier()  # every thread's partial is in before the (releasing) ticket
        ticket = tl.atomic_add(lock_ptr + tile_id, 1, sem="acq_rel")
        if ticket == num_splits - 1:
            total = tl.atomic_add(ws_ptrs, tl.zeros_like(acc), mask=mask)  # read at L2
            total = tl.where(mask, total, 0.0)  # masked lanes return undefined values
            tl.store(out_ptrs, total.to(out_ptrs.dtype.element_ty), mask=mask)
            tl.store(ws_ptrs, tl.zeros_like(acc), mask=mask)
            tl.atomic_xchg(lock_ptr + tile_id, 0)
