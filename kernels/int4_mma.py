"""W4A16 GEMM for small M: the weight's words loaded straight into registers and multiplied by
``mma.sync`` (Gluon), no shared memory ring, no barriers in the loop. The table of
``kernels.int4_gemm_config`` runs it on weights with N <= 8192 held in fragment order up to
M = 8, and to M = 16 where K < 8192, 32 where N <= 4096 as well (``_mma_config``: the warps
of a program split K); on
the H200 that made qkv, o_proj and down_proj 1.1-1.25x faster at M = 1 than the gemv and the
swapped wgmma kernel they ran on before (BENCHMARKS.md, "INT4 GEMM", twelfth session); its
form with x through shared memory (``_int4_mma_xs_kernel``) made qkv 1.06-1.3x faster at
M = 1-8 and o_proj 1.16-1.37x at M = 4-16 (thirteenth session), and with registers capped
(``maxnreg``) another 8-17% at M <= 8 on qkv and o_proj (fourteenth session); with the
scales applied in the decode (``SCALED``, half the mmas) qkv 6-8% at M = 9-16 and o_proj
4-5% at M = 17-32 (fifteenth session); with its first words read before it waits on the
previous kernel (``weights_first``, launched as a programmatic dependent) another 0.3-0.6 us
per call at M <= 16 (sixteenth session).
``parts`` times its pieces apart (``benchmarks/bench_int4_mma.py --parts``).

``y = x @ dequant(W)^T`` for 16-bit x [M, K], M up to a few dozen, on an ``Int4MmaWeight``
(``to_mma``: an ``Int4Weight``'s words in fragment order, read in place, or its codes in
``mma_order``, which lets x be read in 16-byte loads; groups of 128 K or a multiple, or per
channel). The swapped wgmma kernel (``kernels.int4_wgmma``) streams its words through a TMA
ring; at small M that ring's per-program chain (barrier set-up, a TMA round trip per K tile,
refills behind a barrier) was most of its time (BENCHMARKS.md, eleventh session). Here each
warp works alone:
- it owns 16 weight rows of the mma's A operand (or ``ROW_TILES`` such tiles, multiplied by
  the same x fragments); per K tile of 128 each lane issues one 16-byte load per row it
  holds (rows lane // 4 and lane // 4 + 8 of each tile), its own bytes of the fragment,
  ``DEPTH`` tiles ahead of the one it decodes;
- a code n becomes the 16-bit float ``BIAS + n`` by one LOP3 (two codes per register; one SHR
  for three of a word's four registers), exactly: 128 + n in bf16, 1024 + n in fp16, with no
  subtraction and no scale in the decode;
- x's tile is read from global memory (L1 and L2 hold it: every program reads the same x):
  in fragment order the mma's B layout as it is, sixteen 4-byte pairs per row and lane; in
  ``mma_order`` each lane's 32 columns are contiguous, four 16-byte loads;
  ``mma.sync`` (m16n8k16) multiplies the codes by it into a per-group fp32 sum, and a second
  one multiplies a tile of ones by it, which gives the sums of x in the same layout;
- at the end of each group (or of the warp's K range) the group's scale and offset apply:
  ``acc += s * sum((BIAS + n) x) + (o - BIAS s) * sum(x)``, which is ``sum((n s + o) x)``.
The products are exact (16-bit values, fp32 sums); the bias cancels in fp32, a relative error
of about 1e-4 at most in the tests' and benchmark's checks, below the output's own rounding.

Parallelism over K: ``split_k`` programs, reduced in global memory as the swapped kernel does
(``MODE`` of ``split_k_output``), or ``wsplit``: the warps of a program take the same 16 rows
over different K ranges and are summed in shared memory at the end (an explicit buffer: the
compiler's own cross-warp ``gl.sum`` stored rows 64 bytes apart, 16-way bank conflicts that
made 16-warp programs 3x slower). Gluon holds a tensor replicated across warps as one value,
so the warps' different x ranges come from ``_warp_id`` (inline PTX), which only feeds the
addresses of loads whose registers go straight into the mma. The grid is a function of the
shapes only and the launcher never waits for the host, so a call can be captured in a CUDA
graph.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from kernels.int4_weight import (
    FRAG_TILE_K,
    Int4Weight,
    frag_order,
    frag_shape_ok,
    pack_words,
    tile_order,
    unpack_words,
)
from kernels.int4_wgmma import (
    _dequant_registers,
    _frag_k_order,
    _frag_words_layout,
    _swap_epilogue,
)
from kernels.launch import FastLaunch
from kernels.pdl import _capability_major, has_pdl
from kernels.split_k import split_k_output

# One word of fragment-ordered codes -> its four registers of 16-bit floats BIAS + n: register
# j holds nibbles j (low half) and j + 4 (high half), each kept over the magic exponent
# (LOP3 truth table 0xEA: (a & b) | c). $4 is the word ($5, its copy from the pack of two, is
# unused); 0x43004300 is (128, 128) in bf16 and 0x64006400 (1024, 1024) in fp16, whose lowest
# mantissa bit weighs 1.
_CODES_PTX = (
    "{\n.reg .b32 t;\n"
    "lop3.b32 $0, $4, 0x000F000F, MAGIC, 0xEA;\n"
    "shr.u32 t, $4, 4;\nlop3.b32 $1, t, 0x000F000F, MAGIC, 0xEA;\n"
    "shr.u32 t, $4, 8;\nlop3.b32 $2, t, 0x000F000F, MAGIC, 0xEA;\n"
    "shr.u32 t, $4, 12;\nlop3.b32 $3, t, 0x000F000F, MAGIC, 0xEA;\n}"
)
_CODES_PTX_BF16 = gl.constexpr(_CODES_PTX.replace("MAGIC", "0x43004300"))
_CODES_PTX_F16 = gl.constexpr(_CODES_PTX.replace("MAGIC", "0x64006400"))


@gluon.jit
def _code_registers(q4, like, IS_BF16: gl.constexpr):
    """Words q4 [..., 4 (b)] -> their four registers j of 16-bit floats BIAS + n (``_CODES_PTX``),
    each [..., 4, 2 (h)] in the dtype of ``like``."""
    return gl.inline_asm_elementwise(
        asm=_CODES_PTX_BF16 if IS_BF16 else _CODES_PTX_F16,
        constraints="=r,=r,=r,=r,r,r",
        args=[gl.join(q4, q4)],
        dtype=(like.dtype, like.dtype, like.dtype, like.dtype),
        is_pure=True,
        pack=2,
    )


@gluon.jit
def _codes_frag(q, like, a_layout: gl.constexpr, IS_BF16: gl.constexpr):
    """Fragment-ordered words q [R, 16 T] (each lane holds words 4t .. 4t + 3 of every 128-K
    tile of its rows, t = lane % 4) -> the codes as BIAS + n [R, 128 T] (the dtype of ``like``,
    bf16 or fp16) in the mma A layout ``a_layout`` (K order), registers renamed only
    (``int4_wgmma._frag_k_order``)."""
    R: gl.constexpr = q.shape[0]
    T: gl.constexpr = q.shape[1] // 16
    q4 = gl.reshape(q, [R, T, 4, 4])  # [rows, tile, t, b]
    p0, p1, p2, p3 = _code_registers(q4, like, IS_BF16)
    return _frag_k_order(p0, p1, p2, p3, a_layout)


@gluon.jit
def _tile_words(row_ptrs, tile0, tiles_total, kt, TILED: gl.constexpr):
    """(pointers, mask) of the words of K tile tile0 + kt (16 per row) of the rows at
    ``row_ptrs`` ([..., R, 16]: their first word, plus the word index; tile0 [..., R, 1], a K
    tile per row); the mask is off past K. ``TILED``: the words are in ``tile_order``
    (``_row_words``), each 16-row tile 256 words on from the last."""
    tile = tile0 + kt
    return row_ptrs + tile * (256 if TILED else 16), tile < tiles_total


@gluon.jit
def _load_words(row_ptrs, tile0, tiles_total, kt, TILED: gl.constexpr = False):
    """The words of K tile tile0 + kt of the rows at ``row_ptrs`` (``_tile_words``), in their
    layout; none past K."""
    ptrs, ok = _tile_words(row_ptrs, tile0, tiles_total, kt, TILED)
    return gl.load(ptrs, mask=ok, other=0)


@gluon.jit
def _row_words(rows, stride_qw_n, TILED: gl.constexpr):
    """The offset of weight row ``rows``' first word (K tile 0): row-major ``rows *
    stride_qw_n``, or with ``TILED`` (``tile_order``: every 16 rows by 128 K one contiguous
    run of 256 words, K tiles of a row block consecutive) the row block's first tile plus the
    row's 16 words in it."""
    if TILED:
        return (rows // 16) * (stride_qw_n * 16) + (rows % 16) * 16
    return rows * stride_qw_n


@gluon.jit
def _warp_id(like):
    """The warp of the calling thread (``tid.x / 32``). In a layout that holds a tensor in
    every warp (x's tile) this gives each warp its own value, which Gluon cannot express: the
    warps then read x at their own K ranges (``WSPLIT``); the values only feed addresses and
    masks of loads whose registers go straight to the mma (no cross-warp exchange)."""
    return gl.inline_asm_elementwise(
        asm="{\n.reg .b32 t;\nmov.u32 t, %tid.x;\nshr.u32 $0, t, 5;\n}",
        constraints="=r,r",
        args=[like],
        dtype=gl.int32,
        is_pure=True,
        pack=1,
    )


@gluon.jit
def _operand_rows(r, off_n, split_tile0, tiles_per_warp, WSPLIT: gl.constexpr,
                  NUM_WARPS: gl.constexpr):  # fmt: skip
    """(weight row, first K tile) of the operand rows r. Row r = 16 (NUM_WARPS j + w) + i
    belongs to warp w (row tile j of it, row i of the tile). Without WSPLIT it is weight row
    off_n + r over the program's K range; with WSPLIT weight row off_n + 16 j + i over warp w's
    own range (K tiles from split_tile0 + w * tiles_per_warp)."""
    if WSPLIT:
        w = (r // 16) % NUM_WARPS
        return off_n + (r // (16 * NUM_WARPS)) * 16 + r % 16, split_tile0 + w * tiles_per_warp
    return off_n + r, split_tile0 + r * 0


@gluon.jit
def _tile_product(q, x_ptrs, x_mask, kt, part, xsum, ones, a_layout: gl.constexpr,
                  b_layout: gl.constexpr, IS_BF16: gl.constexpr,
                  X_CONTIG: gl.constexpr):  # fmt: skip
    """part += codes(q) @ x'^T and xsum += ones @ x'^T (both [BLOCK_N, BLOCK_M]) for K tile kt,
    x' being x's tile in the column order of the words. ``X_CONTIG`` (``mma_order``): lane t
    reads x's columns 32t .. 32t + 31 of the tile (four 16-byte loads per row of x) and feeds
    them to the mma as its columns 8r + 2t + h (column 32t + 2r + h). Otherwise (fragment
    order): x^T's tile is loaded in the mma's B layout, 4-byte pairs 16 bytes apart."""
    xv = gl.load(x_ptrs + kt * 128, mask=x_mask, other=0.0)
    if X_CONTIG:  # [BLOCK_M, 4 (t), 32] -> [128, BLOCK_M]
        BLOCK_M: gl.constexpr = xv.shape[0]
        xv = gl.permute(gl.reshape(xv, [BLOCK_M, 4, 16, 2]), (2, 1, 3, 0))  # [r, t, h, m]
        xv = gl.convert_layout(gl.reshape(xv, [128, BLOCK_M]), b_layout, assert_trivial=True)
    a = _codes_frag(q, ones, a_layout, IS_BF16)
    part = mma_v2(a, xv, part)
    xsum = mma_v2(ones, xv, xsum)
    return part, xsum


@gluon.jit
def _program_tile(N, tiles_per_split, ROWS: gl.constexpr, BLOCK_M: gl.constexpr,
                  PDL: gl.constexpr):  # fmt: skip
    """(pid, pid_k, off_n, off_m, first K tile) of this program: ROWS weight rows by BLOCK_M
    rows of x, weight rows fastest, over split pid_k. With PDL the next kernel may launch at
    once; PDL 1 waits here for the previous one, so nothing is read before this one's inputs
    are written; PDL 2 leaves the wait to the caller (``_wait_after_words``)."""
    pid = gl.program_id(0)
    pid_k = gl.program_id(1)
    num_pid_n = gl.cdiv(N, ROWS)
    if PDL != 0:
        tl.extra.cuda.gdc_launch_dependents()
    if PDL == 1:
        tl.extra.cuda.gdc_wait()
    return (
        pid,
        pid_k,
        (pid % num_pid_n) * ROWS,
        (pid // num_pid_n) * BLOCK_M,
        pid_k * tiles_per_split,
    )


@gluon.jit
def _row_scales(s_ptr, o_ptr, tile, rows, rows_ok, tiles_total, stride_s_g,
                GROUP_TILES: gl.constexpr, BIAS: gl.constexpr):  # fmt: skip
    """The fp32 scales s and offsets o - BIAS s of K tile ``tile``'s group for weight rows
    ``rows`` (in their layout), as the sums of codes and of x take them; zeros past K and N
    (``_tile_scales`` in fp32)."""
    s, o = _tile_scales(s_ptr, o_ptr, tile, rows, rows_ok, tiles_total, stride_s_g, GROUP_TILES,
                        1, gl.float32)  # fmt: skip
    return s, o - BIAS * s


@gluon.jit
def _wait_after_words(PDL: gl.constexpr):
    """With PDL 2 (``weights_first``) the program has issued its first tiles' words (and
    scales) and now waits for the previous kernel before it reads x or touches the output or
    the split-K workspace: the weight is read-only once built (``kernels.pdl``), so its
    first bytes stream in while the previous kernel finishes."""
    if PDL == 2:
        tl.extra.cuda.gdc_wait()


@gluon.jit
def _sum_over_warps(acc, LEAD: gl.constexpr, ROWS: gl.constexpr, num_warps: gl.constexpr,
                    PARTS: gl.constexpr):  # fmt: skip
    """The PARTS partials in acc (partial p's rows in one contiguous run per LEAD index, p the
    middle index of [LEAD, PARTS, rest]; a warp's or, with row warps, a K group's) summed
    through shared memory -> [ROWS, BLOCK_M]. Each warp stores its rows contiguously and each
    of the num_warps warps' threads adds one output's PARTS values (``gl.sum`` over the
    accumulator itself had the compiler store rows 64 bytes apart, 16-way bank conflicts that
    made the whole kernel 3x slower at 16 warps)."""
    BLOCK_M: gl.constexpr = acc.shape[len(acc.shape) - 1]
    RANK: gl.constexpr = len(acc.shape)
    order: gl.constexpr = [1, 0] if RANK == 2 else [2, 1, 0]
    red = gl.allocate_shared_memory(gl.float32, acc.shape, gl.SwizzledSharedLayout(1, 1, 1, order))
    red.store(acc)
    gl.thread_barrier()
    sum_layout: gl.constexpr = gl.BlockedLayout(
        [1, PARTS, 1], [1, 1, 32], [1, 1, num_warps], [2, 1, 0]
    )
    parts = red.reshape([LEAD, PARTS, ROWS // LEAD * BLOCK_M]).load(sum_layout)
    return gl.reshape(gl.sum(parts, axis=1), [ROWS, BLOCK_M])


@gluon.jit
def _int4_mma_kernel(
    x_ptr,
    qw_ptr,
    s_ptr,
    o_ptr,
    out_ptr,
    ws_ptr,
    lock_ptr,
    M,
    N,
    tiles_total,  # K // 128
    tiles_per_split,  # K tiles per program
    tiles_per_warp,  # K tiles per warp (WSPLIT: tiles_per_split // num_warps)
    num_splits,
    stride_x_m,
    stride_qw_n,
    stride_s_g,
    stride_out_m,
    BLOCK_M: gl.constexpr,  # x rows per program: mma N, 8 or 16 (more: repeated)
    GROUP_TILES: gl.constexpr,  # K tiles per quantization group (per channel: unused)
    APPLY: gl.constexpr,  # K tiles between scale applications (a group or 1); 0: per channel
    DEPTH: gl.constexpr,  # K tiles of words in flight ahead of the one decoded (1 or 2)
    MODE: gl.constexpr,  # split-K epilogue, as int4_tiles._epilogue
    PDL: gl.constexpr,  # programmatic dependent: 1 waits on entry, 2 after the first words
    WSPLIT: gl.constexpr,  # the warps split the program's K range over its 16 ROW_TILES rows
    ROW_TILES: gl.constexpr,  # 16-row tiles per warp, multiplied by the same x fragments
    X_CONTIG: gl.constexpr,  # words in ``mma_order`` (else fragment order): x read contiguously
    q_layout: gl.constexpr,  # of a tile's words [16 * num_warps, 16] (``_frag_words_layout``)
    x_layout: gl.constexpr,  # of x's tile [BLOCK_M, 4, 32] (``_x_tile_layout``)
    num_warps: gl.constexpr,
    PARTS: gl.constexpr = 0,  # measurement only: 1 no split-K reduction, 2 neither math
    TILED: gl.constexpr = False,  # words in ``tile_order``
    S_AHEAD: gl.constexpr = False,  # APPLY 1: scales loaded with the words, a tile ahead
):
    # Rows of the logical [16 * num_warps * ROW_TILES, K tile] operand: warp w holds the row
    # tiles 16 (num_warps j + w) .. + 15, j < ROW_TILES (the mma layout's repetition), and
    # multiplies each by the same x fragments. Without WSPLIT they are that many weight rows
    # over one K range; with it, 16 ROW_TILES weight rows over num_warps K ranges, summed
    # across warps at the end (shared memory, no global round trip), so a program covers a
    # long K range with many warps in flight.
    ROWS: gl.constexpr = 16 * ROW_TILES if WSPLIT else 16 * num_warps * ROW_TILES
    TILE_ROWS: gl.constexpr = 16 * num_warps * ROW_TILES
    IS_BF16: gl.constexpr = x_ptr.dtype.element_ty == gl.bfloat16
    dtype: gl.constexpr = x_ptr.dtype.element_ty
    BIAS: gl.constexpr = 128.0 if IS_BF16 else 1024.0
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 8]
    )
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    b_layout: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)

    pid, pid_k, off_n, off_m, split_tile0 = _program_tile(N, tiles_per_split, ROWS, BLOCK_M, PDL)

    # words: row r of the operand and its first K tile (``_operand_rows``)
    r = gl.arange(0, TILE_ROWS, layout=gl.SliceLayout(1, q_layout))
    rows, q_tile0 = _operand_rows(r, off_n, split_tile0, tiles_per_warp, WSPLIT, num_warps)
    q_tile0 = gl.where(rows < N, q_tile0, tiles_total)[:, None]  # rows past N read nothing
    words = gl.arange(0, 16, layout=gl.SliceLayout(0, q_layout))
    row_ptrs = qw_ptr + _row_words(rows, stride_qw_n, TILED)[:, None] + words[None, :]
    # x: every warp holds the tile; with WSPLIT each reads its own K range (``_warp_id``)
    x_tile0 = split_tile0
    if WSPLIT:
        x_tile0 += _warp_id(pid) * tiles_per_warp
    if X_CONTIG:
        xm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, gl.SliceLayout(2, x_layout)))
        xt = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, x_layout)))
        xi = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, x_layout)))
        x_ptrs = (
            x_ptr + xm[:, None, None] * stride_x_m + (32 * xt)[None, :, None] + xi[None, None, :]
        )
        x_rows_ok = (xm < M)[:, None, None] & (xi < 32)[None, None, :]
    else:
        xk = gl.arange(0, 128, layout=gl.SliceLayout(1, b_layout))
        xm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, b_layout))
        x_ptrs = x_ptr + xm[None, :] * stride_x_m + xk[:, None]
        x_rows_ok = (xm < M)[None, :] & (xk < 128)[:, None]
    x_ptrs += gl.multiple_of(x_tile0 * 128, 128)
    # scales and offsets: row r of the accumulator, as the words
    sr = gl.arange(0, TILE_ROWS, layout=row_layout)
    s_rows, s_tile0 = _operand_rows(sr, off_n, split_tile0, tiles_per_warp, WSPLIT, num_warps)
    s_rows_ok = s_rows < N

    ones = gl.full([TILE_ROWS, 128], 1.0, dtype, layout=a_layout)
    zeros = gl.zeros([TILE_ROWS, BLOCK_M], gl.float32, layout=mma_layout)
    acc = zeros
    part = zeros
    xsum = zeros

    # the next tiles' words are in flight while this one is decoded and multiplied (the last
    # tiles load their own words again instead of reading the next warp's or split's)
    last = tiles_per_warp - 1
    q0 = _load_words(row_ptrs, q_tile0, tiles_total, 0, TILED)
    if S_AHEAD:  # tile 0's scales and offsets with its words (APPLY 1: after every tile)
        sa, oa = _row_scales(s_ptr, o_ptr, s_tile0, s_rows, s_rows_ok, tiles_total,
                             stride_s_g, GROUP_TILES, BIAS)  # fmt: skip
    if DEPTH == 2:
        q1 = _load_words(row_ptrs, q_tile0, tiles_total, gl.minimum(1, last), TILED)
    _wait_after_words(PDL)
    for kt in range(tiles_per_warp):
        if DEPTH == 2:
            q2 = _load_words(row_ptrs, q_tile0, tiles_total, gl.minimum(kt + 2, last), TILED)
        else:
            q1 = _load_words(row_ptrs, q_tile0, tiles_total, gl.minimum(kt + 1, last), TILED)
        if S_AHEAD:
            sb, ob = _row_scales(s_ptr, o_ptr, s_tile0 + gl.minimum(kt + 1, last), s_rows,
                                 s_rows_ok, tiles_total, stride_s_g, GROUP_TILES, BIAS)  # fmt: skip
        if PARTS == 2:  # the words only, folded into the sum so they are not dead
            part += gl.convert_layout(gl.sum(q0, axis=1).to(gl.float32), row_layout)[:, None]
        else:
            x_mask = x_rows_ok & (x_tile0 + kt < tiles_total)
            part, xsum = _tile_product(q0, x_ptrs, x_mask, kt, part, xsum, ones, a_layout,
                                       b_layout, IS_BF16, X_CONTIG)  # fmt: skip
        if S_AHEAD:
            acc += part * sa[:, None] + xsum * oa[:, None]
            part = zeros
            xsum = zeros
            sa, oa = sb, ob
        elif APPLY != 0:
            if ((kt + 1) % APPLY == 0) | (kt == last):
                s, o = _row_scales(s_ptr, o_ptr, s_tile0 + kt, s_rows, s_rows_ok, tiles_total,
                                   stride_s_g, GROUP_TILES, BIAS)  # fmt: skip
                acc += part * s[:, None] + xsum * o[:, None]
                part = zeros
                xsum = zeros
        if DEPTH == 2:
            q0 = q1
            q1 = q2
        else:
            q0 = q1
    if APPLY == 0:  # per channel: one scale and offset row
        s = gl.load(s_ptr + s_rows, mask=s_rows_ok, other=0.0).to(gl.float32)
        o = gl.load(o_ptr + s_rows, mask=s_rows_ok, other=0.0).to(gl.float32) - BIAS * s
        acc = part * s[:, None] + xsum * o[:, None]
    if WSPLIT:  # the warps' K ranges: row tile j of warp w is rows 16 (num_warps j + w) ..
        acc = _sum_over_warps(acc, ROW_TILES, ROWS, num_warps, num_warps)
    if PARTS != 0:  # each split stores its own partial over the others' (wrong, timing only)
        _swap_epilogue(acc, out_ptr, ws_ptr, lock_ptr, pid, pid_k, num_splits, M, N, off_m,
                       off_n, stride_out_m, 0)  # fmt: skip
    else:
        _swap_epilogue(acc, out_ptr, ws_ptr, lock_ptr, pid, pid_k, num_splits, M, N, off_m,
                       off_n, stride_out_m, MODE)  # fmt: skip


