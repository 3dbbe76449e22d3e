"""W4A16 GEMM for large M on Hopper, written in Gluon so that the decode of a weight tile can
run beside the tensor-core products of the previous ones.

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
GEMM, and the kernel takes about 1.4x that. It ships for M <= 256 on wide weights, where it
beats the Triton kernels; at M = 1024 dequantize + cuBLAS stays faster.
"""

from __future__ import annotations

import functools

import torch
import triton
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

from kernels.int4_tiles import _DEQUANT_PTX_BF16, _DEQUANT_PTX_F16
from kernels.int4_weight import Int4Weight, tma_tiles_ok

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


def wgmma_ok(x: torch.Tensor, weight: Int4Weight, block_k: int = 64) -> bool:
    """Whether ``int4_wgmma`` applies: ``tma_tiles_ok`` (16-bit x on sm_90+, K tiles within
    one group, rows TMA can address)."""
    return tma_tiles_ok(x, weight, block_k)


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
