"""W4A16 GEMM on Hopper, written in Gluon so that the decode of a weight tile can run beside
the tensor-core products of the previous ones. Two kernels: ``_int4_wgmma_kernel`` (below)
and, for small M, ``_int4_wgmma_swap_kernel``, which decodes each weight tile straight into
wgmma's register operand and reads x from its TMA buffer (see its comments and
``_decode_fragment``), with split-K. The swapped kernel also reads words in fragment order
(``Int4Weight.frag``, ``int4_weight.frag_order``; ``_decode_frag``): each lane then loads
only its own 16 bytes of a row per K tile (canonical words: 64, shared by four lanes) and
decodes each register with one LOP3, SUB and FMA, plus one SHR for all but the first of a
word: about 20% fewer instructions per tile and 121 registers instead of 168 (offline sm_90
compile, ``benchmarks/sass_int4_swap.py``).

``y = x @ dequant(W)^T`` for 16-bit x on sm_90+. Per K step of an output tile:
- TMA brings x's tile and the packed weight words into a ring of ``NUM_STAGES`` buffers;
- every warp decodes its share of the weight tile by inline PTX, two weights per
  instruction (``_DEQUANT_PTX_*``, as the Triton kernels), in K order;
- the decoded tile goes into one of three shared-memory buffers;
- one asynchronous ``wgmma`` multiplies x's buffer by it.

A step decodes its tile while the tensor cores still work on the two steps before it; it
waits (``num_outstanding=1``) only for the wgmma two steps back, just before storing the
tile. The wait is per warpgroup, and with 8 warps each warpgroup multiplies its rows of x by
the whole decoded tile, so a buffer is refilled only once every warpgroup has waited for the
wgmma that read it before a barrier the writer has passed: ring slots two steps back, decoded
tiles (three buffers) three steps back.

That overlap is what Triton's own pipeliner does not produce for an operand computed in
registers: ``tl.dot`` on a decoded tile waits for each MMA before the next decode
(BENCHMARKS.md, "INT4 GEMM").

Measured on the H200 (BENCHMARKS.md): the overlap is partial. With a stage left out, the
decode alone and the products alone each take about as long as cuBLAS bf16 for the whole
GEMM, and the kernel takes about 1.4x that. The table now takes it only for groups of 64
(K tiles of 64) on wide weights at 64 < M <= 256; with groups of 128 or more the swapped
kernel, with two wgmmas in flight (``PIPE``), runs at large M too
(``int4_gemm_config._large_config``).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels.int4_gemm_config import THREAD_RELEASE_SLOTS
from kernels.int4_tiles import _DEQUANT_PTX_BF16, _DEQUANT_PTX_F16
from kernels.int4_weight import FRAG_TILE_K, Int4Weight, tma_tiles_ok
from kernels.launch import FastLaunch
from kernels.split_k import split_k_output

_GL_DTYPE = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


@gluon.jit
def _decode_k_order(q, s, o, IS_BF16: gl.constexpr):
    """Words q [R, W] and the tile's scale and offset s, o [R] (x's dtype) -> q * s + o
    [R, 8W] in K order, by inline PTX on pairs (nibbles j and j + 4 of a word per register).
    The Gluon twin of ``int4_tiles._dequant_asm(..., PAIRED=False)`` (same PTX): a Gluon
    kernel cannot call a ``triton.jit`` function."""
    qq = gl.join(q, q)
    s2 = gl.broadcast(gl.expand_dims(s, 1), q)[0]
    o2 = gl.broadcast(gl.expand_dims(o, 1), q)[0]
    ss = gl.join(s2, s2)
    oo = gl.join(o2, o2)
    p0, p1, p2, p3 = gl.inline_asm_elementwise(
        asm=_DEQUANT_PTX_BF16 if IS_BF16 else _DEQUANT_PTX_F16,
        constraints="=r,=r,=r,=r,r,r,r,r",
        args=[qq, ss, oo],
        dtype=(s.dtype, s.dtype, s.dtype, s.dtype),
        is_pure=True,
        pack=2,
    )
    # [R, W, pair (nibble j or j + 4), a, b] with j = 2a + b: K order is 4 pair + j
    w = gl.join(gl.join(p0, p2), gl.join(p1, p3))
    return gl.reshape(w, [q.shape[0], 8 * q.shape[1]])


@gluon.jit
def _load_stage(x_desc, qw_desc, x_bufs, q_bufs, bars, kt, num_k, off_m, off_n,
                NUM_STAGES: gl.constexpr, BLOCK_K: gl.constexpr):  # fmt: skip
    """TMA of K tile ``kt`` (if it exists) into ring slot kt % NUM_STAGES."""
    slot = kt % NUM_STAGES
    pred = kt < num_k
    bar = bars.index(slot)
    mbarrier.expect(bar, x_desc.block_type.nbytes + qw_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(x_desc, [off_m, kt * BLOCK_K], bar, x_bufs.index(slot), pred)
    tma.async_copy_global_to_shared(
        qw_desc, [off_n, kt * (BLOCK_K // 8)], bar, q_bufs.index(slot), pred
    )


@gluon.jit
def _int4_wgmma_kernel(
    x_desc,  # x [M, K], block [BLOCK_M, BLOCK_K]
    qw_desc,  # packed words [N, K // 8], block [BLOCK_N, BLOCK_K // 8]
    s_ptr,
    o_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_s_g,
    stride_out_m,
    W_LAYOUT: gl.constexpr,  # shared layout of the decoded tile [BLOCK_N, BLOCK_K]
    GROUP_TILES: gl.constexpr,  # K tiles per quantization group; 0: one group (per channel)
    GROUP_M: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = qw_desc.block_type.shape[0]
    WORDS: gl.constexpr = BLOCK_K // 8
    dtype: gl.constexpr = x_desc.dtype

    # Output tile, GROUP_M row tiles swept per column for L2 reuse of the weight.
    pid = gl.program_id(0)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    rows = gl.minimum(num_pid_m - first_m, GROUP_M)
    off_m = (first_m + (pid % in_group) % rows) * BLOCK_M
    off_n = ((pid % in_group) // rows) * BLOCK_N

    # Words: 4 per thread along K (32 decoded weights, 64 contiguous bytes of a row).
    TPW_K: gl.constexpr = WORDS // 4
    q_layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 // TPW_K, TPW_K], [num_warps, 1], [1, 0])
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16]
    )

    x_bufs = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
    q_bufs = gl.allocate_shared_memory(gl.int32, [NUM_STAGES, BLOCK_N, WORDS], qw_desc.layout)
    w_bufs = gl.allocate_shared_memory(dtype, [3, BLOCK_N, BLOCK_K], W_LAYOUT)
    bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(bars.index(i), count=1)

    num_k = gl.cdiv(K, BLOCK_K)
    for i in gl.static_range(NUM_STAGES - 2):
        _load_stage(x_desc, qw_desc, x_bufs, q_bufs, bars, i, num_k, off_m, off_n,
                    NUM_STAGES, BLOCK_K)  # fmt: skip

    offs_n = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, q_layout))
    n_mask = offs_n < N
    # loop-carried as the in-flight wgmma's accumulator
    acc = warpgroup_mma_init(gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=mma_layout))
    # the scales and offsets of a step are loaded one step ahead (an L2 round trip would
    # otherwise hold up every decode)
    s_next = gl.load(s_ptr + offs_n, mask=n_mask, other=0.0)
    o_next = gl.load(o_ptr + offs_n, mask=n_mask, other=0.0)
    for kt in range(num_k):
        s = s_next.to(dtype)
        o = o_next.to(dtype)
        row = 0 if GROUP_TILES == 0 else gl.minimum(kt + 1, num_k - 1) // GROUP_TILES
        s_next = gl.load(s_ptr + row * stride_s_g + offs_n, mask=n_mask, other=0.0)
        o_next = gl.load(o_ptr + row * stride_s_g + offs_n, mask=n_mask, other=0.0)
        slot = kt % NUM_STAGES
        mbarrier.wait(bars.index(slot), (kt // NUM_STAGES) & 1)
        q = q_bufs.index(slot).load(q_layout)
        w = _decode_k_order(q, s, o, dtype == gl.bfloat16)  # runs beside steps kt - 2, kt - 1
        # this warpgroup's wgmma of step kt - 2 is done. Buffer kt % 3 was last read by step
        # kt - 3's, which every warpgroup waited for at step kt - 1, before its barrier.
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        w_buf = w_bufs.index(kt % 3)
        w_buf.store(w)
        fence_async_shared()
        gl.thread_barrier()  # every warp's part of the tile is in before any warpgroup reads
        acc = warpgroup_mma(x_bufs.index(slot), w_buf.permute((1, 0)), acc, is_async=True)
        # every warpgroup finished step kt - 2's wgmma before the barrier: its ring slot takes
        # K tile kt + NUM_STAGES - 2
        _load_stage(x_desc, qw_desc, x_bufs, q_bufs, bars, kt + NUM_STAGES - 2, num_k, off_m,
                    off_n, NUM_STAGES, BLOCK_K)  # fmt: skip
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(bars.index(i))

    offs_m = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma_layout))
    offs_on = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_layout))
    mask = (offs_m < M)[:, None] & (offs_on < N)[None, :]
    ptrs = out_ptr + offs_m[:, None] * stride_out_m + offs_on[None, :]
    gl.store(ptrs, acc.to(dtype), mask=mask)


# One pair of weights (nibbles 2t, 2t + 1 of a word: byte t, t the thread's lane % 4) per
# register, in the order the wgmma A fragment holds them. PRMT gathers byte t into bytes 0
# and 2 (selector $3); LOP3 keeps a nibble of each half over the magic exponent (truth table
# 0xEA: (a & b) | c); SUB leaves the two codes exactly; one FMA with the pairs $5 (scale) and
# $6 (offset) gives q * s + o rounded once. $1 is the word; $2 and $4 are the unused copies
# from the pack of two.
# bf16 (7 mantissa bits): the high nibble must sit at bits 16..19, so byte 2 comes from the
# word shifted right by 4 (selector t | (t + 4) << 8) and the scale pair is (s, s).
_PAIR_PTX_BF16 = gl.constexpr(
    "{\n.reg .b32 t, u, m;\nmov.b32 m, 0x43004300;\n"
    "shr.u32 u, $1, 4;\n"
    "prmt.b32 t, $1, u, $3;\n"
    "lop3.b32 t, t, 0x000F000F, m, 0xEA;\n"
    "sub.bf16x2 t, t, m;\n"
    "fma.rn.bf16x2 $0, t, $5, $6;\n}"
)
# fp16 (10 mantissa bits): byte t in bytes 0 and 2 (selector t | t << 8), the high nibble
# kept in place at bits 20..23 (16 n1 after the SUB), so the scale pair is (s, s / 16).
_PAIR_PTX_F16 = gl.constexpr(
    "{\n.reg .b32 t, m;\nmov.b32 m, 0x64006400;\n"
    "prmt.b32 t, $1, 0, $3;\n"
    "lop3.b32 t, t, 0x00F0000F, m, 0xEA;\n"
    "sub.f16x2 t, t, m;\n"
    "fma.rn.f16x2 $0, t, $5, $6;\n}"
)


@gluon.jit
def _decode_fragment(q, sel, s, o, a_layout: gl.constexpr, IS_BF16: gl.constexpr):
    """Words q [R, W] (each thread holds its rows' whole words), the byte selectors sel [4] of
    the four lanes that share a row (``_PAIR_PTX_*``), scale and offset s, o [R] -> q * s + o
    [R, 8W] in the wgmma A-operand layout ``a_layout``, decoded in registers.

    Element (r, w, t, b) of the [R, W, 4, 2] intermediate is nibble 2t + b of word w, that is
    column 8w + 2t + b: the lane with t = lane % 4 keeps byte t of every word of its rows, which
    is what the fragment asks of it, so the final layout change only renames registers."""
    q3 = gl.expand_dims(q, 2)
    t3 = gl.expand_dims(gl.expand_dims(sel, 0), 1)
    q3, t3 = gl.broadcast(q3, t3)
    s3 = gl.broadcast(gl.expand_dims(gl.expand_dims(s, 1), 2), q3)[0]
    o3 = gl.broadcast(gl.expand_dims(gl.expand_dims(o, 1), 2), q3)[0]
    s_hi = s3 if IS_BF16 else s3 * 0.0625
    v = gl.inline_asm_elementwise(
        asm=_PAIR_PTX_BF16 if IS_BF16 else _PAIR_PTX_F16,
        constraints="=r,r,r,r,r,r,r",
        args=[gl.join(q3, q3), gl.join(t3, t3), gl.join(s3, s_hi), gl.join(o3, o3)],
        dtype=s.dtype,
        is_pure=True,
        pack=2,
    )
    v = gl.reshape(v, [q.shape[0], 8 * q.shape[1]])
    return gl.convert_layout(v, a_layout, assert_trivial=True)


@gluon.jit
def _decode_frag(q, s, o, a_layout: gl.constexpr, IS_BF16: gl.constexpr):
    """Fragment-ordered words q [R, 16 T] (``int4_weight.frag_order``; each thread holds words
    4t .. 4t + 3 of every 128-K tile of its rows, t = lane % 4), the tile's scale and offset
    s, o [R] (x's dtype) -> q * s + o [R, 128 T] in the wgmma A layout ``a_layout``.

    Word 4t + b of a tile holds the four registers of the lane's fragment for the tile's 32-K
    block b: register j = 2c + e (K 32b + 16c + 8e + 2t + h) is nibbles j (h = 0) and j + 4
    (h = 1), the pairs ``_DEQUANT_PTX_*`` decodes with one SHR (j > 0), LOP3, SUB and FMA: the
    loads are 16 bytes a row per thread and no lane reads another lane's bytes."""
    R: gl.constexpr = q.shape[0]
    T: gl.constexpr = q.shape[1] // 16
    q4 = gl.reshape(q, [R, T, 4, 4])  # [rows, tile, t, b]
    p0, p1, p2, p3 = _dequant_registers(q4, gl.expand_dims(s, 1), gl.expand_dims(o, 1), q,
                                        IS_BF16)  # fmt: skip
    return _frag_k_order(p0, p1, p2, p3, a_layout)


@gluon.jit
def _dequant_registers(q4, s, o, q, IS_BF16: gl.constexpr):
    """Words q4 [..., 4 (t), 4 (b)] (``q`` [..., 16] reshaped) and their rows' scales and
    offsets s, o ([..., 1], broadcast against ``q``) -> the four registers j of every word as
    q * s + o, each [..., 4, 4, 2 (h)] (``_DEQUANT_PTX_*``: nibbles j and j + 4)."""
    s4 = gl.reshape(gl.broadcast(s, q)[0], q4.shape)
    o4 = gl.reshape(gl.broadcast(o, q)[0], q4.shape)
    return gl.inline_asm_elementwise(
        asm=_DEQUANT_PTX_BF16 if IS_BF16 else _DEQUANT_PTX_F16,
        constraints="=r,=r,=r,=r,r,r,r,r",
        args=[gl.join(q4, q4), gl.join(s4, s4), gl.join(o4, o4)],
        dtype=(s.dtype, s.dtype, s.dtype, s.dtype),
        is_pure=True,
        pack=2,
    )


@gluon.jit
def _frag_k_order(p0, p1, p2, p3, a_layout: gl.constexpr):
    """The four registers j of every fragment-ordered word, each [R, T, 4 (t), 4 (b), 2 (h)]
    16-bit values (nibbles j, j + 4), -> [R, 128 T] in K order in the mma A layout
    ``a_layout`` (registers renamed only)."""
    R: gl.constexpr = p0.shape[0]
    T: gl.constexpr = p0.shape[1]
    # [rows, tile, t, b, h, e, c] -> K order (tile, b, c, e, t, h)
    w = gl.join(gl.join(p0, p1), gl.join(p2, p3))
    w = gl.permute(w, (0, 1, 3, 6, 5, 2, 4))
    w = gl.reshape(w, [R, 128 * T])
    return gl.convert_layout(w, a_layout, assert_trivial=True)


@gluon.jit
def _load_row(buf, layout: gl.constexpr, row_layout: gl.constexpr):
    """A [1, BLOCK_N] shared row -> [BLOCK_N] in ``row_layout`` (registers renamed only)."""
    v = buf.load(layout)
    return gl.convert_layout(gl.reshape(v, [v.shape[1]]), row_layout, assert_trivial=True)


@gluon.jit
def _decode_step(q_bufs, s_bufs, o_bufs, bars, kt, sel, a_layout: gl.constexpr,
                 q_layout: gl.constexpr, s_layout: gl.constexpr, NUM_STAGES: gl.constexpr,
                 IS_BF16: gl.constexpr, FRAG: gl.constexpr):  # fmt: skip
    """Wait for ring slot kt % NUM_STAGES to hold K tile kt, then decode its weights into the
    wgmma A fragment (``_decode_fragment``, or ``_decode_frag`` for fragment-ordered words)."""
    dtype: gl.constexpr = gl.bfloat16 if IS_BF16 else gl.float16
    slot = kt % NUM_STAGES
    mbarrier.wait(bars.index(slot), (kt // NUM_STAGES) & 1)
    row_layout: gl.constexpr = gl.SliceLayout(1, q_layout)
    q = q_bufs.index(slot).load(q_layout)
    s = _load_row(s_bufs.index(slot), s_layout, row_layout).to(dtype)
    o = _load_row(o_bufs.index(slot), s_layout, row_layout).to(dtype)
    if FRAG:
        a = _decode_frag(q, s, o, a_layout, IS_BF16)
    else:
        a = _decode_fragment(q, sel, s, o, a_layout, IS_BF16)
    return a


@gluon.jit
def _load_swap_stage(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs, bars, kt,
                     num_k, k_tile0, off_m, off_n, NUM_STAGES: gl.constexpr,
                     GROUP_TILES: gl.constexpr, PART: gl.constexpr = 0):  # fmt: skip
    """TMA of K tile ``k_tile0 + kt`` (if kt < num_k) and its scale and offset rows into ring
    slot kt % NUM_STAGES (the scales by TMA too: a global load in the loop would hold up the
    proxy fence before every refill). PART 1 expects the whole stage's bytes but copies only
    the weight's (words, scales, offsets), PART 2 then only x's: the slot's barrier completes
    once both have landed (``weights_first``)."""
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    slot = kt % NUM_STAGES
    pred = kt < num_k
    bar = bars.index(slot)
    nbytes: gl.constexpr = (
        x_desc.block_type.nbytes
        + qw_desc.block_type.nbytes
        + s_desc.block_type.nbytes
        + o_desc.block_type.nbytes
    )
    k = (k_tile0 + kt) * BLOCK_K
    row = 0 if GROUP_TILES == 0 else (k_tile0 + kt) // GROUP_TILES
    if PART != 2:
        mbarrier.expect(bar, nbytes, pred=pred)
    if PART != 1:
        tma.async_copy_global_to_shared(x_desc, [off_m, k], bar, x_bufs.index(slot), pred)
    if PART != 2:
        if len(qw_desc.block_type.shape) == 3:  # words in tile order (``_tiled_words_desc``)
            q_dst = q_bufs.index(slot)._reinterpret(
                gl.int32, qw_desc.block_type.shape, qw_desc.layout
            )
            tma.async_copy_global_to_shared(qw_desc, [off_n // 16, k // 8, 0], bar, q_dst, pred)
        else:
            tma.async_copy_global_to_shared(qw_desc, [off_n, k // 8], bar, q_bufs.index(slot), pred)
        tma.async_copy_global_to_shared(s_desc, [row, off_n], bar, s_bufs.index(slot), pred)
        tma.async_copy_global_to_shared(o_desc, [row, off_n], bar, o_bufs.index(slot), pred)


@gluon.jit
def _vector_rows(acc):
    """acc [BLOCK_N, BLOCK_M] in a layout where each thread holds 8 consecutive rows n of one
    column m: 8 consecutive elements of one row of the transposed output (or of a split-K
    slot), which it stores or loads as one 16-byte access (32 bytes in fp32). In the wgmma
    accumulator's layout a thread's neighbouring values lie in neighbouring columns, that is
    in different rows of the output: one 2-byte store each."""
    ROWS_T: gl.constexpr = min(acc.shape[0] // 8, 32)  # threads of a warp along n
    layout: gl.constexpr = gl.BlockedLayout(
        [8, 1], [ROWS_T, 32 // ROWS_T], [1, gl.num_warps()], [0, 1]
    )
    return gl.convert_layout(acc, layout)


# MODE 4's lock: tickets count in the lower half, finished slots in the upper (splits < 2^16)
_DONE = gl.constexpr(1 << 16)


@gluon.jit
def _swap_epilogue(acc, out_ptr, ws_ptr, lock_ptr, pid, pid_k, num_splits, M, N, off_m, off_n,
                   stride_out_m, MODE: gl.constexpr,
                   VECTOR_STORE: gl.constexpr = False):  # fmt: skip
    """Store acc [BLOCK_N, BLOCK_M] (transposed) into out, or reduce the splits of a tile as
    int4_tiles._epilogue (MODE 0 store, 1 fp32 atomics, 2 workspace and ticket), or (MODE 3)
    store the split's partial in its own slot of the workspace ([split, M, N], plain stores),
    after which the last split of the tile (a ticket) adds the slots in split order, or
    (MODE 4, ``early_ticket``) as 3 with the ticket taken first: the splits that are not
    last store their slot and then count themselves done in the lock's upper half
    (``_DONE``, releasing), and the last waits until all of them are (acquiring) and adds
    their slots and its own partial, kept in registers, in split order (the same sums as
    MODE 3): the last split neither stores its slot nor reads it back, and its ticket is not
    behind its store. Every split it waits for has taken its ticket, that is it is running.
    ``VECTOR_STORE``: acc first goes through shared memory into ``_vector_rows``' layout
    (MODE 0, 3 and 4: the same values stored, the slots added in the same order)."""
    BLOCK_N: gl.constexpr = acc.shape[0]
    BLOCK_M: gl.constexpr = acc.shape[1]
    dtype: gl.constexpr = out_ptr.dtype.element_ty
    if VECTOR_STORE:
        if MODE == 0:
            acc = acc.to(dtype)  # half the bytes through shared memory
        acc = _vector_rows(acc)
    mma_layout: gl.constexpr = acc.type.layout
    offs_on = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma_layout))
    offs_m = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma_layout))
    mask = (offs_on < N)[:, None] & (offs_m < M)[None, :]
    out_ptrs = out_ptr + offs_m[None, :] * stride_out_m + offs_on[:, None]
    if MODE == 0:
        gl.store(out_ptrs, acc.to(dtype), mask=mask)
    elif MODE == 1:
        gl.atomic_add(out_ptrs, acc, mask=mask, sem="relaxed")
    elif MODE == 3 or MODE == 4:
        slot_ptrs = ws_ptr + offs_m[None, :] * N + offs_on[:, None]
        if MODE == 3:
            gl.store(slot_ptrs + pid_k * M * N, acc, mask=mask)
            gl.thread_barrier()  # every thread's partial is in before the (releasing) ticket
            ticket = gl.atomic_add(lock_ptr + pid, 1, sem="acq_rel")
        else:
            ticket = gl.atomic_add(lock_ptr + pid, 1, sem="relaxed") & (_DONE - 1)
            if ticket < num_splits - 1:
                gl.store(slot_ptrs + pid_k * M * N, acc, mask=mask)
                gl.thread_barrier()  # every thread's partial is in before the (releasing) count
                gl.atomic_add(lock_ptr + pid, _DONE, sem="release")
            else:
                done = ticket * 0
                while done < num_splits - 1:
                    done = gl.atomic_add(lock_ptr + pid, 0, sem="acquire") // _DONE
        if ticket == num_splits - 1:
            total = gl.zeros_like(acc)
            for split in range(num_splits):  # in split order
                if MODE == 4 and split == pid_k:  # its own partial, still in registers
                    total += acc
                else:  # L2 only: the other slots came from other SMs
                    total += gl.load(slot_ptrs + split * M * N, mask=mask, cache_modifier=".cg")
            gl.store(out_ptrs, total.to(dtype), mask=mask)
            gl.atomic_xchg(lock_ptr + pid, 0)
    else:
        # as int4_tiles._epilogue: the last split of a tile reads the sum, stores the output
        # and leaves workspace and lock at 0
        ws_ptrs = ws_ptr + offs_m[None, :] * N + offs_on[:, None]
        gl.atomic_add(ws_ptrs, acc, mask=mask, sem="relaxed")
        gl.thread_barrier()
        ticket = gl.atomic_add(lock_ptr + pid, 1, sem="acq_rel")
        if ticket == num_splits - 1:
            total = gl.atomic_add(ws_ptrs, gl.zeros_like(acc), mask=mask)
            total = gl.where(mask, total, 0.0)
            gl.store(out_ptrs, total.to(dtype), mask=mask)
            gl.store(ws_ptrs, gl.zeros_like(acc), mask=mask)
            gl.atomic_xchg(lock_ptr + pid, 0)


# The named barriers (PTX ``bar``, ids 0-15) of ``THREAD_RELEASE``'s ring slots, the last six
# ids (Triton takes the first ones: 0 for ``gl.thread_barrier``, 1 and more in
# warp-specialized code), so rings of up to 6 slots.
_EMPTY_BARS = THREAD_RELEASE_SLOTS
_EMPTY_BAR0 = gl.constexpr(16 - _EMPTY_BARS)


@gluon.jit
def _named_barrier(bar_id, threads: gl.constexpr, wait: gl.constexpr):
    """``bar.arrive`` (``wait`` False: go on at once) or ``bar.sync`` (wait for ``threads``
    arrivals, the caller's included) on named barrier ``bar_id``, once per warp of the
    calling partition (every thread of a warp executes it; the barrier counts whole warps)."""
    L: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    ids = gl.full([gl.num_warps() * 32], bar_id, gl.int32, layout=L)
    count = gl.full([gl.num_warps() * 32], threads, gl.int32, layout=L)
    ASM: gl.constexpr = "bar.sync" if wait else "bar.arrive"
    gl.inline_asm_elementwise(
        asm=ASM + " $1, $2;\n\tmov.u32 $0, 0;",
        constraints="=r,r,r",
        args=[ids, count],
        dtype=gl.int32,
        is_pure=False,
        pack=1,
    )


@gluon.jit
def _swap_release(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs, ready, empty,
                  kt, num_k, k_tile0, off_m, off_n, NUM_STAGES: gl.constexpr,
                  GROUP_TILES: gl.constexpr, SPECIALIZED: gl.constexpr,
                  THREAD_RELEASE: gl.constexpr = False):  # fmt: skip
    """Once every warp is past the wait for K tile kt's wgmma (kt >= 0), its ring slot is
    handed back to the producer warp (``SPECIALIZED``) or refilled with tile kt + NUM_STAGES.
    ``THREAD_RELEASE`` (``SPECIALIZED``): no barrier of the decoding warps here; each warp
    arrives (``bar.arrive``, no wait) on the slot's named barrier once past its own wait, and
    the producer warp's ``bar.sync`` on it completes once all of them have. An mbarrier
    arrival cannot do this from Gluon: it is issued by one thread of the partition, after a
    barrier of all its warps that Triton's shared-memory analysis inserts before any arrival.
    (The same analysis still puts one barrier of the decoding warps before each wait on a
    ring slot's ``ready`` barrier; this removes the other one per K tile.)"""
    if THREAD_RELEASE:
        if kt >= 0:
            _named_barrier(_EMPTY_BAR0 + kt % NUM_STAGES, gl.num_warps() * 32 + 32, False)
    else:
        gl.thread_barrier()
        if kt >= 0:
            if SPECIALIZED:
                mbarrier.arrive(empty.index(kt % NUM_STAGES))
            else:
                _load_swap_stage(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs,
                                 o_bufs, ready, kt + NUM_STAGES, num_k, k_tile0, off_m, off_n,
                                 NUM_STAGES, GROUP_TILES)  # fmt: skip


@gluon.jit
def _swap_mainloop(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs, ready,
                   empty, num_k, k_tile0, off_m, off_n, L3: gl.constexpr,
                   S_LAYOUT: gl.constexpr, GROUP_TILES: gl.constexpr, NUM_STAGES: gl.constexpr,
                   SPECIALIZED: gl.constexpr, FRAG: gl.constexpr, num_warps: gl.constexpr,
                   PARTS: gl.constexpr = 0, PIPE: gl.constexpr = False,
                   THREAD_RELEASE: gl.constexpr = False):  # fmt: skip
    """The decoding warps' loop: acc [BLOCK_N, BLOCK_M] over the program's K tiles (in a
    1-tuple, as a warp-specialized default partition returns). Once a ring slot is done with,
    it is refilled here, or with ``SPECIALIZED`` handed back to the producer warp through its
    empty barrier. ``PARTS`` (not SPECIALIZED; for ``benchmarks/bench_int4_parts.py``): 1
    runs the TMA ring and each tile's wgmma on an operand of ones instead of the decoded
    weight (acc = the sums of x's rows), 2 the ring alone (acc = 0)."""
    dtype: gl.constexpr = x_desc.dtype
    IS_BF16: gl.constexpr = dtype == gl.bfloat16
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = s_desc.block_type.shape[1]
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_M, 16]
    )
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    if FRAG:  # L3 is the words' own layout; no byte selectors
        q_layout: gl.constexpr = L3
        sel = 0
    else:
        q_layout: gl.constexpr = gl.SliceLayout(2, L3)
        t = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
        sel = t | ((t + 4) << 8) if IS_BF16 else t | (t << 8)
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma_layout)
    if PARTS != 0:  # measurement only (``PARTS``): no decode
        ones = gl.full([BLOCK_N, x_desc.block_type.shape[1]], 1.0, dtype, layout=a_layout)
        for kt in range(num_k):
            mbarrier.wait(ready.index(kt % NUM_STAGES), (kt // NUM_STAGES) & 1)
            if PARTS == 1:
                x_tile = x_bufs.index(kt % NUM_STAGES).permute((1, 0))
                acc = warpgroup_mma(ones, x_tile, acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            gl.thread_barrier()
            _load_swap_stage(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs,
                             ready, kt + NUM_STAGES, num_k, k_tile0, off_m, off_n, NUM_STAGES,
                             GROUP_TILES)  # fmt: skip
        return (acc,)
    a = _decode_step(q_bufs, s_bufs, o_bufs, ready, 0, sel, a_layout, q_layout, S_LAYOUT,
                     NUM_STAGES, IS_BF16, FRAG)  # fmt: skip
    if PIPE:
        # Two wgmmas in flight, over pairs of K tiles (num_k even): tile kt is issued, the
        # wait is for tile kt - 1 only, and tile kt + 1 is decoded while kt multiplies, so its
        # wgmma queues behind kt's and the tensor cores do not idle while the warps wait, sync
        # and refill. Even and odd tiles decode into two operands (a0, a1) that each stay in
        # their registers from their decode until the wait after the next tile's issue (the
        # wait's deps keep them live): a wgmma reads its register operand asynchronously, so
        # a loop-carried operand copied into place each iteration would be overwritten while
        # the previous wgmma still reads it.
        a0 = a
        a1 = a
        for kp in range(num_k // 2):
            kt = 2 * kp
            acc = warpgroup_mma(a0, x_bufs.index(kt % NUM_STAGES).permute((1, 0)), acc,
                                is_async=True)  # fmt: skip
            acc, a1 = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a1))
            _swap_release(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs, ready,
                          empty, kt - 1, num_k, k_tile0, off_m, off_n, NUM_STAGES, GROUP_TILES,
                          SPECIALIZED, THREAD_RELEASE)  # fmt: skip
            a1 = _decode_step(q_bufs, s_bufs, o_bufs, ready, kt + 1, sel, a_layout, q_layout,
                              S_LAYOUT, NUM_STAGES, IS_BF16, FRAG)  # fmt: skip
            acc = warpgroup_mma(a1, x_bufs.index((kt + 1) % NUM_STAGES).permute((1, 0)), acc,
                                is_async=True)  # fmt: skip
            acc, a0 = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a0))
            _swap_release(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs, ready,
                          empty, kt, num_k, k_tile0, off_m, off_n, NUM_STAGES, GROUP_TILES,
                          SPECIALIZED, THREAD_RELEASE)  # fmt: skip
            # the last pair decodes its own last tile again (never refilled) instead of past K
            a0 = _decode_step(q_bufs, s_bufs, o_bufs, ready, gl.minimum(kt + 2, num_k - 1), sel,
                              a_layout, q_layout, S_LAYOUT, NUM_STAGES, IS_BF16,
                              FRAG)  # fmt: skip
        acc, a0, a1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a0, a1))
        return (acc,)
    for kt in range(num_k):
        acc = warpgroup_mma(a, x_bufs.index(kt % NUM_STAGES).permute((1, 0)), acc, is_async=True)
        # the next tile (the last one again at the end: its slot is never refilled) is decoded
        # here, but not while the tensor cores multiply this one: ``a_next`` becomes ``a``,
        # so it gets ``a``'s registers, and ptxas puts the wait below ahead of the decode
        # (``benchmarks/sass_int4_swap.py --overlap``: none of the decode's instructions run
        # beside a wgmma in flight; with ``PIPE`` all of them do)
        a_next = _decode_step(q_bufs, s_bufs, o_bufs, ready, gl.minimum(kt + 1, num_k - 1), sel,
                              a_layout, q_layout, S_LAYOUT, NUM_STAGES, IS_BF16,
                              FRAG)  # fmt: skip
        # The wgmma reads ``a`` from registers asynchronously: ``a`` (the very value it was
        # given) stays live until this wait, so the decode above cannot reuse its registers.
        acc, a = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a))
        # every warp is past its wait and has read its words of tile kt (decoded one step
        # earlier) before the slot is refilled with tile kt + NUM_STAGES
        _swap_release(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs, ready,
                      empty, kt, num_k, k_tile0, off_m, off_n, NUM_STAGES, GROUP_TILES,
                      SPECIALIZED, THREAD_RELEASE)  # fmt: skip
        a = a_next
    return (acc,)