@gluon.jit
def _frag3_k_order(p0, p1, p2, p3, a_layout: gl.constexpr):
    """The four registers j of every word of one K tile per warp, each [W, R, 4 (t), 4 (b),
    2 (h)], -> [W, R, 128] in K order in the batched mma A layout ``a_layout`` (registers
    renamed only; ``int4_wgmma._frag_k_order`` with a batch index)."""
    W: gl.constexpr = p0.shape[0]
    R: gl.constexpr = p0.shape[1]
    # [warp, rows, t, b, h, e, c] -> K order (b, c, e, t, h)
    w = gl.join(gl.join(p0, p1), gl.join(p2, p3))
    w = gl.permute(w, (0, 1, 3, 6, 5, 2, 4))
    w = gl.reshape(w, [W, R, 128])
    return gl.convert_layout(w, a_layout, assert_trivial=True)


@gluon.jit
def _codes_frag3(q, like, a_layout: gl.constexpr, IS_BF16: gl.constexpr):
    """``_codes_frag`` for one K tile per warp: words q [W, R, 16] (warp w's rows in [w]) ->
    codes BIAS + n [W, R, 128] in the batched mma A layout ``a_layout`` (registers renamed
    only)."""
    q4 = gl.reshape(q, [q.shape[0], q.shape[1], 4, 4])  # [warp, rows, t, b]
    p0, p1, p2, p3 = _code_registers(q4, like, IS_BF16)
    return _frag3_k_order(p0, p1, p2, p3, a_layout)


