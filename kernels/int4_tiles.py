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
def _magic_plane(src, i: tl.constexpr, s16, o):
    """Nibble i of the words src [R, W] dequantized to fp32: AND-OR the nibble, left in place
    at bit 4i, into the mantissa of 2^23 and subtract 2^23 (exact n * 16^i); s16 [R] is the
    scale times 16^-i, o [R] the offset. No integer-to-float conversion."""
    f = ((src & (0xF << (4 * i))) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    return f * s16[:, None] + o[:, None]


@triton.jit
def _dequant_words(q, s, o, DTYPE: tl.constexpr):
    """int32 words q [R, W], one quantization group per row's tile, scale s and offset o [R]
    (fp32) -> dequantized weights [R, 8W] in DTYPE, in natural K order: each nibble plane is
    decoded by the magic-number trick, cast, and the planes are interleaved in registers."""
    hi = q >> 16
    p0 = _magic_plane(q, 0, s, o).to(DTYPE)
    p1 = _magic_plane(q, 1, s * (1.0 / 16), o).to(DTYPE)
    p2 = _magic_plane(q, 2, s * (1.0 / 256), o).to(DTYPE)
    p3 = _magic_plane(q, 3, s * (1.0 / 4096), o).to(DTYPE)
    p4 = _magic_plane(hi, 0, s, o).to(DTYPE)
    p5 = _magic_plane(hi, 1, s * (1.0 / 16), o).to(DTYPE)
    p6 = _magic_plane(hi, 2, s * (1.0 / 256), o).to(DTYPE)
    p7 = _magic_plane(hi, 3, s * (1.0 / 4096), o).to(DTYPE)
    even = tl.interleave(tl.interleave(p0, p4), tl.interleave(p2, p6))
    odd = tl.interleave(tl.interleave(p1, p5), tl.interleave(p3, p7))
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
def _pair_to_f32(v, IS_BF16: tl.constexpr):
    """int32 pairs of 16-bit floats -> (low, high) halves as fp32 (bf16: a bit shift)."""
    if IS_BF16:
        lo = (v << 16).to(tl.float32, bitcast=True)
        hi = (v & -65536).to(tl.float32, bitcast=True)
    else:
        lo = v.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (v >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _x_planes(x_row, x32_row, words, x_mask, X16: tl.constexpr, IS_BF16: tl.constexpr, EVEN_K):
    """x[8w + j] for j = 0..7 over the word indices ``words`` [S, W], as eight fp32 [S, W].

    16-bit x (X16) is read as the four int32 pairs of each word, one 16-byte load per word
    and thread, and split in registers; fp32 x by eight strided loads.
    """
    if X16:
        offs = words[:, :, None] * 4 + tl.arange(0, 4)[None, None, :]
        if EVEN_K:
            pairs = tl.load(x32_row + offs)
        else:
            pairs = tl.load(x32_row + offs, mask=x_mask[:, :, None], other=0)
        a, b = tl.split(tl.reshape(pairs, [words.shape[0], words.shape[1], 2, 2]))
        p0, p2 = tl.split(a)
        p1, p3 = tl.split(b)
        x0, x1 = _pair_to_f32(p0, IS_BF16)
        x2, x3 = _pair_to_f32(p1, IS_BF16)
        x4, x5 = _pair_to_f32(p2, IS_BF16)
        x6, x7 = _pair_to_f32(p3, IS_BF16)
    else:
        offs = words * 8
        if EVEN_K:
            x0 = tl.load(x_row + offs)
            x1 = tl.load(x_row + offs + 1)
            x2 = tl.load(x_row + offs + 2)
            x3 = tl.load(x_row + offs + 3)
            x4 = tl.load(x_row + offs + 4)
            x5 = tl.load(x_row + offs + 5)
            x6 = tl.load(x_row + offs + 6)
            x7 = tl.load(x_row + offs + 7)
        else:
            x0 = tl.load(x_row + offs, mask=x_mask, other=0.0)
            x1 = tl.load(x_row + offs + 1, mask=x_mask, other=0.0)
            x2 = tl.load(x_row + offs + 2, mask=x_mask, other=0.0)
            x3 = tl.load(x_row + offs + 3, mask=x_mask, other=0.0)
            x4 = tl.load(x_row + offs + 4, mask=x_mask, other=0.0)
            x5 = tl.load(x_row + offs + 5, mask=x_mask, other=0.0)
            x6 = tl.load(x_row + offs + 6, mask=x_mask, other=0.0)
            x7 = tl.load(x_row + offs + 7, mask=x_mask, other=0.0)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _nibble_fma(part, src, i: tl.constexpr, xj):
    """part [R, S, W] += (nibble i of src's 16-bit halves) * xj [S, W], by the magic-number
    trick: OR the nibble, left in place at bit 4i, into the mantissa of 2^23 and subtract
    2^23 (exact: n * 16^i); the 16^-i goes into x (shared by all R rows)."""
    f = ((src & (0xF << (4 * i))) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    return part + f * (xj * (1.0 / (16**i)))[None, :, :]


@triton.jit
def _nibble_dot(q, x0, x1, x2, x3, x4, x5, x6, x7):
    """sum_k x_k q_k over each sub-group of the words q [R, S, W] (k = 8w + j; xj [S, W] from
    ``_x_planes``) -> [R, S], and sum_k x_k per sub-group -> [S], in fp32.

    No unpacking to K order: nibble j of every word meets x[8w + j]; three instructions per
    weight (AND-OR, subtract, FMA), no integer-to-float conversions.
    """
    hi = q >> 16
    part = tl.zeros(q.shape, dtype=tl.float32)
    part = _nibble_fma(part, q, 0, x0)
    part = _nibble_fma(part, q, 1, x1)
    part = _nibble_fma(part, q, 2, x2)
    part = _nibble_fma(part, q, 3, x3)
    part = _nibble_fma(part, hi, 0, x4)
    part = _nibble_fma(part, hi, 1, x5)
    part = _nibble_fma(part, hi, 2, x6)
    part = _nibble_fma(part, hi, 3, x7)
    x_sum = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))
    return tl.sum(part, axis=2), tl.sum(x_sum, axis=1)


@triton.jit
def _fold_code(v, HIGH: tl.constexpr):
    """The nibble at bits 16..19 (HIGH) or 12..15 of the words v as the fp32 128 + n or
    2048 + n (one AND-OR into the mantissa of 128 or 2048, whose lowest nibble bit then
    weighs 1; exact)."""
    if HIGH:
        return ((v & 0xF0000) | 0x43000000).to(tl.float32, bitcast=True)
    else:
        return ((v & 0xF000) | 0x45000000).to(tl.float32, bitcast=True)


@triton.jit
def _fold_finish(part, x0, x1, x2, x3, x4, x5, x6, x7):
    """(sum_k x_k n_k per sub-group [R, S], sum_k x_k [S]) from the fold decode's per-word
    sums ``part`` [R, S, W] of (2048 + n) x (odd j) and (128 + n) x (even j)."""
    x_even = (x0 + x2) + (x4 + x6)
    x_odd = (x1 + x3) + (x5 + x7)
    bias = tl.sum(x_odd * 2048.0 + x_even * 128.0, axis=1)
    return tl.sum(part, axis=2) - bias[None, :], tl.sum(x_even + x_odd, axis=1)


@triton.jit
def _nibble_dot_fold(q, x0, x1, x2, x3, x4, x5, x6, x7):
    """``_nibble_dot`` without the subtraction: an AND-OR and an FMA per weight plus four
    shifts per word (each nibble moved to bits 12..19), reading 2048 + n (odd j) or 128 + n
    (even j); the biases come off once per sub-group, as 2048 sum x_odd
    + 128 sum x_even. The fp32 sums then carry at most 2048 |x| per term: about 1e-4
    relative error, for 16-bit activations (fp32 x keeps the exact ``_nibble_dot``)."""
    lo = q << 16  # nibble 0 at bits 16..19
    b = q << 8  # nibbles 1, 2 at 12..19
    c = q >> 8  # nibbles 5, 6
    hi = q >> 16  # nibble 7 at 12..15
    part = _fold_code(lo, True) * x0[None, :, :]
    part += _fold_code(b, False) * x1[None, :, :]
    part += _fold_code(b, True) * x2[None, :, :]
    part += _fold_code(q, False) * x3[None, :, :]
    part += _fold_code(q, True) * x4[None, :, :]
    part += _fold_code(c, False) * x5[None, :, :]
    part += _fold_code(c, True) * x6[None, :, :]
    part += _fold_code(hi, False) * x7[None, :, :]
    return _fold_finish(part, x0, x1, x2, x3, x4, x5, x6, x7)


# ``_nibble_dot_fold`` for one word in inline PTX: its temporaries live only inside the
# block, so the compiler cannot hoist the four shifted copies of every word a thread holds
# (the Triton form's register cost). $1 is the word, $2..$9 x for nibbles 0..7; $0 the sum of
# its 8 products (2048 + n) x_j for odd j, (128 + n) x_j for even j.
_FOLD_PTX = tl.constexpr(
    "{\n.reg .b32 t, f, lo, hi;\nmov.b32 lo, 0x45000000;\nmov.b32 hi, 0x43000000;\n"
    "lop3.b32 f, $1, 0xF000, lo, 0xEA;\nmul.rn.f32 $0, f, $5;\n"
    "lop3.b32 f, $1, 0xF0000, hi, 0xEA;\nfma.rn.f32 $0, f, $6, $0;\n"
    "shl.b32 t, $1, 8;\n"
    "lop3.b32 f, t, 0xF000, lo, 0xEA;\nfma.rn.f32 $0, f, $3, $0;\n"
    "lop3.b32 f, t, 0xF0000, hi, 0xEA;\nfma.rn.f32 $0, f, $4, $0;\n"
    "shr.u32 t, $1, 8;\n"
    "lop3.b32 f, t, 0xF000, lo, 0xEA;\nfma.rn.f32 $0, f, $7, $0;\n"
    "lop3.b32 f, t, 0xF0000, hi, 0xEA;\nfma.rn.f32 $0, f, $8, $0;\n"
    "shl.b32 t, $1, 16;\n"
    "lop3.b32 f, t, 0xF0000, hi, 0xEA;\nfma.rn.f32 $0, f, $2, $0;\n"
    "shr.u32 t, $1, 16;\n"
    "lop3.b32 f, t, 0xF000, lo, 0xEA;\nfma.rn.f32 $0, f, $9, $0;\n}"
)


@triton.jit
def _nibble_dot_fold_asm(q, x0, x1, x2, x3, x4, x5, x6, x7):
    """``_nibble_dot_fold`` with each word's products in inline PTX (``_FOLD_PTX``); CUDA
    only (no interpreter)."""
    shape: tl.constexpr = q.shape
    part = tl.inline_asm_elementwise(
        asm=_FOLD_PTX,
        constraints="=r,r,r,r,r,r,r,r,r,r",
        args=[
            q,
            tl.broadcast_to(x0[None, :, :], shape),
            tl.broadcast_to(x1[None, :, :], shape),
            tl.broadcast_to(x2[None, :, :], shape),
            tl.broadcast_to(x3[None, :, :], shape),
            tl.broadcast_to(x4[None, :, :], shape),
            tl.broadcast_to(x5[None, :, :], shape),
            tl.broadcast_to(x6[None, :, :], shape),
            tl.broadcast_to(x7[None, :, :], shape),
        ],
        dtype=tl.float32,
        is_pure=True,
        pack=1,
    )
    return _fold_finish(part, x0, x1, x2, x3, x4, x5, x6, x7)


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
def _nibble_mma(q, x_ptrs, x32_ptrs, offs_w, m_mask, k_end, part, x_sum, MAGIC, IS_BF16, EVEN_MK):
    """part [BM, BN] += x[:, 8w + j] @ codes_j^T over the 8 nibbles j of the words q [BN, W];
    x_sum [BM] += sum_k x_k.

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
            c_lo = _nibble_plane(q, hi, 2 * i, MAGIC, IS_BF16)
            c_hi = _nibble_plane(q, hi, 2 * i + 1, MAGIC, IS_BF16)
            part = tl.dot(x_lo, tl.trans(c_lo), acc=part)
            part = tl.dot(x_hi, tl.trans(c_hi), acc=part)
    return part, x_sum


@triton.jit
def _epilogue(acc, out_ptrs, ws_ptrs, mask, lock_ptr, tile_id, num_splits, MODE: tl.constexpr,
              pid_k, slot_stride):  # fmt: skip
    # MODE 0: one split, store. MODE 1: fp32 atomics into a zeroed fp32 output (cast later).
    # MODE 2: atomics into a self-cleaning fp32 workspace; the last split of a tile (ticket
    # from the lock) reads the sum, writes the output and resets workspace and lock to 0.
    # MODE 3: the split stores its partial in its own slot (pid_k) of the workspace, slots
    # ``slot_stride`` floats apart; the last split of the tile adds the slots in split order
    # and resets the lock (plain stores: scalar fp32 atomics were most of the time of the
    # split-K kernels at M = 16-64, BENCHMARKS.md).
    if MODE == 0:
        tl.store(out_ptrs, acc.to(out_ptrs.dtype.element_ty), mask=mask)
    elif MODE == 1:
        tl.atomic_add(out_ptrs, acc, mask=mask, sem="relaxed")
    elif MODE == 3:
        tl.store(ws_ptrs + pid_k * slot_stride, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial is in before the (releasing) ticket
        ticket = tl.atomic_add(lock_ptr + tile_id, 1, sem="acq_rel")
        if ticket == num_splits - 1:
            total = tl.zeros_like(acc)
            for split in range(num_splits):  # L2 only: the other slots came from other SMs
                total += tl.load(ws_ptrs + split * slot_stride, mask=mask, cache_modifier=".cg")
            tl.store(out_ptrs, total.to(out_ptrs.dtype.element_ty), mask=mask)
            tl.atomic_xchg(lock_ptr + tile_id, 0)
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


# Two weights per LOP3 and two HFMA2: c = (word >> 4j) & 0x000F000F | MAGIC x 2 (codes bias + n
# in the two halves, exact; (a & b) | c is truth table 0xEA), c - MAGIC x 2 (n, exact), then
# n * s + o rounded once. $4 is the word ($5, its copy from the pack of two, is unused), $6
# the pair (s, s), $7 the pair (o, o).
_DEQUANT_PTX_TEMPLATE = (
    "{\n.reg .b32 t, c, m;\nmov.b32 m, MAGIC;\n"
    + "".join(
        (f"shr.u32 t, $4, {4 * j};\n" if j else "")
        + f"lop3.b32 c, {'t' if j else '$4'}, 0x000F000F, m, 0xEA;\n"
        + "sub.TYPE c, c, m;\n"
        + f"fma.rn.TYPE ${j}, c, $6, $7;\n"
        for j in range(4)
    )
    + "}"
)
_DEQUANT_PTX_BF16 = tl.constexpr(
    _DEQUANT_PTX_TEMPLATE.replace("MAGIC", "0x43004300").replace("TYPE", "bf16x2")
)
_DEQUANT_PTX_F16 = tl.constexpr(
    _DEQUANT_PTX_TEMPLATE.replace("MAGIC", "0x64006400").replace("TYPE", "f16x2")
)


@triton.jit
def _dequant_asm(q, s, o, PAIRED: tl.constexpr = True):
    """int32 words q [R, W], the tile's scale s and offset o [R] in x's dtype (bf16 or fp16)
    -> weights q * s + o [R, 8W] in that dtype, by inline PTX on pairs (see
    ``_DEQUANT_PTX_TEMPLATE``): about 2 instructions per weight. CUDA only (no interpreter).

    PAIRED: position t of a word's 8 weights holds nibble ``t // 2 + 4 * (t % 2)`` (the two
    halves of one register sit side by side, as the MMA reads a register operand): the caller
    reads x in the same order (``_asm_k_order``). Else the weights are in K order (for a tile
    that goes through shared memory anyway, as the right operand of ``tl.dot`` does).
    """
    qq = tl.join(q, q)
    ss = tl.broadcast_to(tl.join(s, s)[:, None, :], qq.shape)
    oo = tl.broadcast_to(tl.join(o, o)[:, None, :], qq.shape)
    p0, p1, p2, p3 = tl.inline_asm_elementwise(
        asm=_DEQUANT_PTX_BF16 if s.dtype == tl.bfloat16 else _DEQUANT_PTX_F16,
        constraints="=r,=r,=r,=r,r,r,r,r",
        args=[qq, ss, oo],
        dtype=(s.dtype, s.dtype, s.dtype, s.dtype),
        is_pure=True,
        pack=2,
    )
    # [R, W, pair (nibble j or j + 4), a, b] with j = 2a + b: K order is 4 pair + j
    w = tl.join(tl.join(p0, p2), tl.join(p1, p3))
    if PAIRED:  # pairs innermost: t = 2j + pair
        w = tl.permute(w, (0, 1, 3, 4, 2))
    return tl.reshape(w, [q.shape[0], 8 * q.shape[1]])


@triton.jit
def _asm_k_order(x):
    """x [R, K] (K a multiple of 8) with each word's 8 columns in ``_dequant_asm``'s order:
    position t holds column t // 2 + 4 (t % 2) (a permutation within a thread's registers)."""
    rows: tl.constexpr = x.shape[0]
    cols: tl.constexpr = x.shape[1]
    x = tl.permute(tl.reshape(x, [rows, cols // 8, 2, 4]), (0, 1, 3, 2))
    return tl.reshape(x, [rows, cols])