@gluon.jit
def _swap_producer(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs, ready,
                   empty, num_k, k_tile0, off_m, off_n, NUM_STAGES: gl.constexpr,
                   GROUP_TILES: gl.constexpr, THREAD_RELEASE: gl.constexpr = False,
                   CONSUMER_WARPS: gl.constexpr = 4, PIPE: gl.constexpr = False):  # fmt: skip
    """The TMA warp of the specialized form: fills slot kt % NUM_STAGES with K tile kt once the
    consumers released it (an empty barrier's previous phase counts as done at the start).
    ``THREAD_RELEASE``: the release is the slot's named barrier (``_swap_release``), which
    this warp syncs on with the ``CONSUMER_WARPS`` warps' arrivals before each refill, and
    once more for each tile released but never refilled (the last NUM_STAGES, less the last
    tile with ``PIPE``, which the consumers never release), so that every barrier ends
    complete."""
    THREADS: gl.constexpr = CONSUMER_WARPS * 32 + 32
    for kt in range(num_k):
        slot = kt % NUM_STAGES
        if THREAD_RELEASE:
            if kt >= NUM_STAGES:
                _named_barrier(_EMPTY_BAR0 + slot, THREADS, True)
        else:
            mbarrier.wait(empty.index(slot), ((kt // NUM_STAGES) & 1) ^ 1)
        _load_swap_stage(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs, ready,
                         kt, num_k, k_tile0, off_m, off_n, NUM_STAGES, GROUP_TILES)  # fmt: skip
    if THREAD_RELEASE:
        released = num_k - 1 if PIPE else num_k
        for t in range(gl.maximum(num_k - NUM_STAGES, 0), released):
            _named_barrier(_EMPTY_BAR0 + t % NUM_STAGES, THREADS, True)


@gluon.jit
def _swap_second_half(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs, ready,
                      num_k, k_tile0, off_m, off_n, L3: gl.constexpr, S_LAYOUT: gl.constexpr,
                      GROUP_TILES: gl.constexpr, NUM_STAGES: gl.constexpr, FRAG: gl.constexpr,
                      num_warps: gl.constexpr, PIPE: gl.constexpr, red):  # fmt: skip
    """``WSPLIT``'s second warpgroup: the loop over the program's later K tiles on its own
    ring (refilled by itself, its ``gl.thread_barrier`` a named barrier of its 4 warps), its
    sum stored into ``red`` for the first warpgroup to add after the join."""
    (acc,) = _swap_mainloop(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs,
                            ready, ready, num_k, k_tile0, off_m, off_n, L3, S_LAYOUT,
                            GROUP_TILES, NUM_STAGES, False, FRAG, num_warps, 0,
                            PIPE)  # fmt: skip
    red.store(acc)


@gluon.jit
def _int4_wgmma_swap_kernel(
    x_desc,  # x [M, K], block [BLOCK_M, BLOCK_K]
    qw_desc,  # packed words [N, K // 8], block [BLOCK_N, BLOCK_K // 8] (or in tile order)
    s_desc,  # scales [K // group, N], block [1, BLOCK_N]
    o_desc,  # offsets, as the scales
    out_ptr,
    ws_ptr,
    lock_ptr,
    M,
    N,
    K,
    k_per_split,
    num_splits,
    stride_out_m,
    Q_LAYOUT: gl.constexpr,  # shared layout of a ring slot of words [BLOCK_N, BLOCK_K // 8]
    L3: gl.constexpr,  # layout of the [BLOCK_N, WORDS, 4] decode (``_fragment_words_layout``)
    S_LAYOUT: gl.constexpr,  # layout of a [1, BLOCK_N] scale row, rows as L3
    GROUP_TILES: gl.constexpr,  # K tiles per quantization group; 0: one group (per channel)
    MODE: gl.constexpr,  # split-K epilogue, as int4_tiles._epilogue
    NUM_STAGES: gl.constexpr,
    SPECIALIZED: gl.constexpr,  # a producer warp issues the TMA refills
    FRAG: gl.constexpr,  # words in fragment order (``frag_order``); L3 is then their layout
    num_warps: gl.constexpr,
    PARTS: gl.constexpr = 0,  # measurement only: part of the work (``_swap_mainloop``)
    PIPE: gl.constexpr = False,  # two wgmmas in flight (``_swap_mainloop``)
    PDL: gl.constexpr = 0,  # programmatic dependent launch form (``int4_wgmma_swap``'s pdl)
    VECTOR_STORE: gl.constexpr = False,  # the epilogue's stores 16 bytes wide (``_vector_rows``)
    WSPLIT: gl.constexpr = False,  # a second warpgroup takes the later half of the K tiles
    WSPLIT_REGS: gl.constexpr = 200,  # registers per thread of that warpgroup
    THREAD_RELEASE: gl.constexpr = False,  # SPECIALIZED: ring slots released per warp
):
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = s_desc.block_type.shape[1]
    dtype: gl.constexpr = x_desc.dtype

    # acc [BLOCK_N, BLOCK_M] += dequant(W tile) [BLOCK_N, BLOCK_K] @ x tile^T: the weight is the
    # register operand of wgmma (decoded straight into its fragment), x the shared one, read
    # from its TMA buffer. Tiles run along N first so neighbouring programs share x's tile.
    pid = gl.program_id(0)
    pid_k = gl.program_id(1)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    off_n = (pid % num_pid_n) * BLOCK_N
    off_m = (pid // num_pid_n) * BLOCK_M
    if PDL == 1:  # the next kernel may launch at once
        tl.extra.cuda.gdc_launch_dependents()
    if (PDL == 1) | (PDL == 2):  # nothing is read before the previous kernel has finished
        tl.extra.cuda.gdc_wait()

    x_bufs = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
    q_bufs = gl.allocate_shared_memory(gl.int32, [NUM_STAGES, BLOCK_N, BLOCK_K // 8], Q_LAYOUT)
    s_bufs = gl.allocate_shared_memory(s_desc.dtype, [NUM_STAGES, 1, BLOCK_N], s_desc.layout)
    o_bufs = gl.allocate_shared_memory(o_desc.dtype, [NUM_STAGES, 1, BLOCK_N], o_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)

    k_tile0 = pid_k * (k_per_split // BLOCK_K)
    num_k = gl.cdiv(gl.minimum(k_per_split, K - k_tile0 * BLOCK_K), BLOCK_K)
    if SPECIALIZED:
        empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(empty.index(i), count=1)
        (acc,) = gl.warp_specialize(
            [
                (_swap_mainloop,
                 (x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs, ready, empty,
                  num_k, k_tile0, off_m, off_n, L3, S_LAYOUT, GROUP_TILES, NUM_STAGES,
                  SPECIALIZED, FRAG, num_warps, 0, PIPE, THREAD_RELEASE)),
                (_swap_producer,
                 (x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs, ready, empty,
                  num_k, k_tile0, off_m, off_n, NUM_STAGES, GROUP_TILES, THREAD_RELEASE,
                  num_warps, PIPE)),
            ],
            [1],
            [40],
        )  # fmt: skip
        for i in gl.static_range(NUM_STAGES):
            mbarrier.invalidate(empty.index(i))
    elif WSPLIT:
        # Two warpgroups, each over half of the program's K tiles with a ring of its own
        # (NUM_STAGES slots each), the second one's sum added through shared memory: two warps
        # per scheduler where one program holds a multiprocessor, without split-K's slots.
        half = gl.cdiv(num_k, 2)
        x_bufs1 = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
        q_bufs1 = gl.allocate_shared_memory(gl.int32, [NUM_STAGES, BLOCK_N, BLOCK_K // 8],
                                            Q_LAYOUT)  # fmt: skip
        s_bufs1 = gl.allocate_shared_memory(s_desc.dtype, [NUM_STAGES, 1, BLOCK_N], s_desc.layout)
        o_bufs1 = gl.allocate_shared_memory(o_desc.dtype, [NUM_STAGES, 1, BLOCK_N], o_desc.layout)
        ready1 = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(ready1.index(i), count=1)
        red = gl.allocate_shared_memory(gl.float32, [BLOCK_N, BLOCK_M],
                                        gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))  # fmt: skip
        # the plain form's prologue for two rings, their stages interleaved so that both
        # warpgroups' first tiles are copied first
        if PDL == 3:  # the weight's first tiles of both rings before the wait, x's after
            for i in gl.static_range(NUM_STAGES):
                _load_swap_stage(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs,
                                 o_bufs, ready, i, half, k_tile0, off_m, off_n, NUM_STAGES,
                                 GROUP_TILES, 1)  # fmt: skip
                _load_swap_stage(x_desc, qw_desc, s_desc, o_desc, x_bufs1, q_bufs1, s_bufs1,
                                 o_bufs1, ready1, i, num_k - half, k_tile0 + half, off_m, off_n,
                                 NUM_STAGES, GROUP_TILES, 1)  # fmt: skip
            tl.extra.cuda.gdc_wait()
        for i in gl.static_range(NUM_STAGES):
            _load_swap_stage(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs,
                             ready, i, half, k_tile0, off_m, off_n, NUM_STAGES, GROUP_TILES,
                             2 if PDL == 3 else 0)  # fmt: skip
            _load_swap_stage(x_desc, qw_desc, s_desc, o_desc, x_bufs1, q_bufs1, s_bufs1, o_bufs1,
                             ready1, i, num_k - half, k_tile0 + half, off_m, off_n, NUM_STAGES,
                             GROUP_TILES, 2 if PDL == 3 else 0)  # fmt: skip
        (acc,) = gl.warp_specialize(
            [
                (_swap_mainloop,
                 (x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs, ready, ready,
                  half, k_tile0, off_m, off_n, L3, S_LAYOUT, GROUP_TILES, NUM_STAGES, False,
                  FRAG, num_warps, 0, PIPE)),
                (_swap_second_half,
                 (x_desc, qw_desc, s_desc, o_desc, x_bufs1, q_bufs1, s_bufs1, o_bufs1, ready1,
                  num_k - half, k_tile0 + half, off_m, off_n, L3, S_LAYOUT, GROUP_TILES,
                  NUM_STAGES, FRAG, num_warps, PIPE, red)),
            ],
            [num_warps],
            [WSPLIT_REGS],
        )  # fmt: skip
        # the join is a barrier of every warp: the second warpgroup's sum is in shared memory
        acc += red.load(acc.type.layout)
        for i in gl.static_range(NUM_STAGES):
            mbarrier.invalidate(ready1.index(i))
    else:
        if PDL == 3:  # the weight's first tiles before the wait on the previous kernel, x after
            for i in gl.static_range(NUM_STAGES):
                _load_swap_stage(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs,
                                 o_bufs, ready, i, num_k, k_tile0, off_m, off_n, NUM_STAGES,
                                 GROUP_TILES, 1)  # fmt: skip
            tl.extra.cuda.gdc_wait()
        for i in gl.static_range(NUM_STAGES):
            _load_swap_stage(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs,
                             ready, i, num_k, k_tile0, off_m, off_n, NUM_STAGES,
                             GROUP_TILES, 2 if PDL == 3 else 0)  # fmt: skip
        # no empty barriers: the loop refills each slot itself (``ready`` fills the argument)
        (acc,) = _swap_mainloop(x_desc, qw_desc, s_desc, o_desc, x_bufs, q_bufs, s_bufs, o_bufs,
                                ready, ready, num_k, k_tile0, off_m, off_n, L3, S_LAYOUT,
                                GROUP_TILES, NUM_STAGES, SPECIALIZED, FRAG, num_warps,
                                PARTS, PIPE)  # fmt: skip
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(ready.index(i))
    if PDL >= 2:  # the next kernel may launch once every program is past its main loop
        tl.extra.cuda.gdc_launch_dependents()
    _swap_epilogue(acc, out_ptr, ws_ptr, lock_ptr, pid, pid_k, num_splits, M, N, off_m, off_n,
                   stride_out_m, MODE, VECTOR_STORE)  # fmt: skip


def _tiled_words_desc(qweight: torch.Tensor, block_n: int) -> TensorDescriptor:
    """The TMA descriptor of words in ``int4_weight.tile_order`` for K tiles of 128: the words
    viewed as [N // 16, 16 K // 128, 16] (row block, 16 K tile + row within it, word), one box
    [block_n // 16, 16, 16] per tile; its coordinates are [off_n // 16, k // 8, 0], and it
    lands in shared memory as the same bytes as a row-major [block_n, 16] box (rows of 64
    bytes one after another, swizzled by address alike), so the decode reads it unchanged."""
    n, words = qweight.shape
    view = qweight.view(n // 16, words, 16)
    box = [block_n // 16, 16, 16]
    return TensorDescriptor.from_tensor(
        view, box, gl.NVMMASharedLayout.get_default_for(box, gl.int32)
    )


def _cdiv(a: int, b: int) -> int:
    """Ceiling division on the host (``triton.cdiv`` costs a JIT-callable dispatch per call)."""
    return (a + b - 1) // b


# eager launches of the swapped kernel skip Triton's per-call binding (``kernels.launch``)
_SWAP_LAUNCH = FastLaunch(_int4_wgmma_swap_kernel)


@functools.cache
def _fragment_words_layout(
    block_n: int, words: int, num_warps: int, row: bool = False
) -> gl.DistributedLinearLayout:
    """Layout of the [block_n, words, 4] decode of ``_decode_fragment``: rows as the wgmma A
    fragment has them (lane // 4, +8 in a register, 16 rows per warp, then registers), every
    word of a row in registers, the last dim (the byte a lane takes) on lane % 4. ``row``: the
    [1, block_n] layout of a row of scales with the same rows (the four lanes of a row share
    its value)."""
    log2 = lambda v: v.bit_length() - 1  # noqa: E731
    rows_in_warps = 16 * num_warps
    if row:
        return gl.DistributedLinearLayout(
            reg_bases=[[0, 8]] + [[0, 1 << i] for i in range(log2(rows_in_warps), log2(block_n))],
            lane_bases=[[0, 0], [0, 0], [0, 1], [0, 2], [0, 4]],
            warp_bases=[[0, 16 << i] for i in range(log2(num_warps))],
            block_bases=[],
            shape=[1, block_n],
        )
    return gl.DistributedLinearLayout(
        reg_bases=[[8, 0, 0]]
        + [[0, 1 << i, 0] for i in range(log2(words))]
        + [[1 << i, 0, 0] for i in range(log2(rows_in_warps), log2(block_n))],
        lane_bases=[[0, 0, 1], [0, 0, 2], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16 << i, 0, 0] for i in range(log2(num_warps))],
        block_bases=[],
        shape=[block_n, words, 4],
    )


@functools.cache
def _frag_words_layout(block_n: int, words: int, num_warps: int) -> gl.DistributedLinearLayout:
    """Layout of fragment-ordered words [block_n, words] (``frag_order``): rows as in
    ``_fragment_words_layout``; of each 16-word (128-K) tile the lane with t = lane % 4 holds
    words 4t .. 4t + 3, contiguous in registers (one 16-byte load per row and tile)."""
    log2 = lambda v: v.bit_length() - 1  # noqa: E731
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [8, 0]]
        + [[0, 16 << i] for i in range(log2(words // 16))]
        + [[1 << i, 0] for i in range(log2(16 * num_warps), log2(block_n))],
        lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16 << i, 0] for i in range(log2(num_warps))],
        block_bases=[],
        shape=[block_n, words],
    )


@functools.cache
def _row_layout(dtype: torch.dtype) -> gl.NVMMASharedLayout:
    """Shared layout of a [1, BLOCK_N] row of scales or offsets (no swizzle)."""
    bits = torch.finfo(dtype).bits
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=2)


def wgmma_ok(x: torch.Tensor, weight: Int4Weight, block_k: int = 64) -> bool:
    """Whether ``int4_wgmma`` applies: ``tma_tiles_ok`` (16-bit x on sm_90+, K tiles within
    one group, rows TMA can address)."""
    return tma_tiles_ok(x, weight, block_k)


def wgmma_swap_ok(x: torch.Tensor, weight: Int4Weight, block_k: int = 64) -> bool:
    """Whether ``int4_wgmma_swap`` applies: ``wgmma_ok``, and scale and offset rows TMA can
    address too (unit inner stride, 16-byte aligned bases and row strides: N a multiple of 8
    for 16-bit scales). The weight's part is looked up once (``Int4Weight.memo``): the
    launcher asks on every eager call."""
    rows_ok = weight.memo.get(("scale_rows_ok",))
    if rows_ok is None:
        rows_ok = all(
            t.stride(1) == 1 and t.data_ptr() % 16 == 0 and t.stride(0) * t.element_size() % 16 == 0
            for t in (weight.scales, weight.offsets)
        )
        weight.memo["scale_rows_ok",] = rows_ok
    return rows_ok and wgmma_ok(x, weight, block_k)


@functools.cache
def _shared_layouts(dtype: torch.dtype, block_m: int, block_n: int, block_k: int):
    """Shared layouts of the x tile, the words tile and the decoded tile (computed once per
    tiling: the launcher runs per layer in eager prefill)."""
    gl_dtype = _GL_DTYPE[dtype]
    return (
        gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl_dtype),
        gl.NVMMASharedLayout.get_default_for([block_n, block_k // 8], gl.int32),
        gl.NVMMASharedLayout.get_default_for([block_n, block_k], gl_dtype),
    )


def int4_wgmma(
    x: torch.Tensor,
    weight: Int4Weight,
    block_m: int = 128,
    block_n: int = 128,
    block_k: int = 64,
    num_stages: int = 4,
    num_warps: int = 8,
) -> torch.Tensor:
    """``x @ dequant(weight)^T`` for x [M, K] (bf16 or fp16, K already in the weight's stored
    order) on the Gluon kernel; [M, N] in x's dtype. Check ``wgmma_ok`` first."""
    m, k = x.shape
    n, g = weight.out_features, weight.group_size
    x_layout, q_layout, w_layout = _shared_layouts(x.dtype, block_m, block_n, block_k)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _int4_wgmma_kernel[grid](
        TensorDescriptor.from_tensor(x, [block_m, block_k], x_layout),
        TensorDescriptor.from_tensor(weight.qweight, [block_n, block_k // 8], q_layout),
        weight.scales,
        weight.offsets,
        out,
        m,
        n,
        k,
        weight.scales.stride(0),
        out.stride(0),
        W_LAYOUT=w_layout,
        GROUP_TILES=0 if g == k else g // block_k,
        GROUP_M=8,
        NUM_STAGES=num_stages,
        num_warps=num_warps,
    )
    return out


def loop_forms(tiles: int, last_tiles: int, pipe: bool, wsplit: bool) -> tuple[bool, bool]:
    """(pipe, wsplit) as ``int4_wgmma_swap`` runs them on splits of ``tiles`` K tiles, the last
    of ``last_tiles``: ``wsplit`` needs two K tiles in every split, ``pipe`` takes them in
    pairs, an even number in each split (in each half with ``wsplit``)."""
    wsplit = bool(wsplit) and tiles >= 2 and last_tiles >= 2
    step = 4 if wsplit else 2
    return bool(pipe) and tiles % step == 0 and last_tiles % step == 0, wsplit


def int4_wgmma_swap(
    x: torch.Tensor,
    weight: Int4Weight,
    block_m: int = 16,
    block_n: int = 128,
    block_k: int = 64,
    split_k: int = 1,
    num_stages: int = 4,
    num_warps: int = 4,
    specialized: bool = False,
    parts: int = 0,
    slots: bool = True,
    pipe: bool = False,
    pdl: int = 0,
    maxnreg: int | None = None,
    vector_store: bool = False,
    wsplit: bool = False,
    wsplit_regs: int = 200,
    thread_release: bool = False,
    early_ticket: bool = False,
) -> torch.Tensor:
    """``x @ dequant(weight)^T`` for x [M, K] (bf16 or fp16, K in the weight's stored order) on
    the swapped Gluon kernel (small M: the weight tile decoded into wgmma's register operand,
    ``split_k`` programs along K); [M, N] in x's dtype. Canonical or fragment-ordered words
    (``weight.frag``; then ``block_k`` must be 128). Check ``wgmma_swap_ok`` first.

    ``parts`` measures where the time goes (``benchmarks/bench_int4_parts.py``): 1 streams
    the same tiles through the ring and multiplies x by ones (every output column the sum of
    x's row), 2 only streams them (zeros); not with ``specialized``. ``slots`` (split-K):
    each split stores its partial tile in its own slot and the tile's last split adds them;
    False adds them into the workspace with fp32 atomics instead, the reduction before
    2026-11-30's seventh session, kept for the comparison in
    ``benchmarks/bench_int4_wgmma.py --atomics`` (up to 2x slower at M = 16-64). ``pipe``
    keeps two wgmmas in flight (tile kt + 1 issued before tile kt is waited for; needs 3 or
    more stages), so the tensor cores need not idle while the warps wait, sync and refill;
    it takes K tiles in pairs, so where a split has an odd number of them the plain loop
    runs instead. ``pdl`` (sm_90+) launches the kernel as a programmatic dependent that waits
    for the previous kernel before it reads anything: 1 lets the next kernel launch on entry,
    2 only once every program is past its main loop (neither is in the table: BENCHMARKS.md,
    "INT4 GEMM", eleventh session), 3 as 2 and its first ``num_stages`` tiles of the weight
    (words, scales, offsets) copied before the wait, x's after it (``weights_first``: the
    weight is read-only, ``kernels.pdl``; not with ``specialized``). ``maxnreg`` caps the
    registers per thread (ptxas spills the rest; its schedule changes with the cap).
    ``vector_store`` (not in the table: not yet timed on a GPU) passes the accumulator through
    shared memory so that each thread stores 8 consecutive outputs at once (and the split-K
    slots 8 floats), where the wgmma layout stores 2 bytes at a time (``_vector_rows``); with
    ``slots=False`` (fp32 atomics) it is refused. ``wsplit`` (not with ``specialized`` or
    ``parts``) adds a second warpgroup of ``num_warps`` (4) warps, with ``wsplit_regs``
    registers per thread, that takes the later half of each program's K tiles on a ring of its
    own (``num_stages`` more slots) and hands its sum to the first through shared memory at
    the end: twice the warps per program without split-K's partial slots. It needs two K
    tiles per split (else the kernel runs without it), and with ``pipe`` an even number in
    each half (else without ``pipe``). ``thread_release`` (``specialized`` only) hands ring
    slots back to the producer warp through named barriers, one arrival per decoding warp once
    past its own wait for the slot's wgmma, instead of a barrier of all the decoding warps and
    one mbarrier arrival: no warp (or warpgroup) waits for the others for that every K tile.
    ``early_ticket`` (split-K in slots): each split takes the tile's ticket before it stores
    its slot, and the last split keeps its partial in registers and waits for the others'
    slots (``_swap_epilogue``'s MODE 4; the same sums, in the same order, as without)."""
    if thread_release and (not specialized or num_stages > _EMPTY_BARS):
        raise ValueError(
            f"thread_release needs specialized=True (a producer warp's ring) and num_stages <= "
            f"{_EMPTY_BARS} (a named barrier each), got specialized={specialized}, "
            f"num_stages={num_stages}"
        )
    if wsplit and (specialized or parts or num_warps != 4 or maxnreg):
        raise ValueError(
            "wsplit needs specialized=False, parts=0, num_warps=4 (one warpgroup per half) and "
            f"no maxnreg (wsplit_regs sets the second warpgroup's), got specialized="
            f"{specialized}, parts={parts}, num_warps={num_warps}, maxnreg={maxnreg}"
        )
    if not slots and (vector_store or early_ticket):
        name = "vector_store" if vector_store else "early_ticket"
        raise ValueError(f"{name} needs slots=True (the split-K slots, or no split)")
    if pdl not in (0, 1, 2, 3) or (pdl == 3 and specialized):
        raise ValueError(f"pdl must be 0, 1, 2 or 3 (3 not with specialized), got {pdl}")
    pdl = int(pdl)  # a config's bool
    if parts not in (0, 1, 2) or (parts and specialized):
        raise ValueError(f"parts must be 0, 1 or 2 and needs specialized=False, got {parts}")
    if pipe and (parts or num_stages < 3):
        raise ValueError(
            f"pipe needs parts=0 and num_stages >= 3 (a slot is refilled one tile later), "
            f"got parts={parts}, num_stages={num_stages}"
        )
    m, k = x.shape
    n, g = weight.out_features, weight.group_size
    frag = weight.frag
    if frag and block_k != FRAG_TILE_K:
        raise ValueError(f"fragment-ordered words need block_k={FRAG_TILE_K}, got {block_k}")
    x_layout, q_layout, _ = _shared_layouts(x.dtype, block_m, block_n, block_k)
    k_per_split = _cdiv(_cdiv(k, split_k), block_k) * block_k
    num_splits = _cdiv(k, k_per_split)
    num_tiles = _cdiv(m, block_m) * _cdiv(n, block_n)
    last_tiles = _cdiv(k - (num_splits - 1) * k_per_split, block_k)
    pipe, wsplit = loop_forms(k_per_split // block_k, last_tiles, pipe, wsplit)
    # the weight's descriptors, built once per tiling (``Int4Weight.memo``)
    descs = weight.memo.get(("swap", block_n, block_k))
    if descs is None:
        descs = (
            _tiled_words_desc(weight.qweight, block_n)
            if weight.tiled
            else TensorDescriptor.from_tensor(weight.qweight, [block_n, block_k // 8], q_layout),
            TensorDescriptor.from_tensor(
                weight.scales, [1, block_n], _row_layout(weight.scales.dtype)
            ),
            TensorDescriptor.from_tensor(
                weight.offsets, [1, block_n], _row_layout(weight.offsets.dtype)
            ),
        )
        weight.memo["swap", block_n, block_k] = descs
    mode, out, ws, locks = split_k_output(x, m, n, num_splits, num_tiles, slots=slots)
    if mode == 3 and early_ticket:
        mode = 4
    group_tiles = 0 if g == k else g // block_k
    # every constexpr argument, the compile options and the descriptors' types follow from it
    key = (block_m, block_n, block_k, num_stages, num_warps, specialized, pipe, frag, parts,
           group_tiles, mode, x.dtype, weight.scales.dtype, weight.offsets.dtype,
           pdl, maxnreg, weight.tiled, vector_store, wsplit, wsplit_regs,
           thread_release)  # fmt: skip
    args = {
        "x_desc": TensorDescriptor.from_tensor(x, [block_m, block_k], x_layout),
        "qw_desc": descs[0],
        "s_desc": descs[1],
        "o_desc": descs[2],
        "out_ptr": out,
        "ws_ptr": ws,
        "lock_ptr": locks,
        "M": m,
        "N": n,
        "K": k,
        "k_per_split": k_per_split,
        "num_splits": num_splits,
        "stride_out_m": out.stride(0),
        "Q_LAYOUT": q_layout,
        "L3": (_frag_words_layout if frag else _fragment_words_layout)(
            block_n, block_k // 8, num_warps
        ),
        "S_LAYOUT": _fragment_words_layout(block_n, 1, num_warps, row=True),
        "GROUP_TILES": group_tiles,
        "MODE": mode,
        "NUM_STAGES": num_stages,
        "SPECIALIZED": specialized,
        "FRAG": frag,
        "PARTS": parts,
        "PIPE": pipe,
        "PDL": pdl,
        "VECTOR_STORE": bool(vector_store),
        "WSPLIT": wsplit,
        "WSPLIT_REGS": wsplit_regs,
        "THREAD_RELEASE": bool(thread_release),
    }
    if pdl:
        args["launch_pdl"] = True
    if maxnreg:
        args["maxnreg"] = maxnreg
    _SWAP_LAUNCH((num_tiles, num_splits), key, **args, num_warps=num_warps)
    return out.to(x.dtype) if mode == 1 else out