@gluon.jit
def _decode_frag3(q, s, o, a_layout: gl.constexpr, IS_BF16: gl.constexpr):
    """Words q [W, R, 16] as ``_codes_frag3`` takes them and their tile's scales and offsets
    s, o [W, R] (x's dtype, in q's layout less its last dimension) -> the weights n s + o
    [W, R, 128] in ``a_layout``: per register one LOP3, one SUB (n exactly) and one FMA
    (rounded once to x's dtype), with one SHR for three of a word's four registers
    (``int4_tiles._DEQUANT_PTX_*``)."""
    q4 = gl.reshape(q, [q.shape[0], q.shape[1], 4, 4])  # [warp, rows, t, b]
    p0, p1, p2, p3 = _dequant_registers(q4, gl.expand_dims(s, 2), gl.expand_dims(o, 2), q,
                                        IS_BF16)  # fmt: skip
    return _frag3_k_order(p0, p1, p2, p3, a_layout)


@gluon.jit
def _tile_scales(s_ptr, o_ptr, tile, rows, rows_ok, tiles_total, stride_s_g,
                 GROUP_TILES: gl.constexpr, APPLY: gl.constexpr, dtype: gl.constexpr):  # fmt: skip
    """The scales and offsets of K tile ``tile`` [W, 1] for weight rows ``rows`` [1, R] (in
    their layout), in ``dtype``; zeros past K and N (the words there are zeros too)."""
    if APPLY == 0:  # per channel: one row of scales
        g_ptrs = rows + 0 * tile
    else:
        g_ptrs = (tile // GROUP_TILES) * stride_s_g + rows
    ok = rows_ok & (tile < tiles_total)
    s = gl.load(s_ptr + g_ptrs, mask=ok, other=0.0).to(dtype)
    o = gl.load(o_ptr + g_ptrs, mask=ok, other=0.0).to(dtype)
    return s, o


@gluon.jit
def _copy_x_ahead(ring, x_ptrs, x_ok, x_tile0, last, tiles_total, X_STAGES: gl.constexpr):
    """The copies (``cp.async``) of x's first X_STAGES - 1 tiles of each K range into the ring,
    one commit group per tile (the last range's tile repeated past its end)."""
    for stage in gl.static_range(X_STAGES - 1):
        kt = gl.minimum(stage, last)
        async_copy.async_copy_global_to_shared(
            ring.index(stage), x_ptrs + kt * 128, mask=x_ok & (x_tile0 + kt < tiles_total)
        )
        async_copy.commit_group()


@gluon.jit
def _copy_words(wring, slot, q_ptrs, q_tile0, tiles_total, kt, TILED: gl.constexpr):
    """``W_RING``: the copy (``cp.async``, 16 bytes per thread: each thread copies the bytes
    it reads back, so no other thread's copies need to have landed) of K tile kt of every
    row's words into ring slot ``slot``; nothing past K."""
    ptrs, ok = _tile_words(q_ptrs, q_tile0, tiles_total, kt, TILED)
    async_copy.async_copy_global_to_shared(wring.index(slot), ptrs, mask=gl.broadcast(ok, ptrs)[0])


@gluon.jit
def _int4_mma_xs_kernel(
    x_ptr,
    qw_ptr,
    s_ptr,
    o_ptr,
    out_ptr,
    ws_ptr,
    lock_ptr,
    M,
    N,
    tiles_total,
    tiles_per_split,
    tiles_per_warp,
    num_splits,
    stride_x_m,
    stride_qw_n,
    stride_s_g,
    stride_out_m,
    BLOCK_M: gl.constexpr,
    GROUP_TILES: gl.constexpr,
    APPLY: gl.constexpr,
    DEPTH: gl.constexpr,
    MODE: gl.constexpr,
    PDL: gl.constexpr,
    ROW_TILES: gl.constexpr,
    X_STAGES: gl.constexpr,  # x tiles in the shared ring (2: one ahead, 3: two ahead)
    ROW_WARPS: gl.constexpr,  # warps over rows that share each K group's x tiles
    SCALED: gl.constexpr,  # the decode applies scale and offset: no mma on ones, no groups
    q_layout: gl.constexpr,  # of the words [K groups, ROWS, 16] (``_frag_words3``)
    x_layout: gl.constexpr,  # of x's copy [K groups, BLOCK_M, 128], 16 bytes per thread
    num_warps: gl.constexpr,
    TILED: gl.constexpr = False,  # words in ``tile_order``
    S_AHEAD: gl.constexpr = False,  # APPLY 1: scales loaded with the words, a tile ahead
    W_RING: gl.constexpr = False,  # words through a cp.async ring with x's, X_STAGES - 1 ahead
):
    """The warps-over-K form (``wsplit``) of ``_int4_mma_kernel`` as a batched mma whose batch
    is the warp: warp w multiplies the program's 16 ROW_TILES rows over its own K range by x's
    tiles of that range, which it copies into shared memory with ``cp.async`` (16 bytes per
    thread) and reads back with ``ldmatrix``; x's fragments in place took 16-32 four-byte
    loads per thread and tile, each touching 8 rows. One CTA barrier per tile publishes the
    copies (and frees the ring slot the next copy overwrites).

    With ROW_WARPS > 1 the batch is a K group of ROW_WARPS warps instead of one warp: the
    group's warps hold different rows (16 ROW_TILES each) over the same K range and read the
    same x tiles from the ring, which the group copies once, so the program covers
    16 ROW_TILES ROW_WARPS rows and reads x from L2 once for all of them.

    With SCALED the decode gives the weights n s + o themselves, rounded once to x's dtype
    (``_decode_frag3``: a SUB and an FMA more per register), each tile's scales and offsets
    loaded with its words, so one mma per tile accumulates the output: the mma on ones and
    the per-group fp32 sums go (half the mmas, which grow with M).

    With W_RING the words are copied into a ring of shared memory beside x's (``cp.async``,
    in the same commit groups), X_STAGES - 1 tiles ahead of the one decoded, instead of
    loaded into registers DEPTH ahead: more bytes in flight per warp at no register cost
    (DEPTH is then 1 for the scales the decode applies)."""
    K_WARPS: gl.constexpr = num_warps // ROW_WARPS
    ROWS: gl.constexpr = 16 * ROW_TILES * ROW_WARPS
    IS_BF16: gl.constexpr = x_ptr.dtype.element_ty == gl.bfloat16
    dtype: gl.constexpr = x_ptr.dtype.element_ty
    BIAS: gl.constexpr = 128.0 if IS_BF16 else 1024.0
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[K_WARPS, ROW_WARPS, 1], instr_shape=[1, 16, 8]
    )
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    b_layout: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma_layout, k_width=2)
    acc_rows: gl.constexpr = gl.SliceLayout(2, mma_layout)

    pid, pid_k, off_n, off_m, split_tile0 = _program_tile(N, tiles_per_split, ROWS, BLOCK_M, PDL)

    # words [K group, row, word]: weight row off_n + row over group w's K range
    qw = gl.arange(0, K_WARPS, layout=gl.SliceLayout(1, gl.SliceLayout(2, q_layout)))
    qr = off_n + gl.arange(0, ROWS, layout=gl.SliceLayout(0, gl.SliceLayout(2, q_layout)))
    qi = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, q_layout)))
    q_tile0 = split_tile0 + qw * tiles_per_warp
    q_tile0 = gl.where((qr < N)[None, :], q_tile0[:, None], tiles_total)[:, :, None]
    q_ptrs = qw_ptr + _row_words(qr, stride_qw_n, TILED)[None, :, None] + qi[None, None, :]
    # x's copies [K group, x row, column of the tile]
    xw = gl.arange(0, K_WARPS, layout=gl.SliceLayout(1, gl.SliceLayout(2, x_layout)))
    xm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, gl.SliceLayout(2, x_layout)))
    xk = gl.arange(0, 128, layout=gl.SliceLayout(0, gl.SliceLayout(1, x_layout)))
    x_tile0 = (split_tile0 + xw * tiles_per_warp)[:, None, None]
    x_ptrs = x_ptr + (xm * stride_x_m)[None, :, None] + xk[None, None, :] + x_tile0 * 128
    x_ok = (xm < M)[None, :, None] & (xk < 128)[None, None, :]
    # scales and offsets [K group, row]
    sw = gl.arange(0, K_WARPS, layout=gl.SliceLayout(1, acc_rows))
    sr = off_n + gl.arange(0, ROWS, layout=gl.SliceLayout(0, acc_rows))
    s_tile0 = (split_tile0 + sw * tiles_per_warp)[:, None]
    s_rows_ok = (sr < N)[None, :]
    # SCALED: the same [K group, row] in the words' layout, for the decode
    d_tile0 = (split_tile0 + qw * tiles_per_warp)[:, None]
    d_rows = qr[None, :]
    d_rows_ok = (qr < N)[None, :]

    ring = gl.allocate_shared_memory(
        dtype,
        [X_STAGES, K_WARPS, BLOCK_M, 128],
        gl.SwizzledSharedLayout(8, 1, 8, order=[2, 1, 0]),
    )
    if W_RING:  # each thread's 16 bytes of a row next to its lane's: 512 bytes a warp a load
        wring = gl.allocate_shared_memory(
            gl.int32, [X_STAGES, K_WARPS, ROWS, 16], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
        )
    ones = gl.full([K_WARPS, ROWS, 128], 1.0, dtype, layout=a_layout)
    zeros = gl.zeros([K_WARPS, ROWS, BLOCK_M], gl.float32, layout=mma_layout)
    acc = zeros
    part = zeros
    xsum = zeros

    last = tiles_per_warp - 1
    if PDL != 2:  # x's first tiles, then the words (after them with ``weights_first``)
        _copy_x_ahead(ring, x_ptrs, x_ok, x_tile0, last, tiles_total, X_STAGES)
    if W_RING:  # one commit group per tile, as x's (either order: the loop's waits hold)
        for stage in gl.static_range(X_STAGES - 1):
            _copy_words(wring, stage, q_ptrs, q_tile0, tiles_total, gl.minimum(stage, last),
                        TILED)  # fmt: skip
            async_copy.commit_group()
    else:
        q0 = _load_words(q_ptrs, q_tile0, tiles_total, 0, TILED)
    if S_AHEAD:  # tile 0's scales and offsets with its words (APPLY 1: after every tile)
        sa, oa = _row_scales(s_ptr, o_ptr, s_tile0, sr[None, :], s_rows_ok, tiles_total,
                             stride_s_g, GROUP_TILES, BIAS)  # fmt: skip
    if SCALED:
        s0, o0 = _tile_scales(s_ptr, o_ptr, d_tile0, d_rows, d_rows_ok, tiles_total, stride_s_g,
                              GROUP_TILES, APPLY, dtype)  # fmt: skip
    if (DEPTH == 2) & (not W_RING):
        q1 = _load_words(q_ptrs, q_tile0, tiles_total, gl.minimum(1, last), TILED)
        if SCALED:
            s1, o1 = _tile_scales(s_ptr, o_ptr, d_tile0 + gl.minimum(1, last), d_rows,
                                  d_rows_ok, tiles_total, stride_s_g, GROUP_TILES, APPLY,
                                  dtype)  # fmt: skip
    _wait_after_words(PDL)
    if PDL == 2:
        _copy_x_ahead(ring, x_ptrs, x_ok, x_tile0, last, tiles_total, X_STAGES)
    for kt in range(tiles_per_warp):
        if W_RING:
            if SCALED:
                s1, o1 = _tile_scales(s_ptr, o_ptr, d_tile0 + gl.minimum(kt + 1, last), d_rows,
                                      d_rows_ok, tiles_total, stride_s_g, GROUP_TILES, APPLY,
                                      dtype)  # fmt: skip
        elif DEPTH == 2:
            q2 = _load_words(q_ptrs, q_tile0, tiles_total, gl.minimum(kt + 2, last), TILED)
            if SCALED:
                s2, o2 = _tile_scales(s_ptr, o_ptr, d_tile0 + gl.minimum(kt + 2, last), d_rows,
                                      d_rows_ok, tiles_total, stride_s_g, GROUP_TILES, APPLY,
                                      dtype)  # fmt: skip
        else:
            q1 = _load_words(q_ptrs, q_tile0, tiles_total, gl.minimum(kt + 1, last), TILED)
            if SCALED:
                s1, o1 = _tile_scales(s_ptr, o_ptr, d_tile0 + gl.minimum(kt + 1, last), d_rows,
                                      d_rows_ok, tiles_total, stride_s_g, GROUP_TILES, APPLY,
                                      dtype)  # fmt: skip
        if S_AHEAD:
            sb, ob = _row_scales(s_ptr, o_ptr, s_tile0 + gl.minimum(kt + 1, last), sr[None, :],
                                 s_rows_ok, tiles_total, stride_s_g, GROUP_TILES, BIAS)  # fmt: skip
        async_copy.wait_group(X_STAGES - 2)  # this thread's copies of tile kt have landed
        gl.thread_barrier()  # everyone's; and everyone is done with tile kt - 1's slot
        ahead = gl.minimum(kt + X_STAGES - 1, last)
        async_copy.async_copy_global_to_shared(
            ring.index((kt + X_STAGES - 1) % X_STAGES),
            x_ptrs + ahead * 128,
            mask=x_ok & (x_tile0 + ahead < tiles_total),
        )
        if W_RING:
            _copy_words(wring, (kt + X_STAGES - 1) % X_STAGES, q_ptrs, q_tile0, tiles_total,
                        ahead, TILED)  # fmt: skip
            q0 = wring.index(kt % X_STAGES).load(q_layout)
        async_copy.commit_group()
        xv = ring.index(kt % X_STAGES).permute((0, 2, 1)).load(b_layout)
        if SCALED:
            acc = mma_v2(_decode_frag3(q0, s0, o0, a_layout, IS_BF16), xv, acc)
        else:
            a = _codes_frag3(q0, ones, a_layout, IS_BF16)
            part = mma_v2(a, xv, part)
            xsum = mma_v2(ones, xv, xsum)
        if S_AHEAD:
            acc += part * sa[:, :, None] + xsum * oa[:, :, None]
            part = zeros
            xsum = zeros
            sa, oa = sb, ob
        elif (APPLY != 0) & (not SCALED):
            if ((kt + 1) % APPLY == 0) | (kt == last):
                s, o = _row_scales(s_ptr, o_ptr, s_tile0 + kt, sr[None, :], s_rows_ok,
                                   tiles_total, stride_s_g, GROUP_TILES, BIAS)  # fmt: skip
                acc += part * s[:, :, None] + xsum * o[:, :, None]
                part = zeros
                xsum = zeros
        if W_RING:
            if SCALED:
                s0, o0 = s1, o1
        elif DEPTH == 2:
            q0 = q1
            q1 = q2
            if SCALED:
                s0, o0, s1, o1 = s1, o1, s2, o2
        else:
            q0 = q1
            if SCALED:
                s0, o0 = s1, o1
    # every thread's last copies (the ring's final, redundant ones) have landed before any
    # thread writes the reduction buffer, which may reuse the ring's shared memory
    async_copy.wait_group(0)
    gl.thread_barrier()
    if (APPLY == 0) & (not SCALED):  # per channel
        ok = s_rows_ok & (sw >= 0)[:, None]
        s = gl.load(s_ptr + sr[None, :] + 0 * sw[:, None], mask=ok, other=0.0).to(gl.float32)
        o = gl.load(o_ptr + sr[None, :] + 0 * sw[:, None], mask=ok, other=0.0).to(gl.float32)
        acc = part * s[:, :, None] + xsum * (o - BIAS * s)[:, :, None]
    total = _sum_over_warps(acc, 1, ROWS, num_warps, K_WARPS)  # [K group, row, x row]
    _swap_epilogue(total, out_ptr, ws_ptr, lock_ptr, pid, pid_k, num_splits, M, N, off_m,
                   off_n, stride_out_m, MODE)  # fmt: skip


_MMA_LAUNCH = FastLaunch(_int4_mma_kernel)
_MMA_XS_LAUNCH = FastLaunch(_int4_mma_xs_kernel)


@functools.cache
def _frag_words3(rows: int, num_warps: int, row_warps: int = 1) -> gl.DistributedLinearLayout:
    """``_frag_words_layout`` of one K tile per K group of ``row_warps`` warps: words
    [num_warps // row_warps, rows, 16], group g holding [g], its warp r rows 16 r .. 16 r + 15
    of every 16 row_warps (the mma layout's order: warps over rows first); of its rows, lane
    4n + t holds words 4t .. 4t + 3 of rows n and n + 8, contiguous in registers."""
    log2 = lambda v: v.bit_length() - 1  # noqa: E731
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [0, 8, 0]]
        + [[0, (16 * row_warps) << i, 0] for i in range(log2(rows // (16 * row_warps)))],
        lane_bases=[[0, 0, 4], [0, 0, 8], [0, 1, 0], [0, 2, 0], [0, 4, 0]],
        warp_bases=[[0, 16 << i, 0] for i in range(log2(row_warps))]
        + [[1 << i, 0, 0] for i in range(log2(num_warps // row_warps))],
        block_bases=[],
        shape=[num_warps // row_warps, rows, 16],
    )


@functools.cache
def _x_copy_layout(num_warps: int, row_warps: int = 1) -> gl.BlockedLayout:
    """x's tiles [num_warps // row_warps, block_m, 128] (block_m >= 2 row_warps) for
    ``cp.async``: 16 bytes per thread, K group g's warps copying [g], each its own rows."""
    warps = [num_warps // row_warps, row_warps, 1]
    return gl.BlockedLayout([1, 1, 8], [1, 2, 16], warps, [2, 1, 0])


@functools.cache
def _x_tile_layout(block_m: int, num_warps: int) -> gl.DistributedLinearLayout:
    """Layout of x's K tile as [block_m, 4 (t), 32]: lane 4n + t holds row n (+ 8 per register
    bit above) and columns 32t .. 32t + 31, contiguous in registers; every warp holds all of
    it (each multiplies it by its own rows)."""
    log2 = lambda v: v.bit_length() - 1  # noqa: E731
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1 << i] for i in range(5)]
        + [[8 << i, 0, 0] for i in range(log2(block_m) - 3)],
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[0, 0, 0]] * log2(num_warps),
        block_bases=[],
        shape=[block_m, 4, 32],
    )


def _mma_source_k(device: torch.device | str = "cpu") -> torch.Tensor:
    """[128] int64: the column of a 128-column tile that column j of ``mma_order``'s tile
    holds: j = 8r + 2t + h holds column 32t + 2r + h, so that the mma lane t multiplies x's
    columns 32t .. 32t + 31 (one contiguous 64-byte run per row of x)."""
    j = torch.arange(128, device=device)
    r, t, h = j // 8, (j % 8) // 2, j % 2
    return 32 * t + 2 * r + h


def mma_order(qweight: torch.Tensor) -> torch.Tensor:
    """Canonical words int32 [N, K // 8] -> the words ``int4_mma`` reads (K a multiple of 128):
    the columns of each 128-column tile permuted by ``_mma_source_k``, then put in fragment
    order (``int4_weight.frag_order``)."""
    n, words = qweight.shape
    if words % 16:
        raise ValueError(f"mma order needs K a multiple of 128, got K={words * 8}")
    codes = unpack_words(qweight).reshape(n, words // 16, 128)
    codes = codes[:, :, _mma_source_k(qweight.device)]
    return frag_order(pack_words(codes.reshape(n, words, 8)))


@dataclass(frozen=True)
class Int4MmaWeight:
    """An ``Int4Weight`` as ``int4_mma`` reads it (``to_mma``): words int32 [N, K // 8] in
    ``mma_order`` (``contiguous_x``) or in fragment order (``int4_weight.frag_order``, as the
    engine holds wide and long-K weights on Hopper), scales and offsets [K // group_size, N]
    as in the canonical form."""

    qweight: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor
    group_size: int
    contiguous_x: bool = True
    tiled: bool = False  # words in ``tile_order``

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1] * 8


def to_mma(weight: Int4Weight, contiguous_x: bool = True, tiled: bool = False) -> Int4MmaWeight:
    """``weight`` (canonical or fragment order) with its words in ``mma_order``, or with
    ``contiguous_x=False`` in fragment order (no copy where they already are; x is then read
    in 4-byte pairs); ``tiled``: and in ``tile_order`` (N a multiple of 16). Needs K a
    multiple of 128, groups of a multiple of 128 or one per row, and no act-order permutation
    (the caller would have to gather x first)."""
    k, g = weight.in_features, weight.group_size
    if not frag_shape_ok(k, g):
        raise ValueError(
            f"int4_mma needs K and the group size multiples of {FRAG_TILE_K} (or one group), "
            f"got K={k}, group_size={g}"
        )
    if weight.in_perm is not None:
        raise ValueError("int4_mma does not take act-order weights (in_perm); permute x first")
    if contiguous_x:
        words = mma_order(weight.to_canonical().qweight)
        if tiled:
            words = tile_order(words)
    else:
        words = weight.to_frag(tiled=tiled).qweight
    return Int4MmaWeight(words, weight.scales, weight.offsets, g, contiguous_x, tiled)


def int4_mma_ok(x: torch.Tensor) -> bool:
    """Whether ``int4_mma`` can run on x: CUDA sm_80+ (``mma.sync``), 16-bit x (the
    capability looked up once per device: the table's launcher asks on every call)."""
    if not x.is_cuda or x.dtype not in (torch.bfloat16, torch.float16):
        return False
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return _capability_major(index) >= 8


def int4_mma(
    x: torch.Tensor,
    weight: Int4MmaWeight,
    block_m: int = 8,
    num_warps: int = 4,
    split_k: int = 1,
    depth: int = 2,
    pdl: bool = False,
    weights_first: bool = False,
    wsplit: bool = False,
    row_tiles: int = 1,
    x_smem: bool = False,
    x_stages: int = 2,
    row_warps: int = 1,
    maxnreg: int | None = None,
    scaled: bool = False,
    slots: bool = True,
    parts: int = 0,
    s_ahead: bool = False,
    w_ring: bool = False,
) -> torch.Tensor:
    """``x @ dequant(weight)^T`` for x [M, K] (bf16 or fp16) on the register mma kernel;
    [M, N] in x's dtype.

    ``num_warps`` warps per program, each over 16 weight rows: different rows, or with
    ``wsplit`` the program's 16 rows over ``num_warps`` K ranges, summed in shared memory at the
    end; ``row_tiles`` (1, 2 or 4) such groups of 16 rows per warp, multiplied by the same x
    fragments (fewer loads of x per weight row). ``block_m`` rows of x per program (8 or 16; a
    power of two), ``split_k`` programs along K (reduced in global memory, ``split_k_output``),
    ``depth`` K tiles of words loaded ahead (1 or 2), ``pdl`` (sm_90+) launches it as a
    programmatic dependent that waits for the previous kernel before it reads anything; with
    ``weights_first`` as well it issues its first ``depth`` tiles of words (and scales) before
    that wait and reads x only after it (the weight must not be written by a kernel that may
    still be running: ``kernels.pdl``). ``x_smem`` (with ``wsplit``, fragment-ordered words):
    each warp copies its x tiles into shared memory (``cp.async``, a ring of ``x_stages`` tiles)
    and reads the mma's fragments back with ``ldmatrix`` (``_int4_mma_xs_kernel``);
    ``row_warps`` (with ``x_smem``, dividing ``num_warps``, at most ``block_m // 2``) groups the
    warps: each group of ``row_warps`` warps holds ``row_warps`` times the rows over one K range
    and reads one copy of x's tiles, so the program covers that many more rows per read of x.
    ``maxnreg`` caps the registers per thread: ptxas spills the rest, and schedules the loop
    differently even where it needs fewer (on the H200 that, not occupancy, made the table's M
    <= 8 forms 8-17% faster: BENCHMARKS.md, "INT4 GEMM", fourteenth session). ``scaled`` (with
    ``x_smem``): the decode applies each tile's scale and offset, rounding the weights once to
    x's dtype, instead of a second mma on ones for x's group sums. ``parts`` (measurement only)
    leaves part of the work out: 1 the split-K reduction (each split stores its partial over the
    others'), 2 the math as well (the words are loaded and summed). ``s_ahead``: where the
    scales apply after every K tile (groups of 128, or ranges not on group boundaries) and
    the decode does not apply them, each tile's scales and offsets are loaded with its
    words, a tile ahead, instead of after its products (ignored elsewhere). ``w_ring`` (with
    ``x_smem``): the words go through a ring of shared memory beside x's, ``x_stages`` - 1
    tiles ahead (``cp.async``), instead of ``depth`` tiles ahead in registers. Check
    ``int4_mma_ok`` first."""
    if not isinstance(weight, Int4MmaWeight):
        raise TypeError(f"int4_mma takes an Int4MmaWeight (to_mma), got {type(weight).__name__}")
    if parts not in (0, 1, 2):
        raise ValueError(f"parts must be 0, 1 or 2, got {parts}")
    if depth not in (1, 2):
        raise ValueError(f"depth must be 1 or 2, got {depth}")
    if row_tiles not in (1, 2, 4):
        raise ValueError(f"row_tiles must be 1, 2 or 4, got {row_tiles}")
    if x_smem and not (wsplit and not weight.contiguous_x and parts == 0):
        raise ValueError("x_smem needs wsplit and fragment-ordered words (contiguous_x=False)")
    if scaled and not x_smem:
        raise ValueError("scaled applies with x_smem only")
    if x_stages not in (2, 3, 4):
        raise ValueError(f"x_stages must be 2, 3 or 4, got {x_stages}")
    if w_ring and not x_smem:
        raise ValueError("w_ring needs x_smem (the words share x's ring)")
    if row_warps != 1 and not (
        x_smem and row_warps in (2, 4, 8) and num_warps % row_warps == 0
        and 2 * row_warps <= block_m
    ):  # fmt: skip
        raise ValueError(
            f"row_warps must be 1, or 2, 4 or 8 with x_smem, dividing num_warps ({num_warps}) "
            f"and at most block_m // 2 ({block_m // 2}); got {row_warps}"
        )
    if block_m < 8 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two >= 8, got {block_m}")
    m, k = x.shape
    n, g = weight.out_features, weight.group_size
    if k != weight.in_features:
        raise ValueError(f"x has K={k}, the weight K={weight.in_features}")
    tiles = k // FRAG_TILE_K
    tiles_per_split = -(-tiles // split_k)
    k_warps = num_warps // row_warps  # K ranges per program (wsplit)
    if wsplit:  # whole K tiles per warp
        tiles_per_split = -(-tiles_per_split // k_warps) * k_warps
    num_splits = -(-tiles // tiles_per_split)
    tiles_per_warp = tiles_per_split // k_warps if wsplit else tiles_per_split
    rows = 16 * row_tiles * (row_warps if wsplit else num_warps)
    num_tiles = -(-m // block_m) * -(-n // rows)
    mode, out, ws, locks = split_k_output(x, m, n, num_splits, num_tiles, slots=slots)
    pdl = (2 if weights_first else 1) if pdl and has_pdl(x.device) else 0
    # scales apply once per group where every warp's K range starts on a group boundary,
    # else after every tile; per channel once at the end
    group_tiles = g // FRAG_TILE_K
    if g == k:
        apply = 0
    elif tiles_per_warp % group_tiles == 0 and tiles_per_split % group_tiles == 0:
        apply = group_tiles
    else:
        apply = 1
    group_tiles = group_tiles if apply else 1
    s_ahead = bool(s_ahead and apply == 1 and not scaled)
    depth = 1 if w_ring else depth  # the scales the decode applies: one tile ahead
    args = (x, weight.qweight, weight.scales, weight.offsets, out, ws, locks, m, n, tiles,
            tiles_per_split, tiles_per_warp, num_splits, x.stride(0), weight.qweight.stride(0),
            weight.scales.stride(0), out.stride(0))  # fmt: skip
    common = dict(BLOCK_M=block_m, GROUP_TILES=group_tiles, APPLY=apply, DEPTH=depth, MODE=mode,
                  PDL=pdl, ROW_TILES=row_tiles, num_warps=num_warps)  # fmt: skip
    if pdl:
        common["launch_pdl"] = True
    if maxnreg:
        common["maxnreg"] = maxnreg
    if x_smem:
        key = (block_m, group_tiles, apply, depth, mode, pdl, row_tiles, x_stages, row_warps,
               num_warps, maxnreg, scaled, x.dtype, weight.scales.dtype,
               weight.tiled, s_ahead, w_ring)  # fmt: skip
        _MMA_XS_LAUNCH(
            (num_tiles, num_splits), key, *args, X_STAGES=x_stages, ROW_WARPS=row_warps,
            SCALED=scaled, TILED=weight.tiled, S_AHEAD=s_ahead, W_RING=w_ring,
            q_layout=_frag_words3(rows, num_warps, row_warps),
            x_layout=_x_copy_layout(num_warps, row_warps), **common,
        )  # fmt: skip
    else:
        key = (block_m, group_tiles, apply, depth, mode, pdl, wsplit, row_tiles,
               weight.contiguous_x, num_warps, maxnreg, x.dtype, weight.scales.dtype,
               parts, weight.tiled, s_ahead)  # fmt: skip
        _MMA_LAUNCH(
            (num_tiles, num_splits), key, *args, WSPLIT=wsplit, X_CONTIG=weight.contiguous_x,
            TILED=weight.tiled, S_AHEAD=s_ahead,
            q_layout=_frag_words_layout(16 * num_warps * row_tiles, 16, num_warps),
            x_layout=_x_tile_layout(block_m, num_warps), PARTS=parts, **common,
        )  # fmt: skip
    return out.to(x.dtype) if mode == 1 else out
