"""Rotary position embeddings (rotate-half convention of Llama and Qwen2), in place."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.launch import FastLaunch
from kernels.pdl import chain_launch


@triton.jit
def _rotate_heads(
    base_ptr, num_heads, stride_h, stride_d, cos, sin,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, HEADS_PAD: tl.constexpr,
):  # fmt: skip
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HALF_PAD)
    mask = (offs_h < num_heads)[:, None] & (offs_d < HALF)[None, :]
    first = base_ptr + offs_h[:, None] * stride_h + offs_d[None, :] * stride_d
    second = first + HALF * stride_d
    x1 = tl.load(first, mask=mask, other=0.0)
    x2 = tl.load(second, mask=mask, other=0.0)
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    tl.store(first, (a * cos[None, :] - b * sin[None, :]).to(x1.dtype), mask=mask)
    tl.store(second, (b * cos[None, :] + a * sin[None, :]).to(x1.dtype), mask=mask)


@triton.jit
def _rotary_embedding_kernel(
    positions_ptr,
    q_ptr,
    k_ptr,
    cos_sin_ptr,
    num_heads,
    num_kv_heads,
    stride_q_t,
    stride_q_h,
    stride_q_d,
    stride_k_t,
    stride_k_h,
    stride_k_d,
    stride_cs_p,
    stride_cs_d,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr,
    CHAIN: tl.constexpr,
):
    if CHAIN:  # a programmatic dependent: wait for the previous kernel, then let the next launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, HALF_PAD)
    d_mask = offs_d < HALF
    cs_ptrs = cos_sin_ptr + pos * stride_cs_p + offs_d * stride_cs_d
    cos = tl.load(cs_ptrs, mask=d_mask, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptrs + HALF * stride_cs_d, mask=d_mask, other=0.0).to(tl.float32)
    _rotate_heads(
        q_ptr + token * stride_q_t, num_heads, stride_q_h, stride_q_d, cos, sin,
        HALF, HALF_PAD, HEADS_PAD,
    )  # fmt: skip
    _rotate_heads(
        k_ptr + token * stride_k_t, num_kv_heads, stride_k_h, stride_k_d, cos, sin,
        HALF, HALF_PAD, KV_HEADS_PAD,
    )  # fmt: skip


_ROTARY = FastLaunch(_rotary_embedding_kernel)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> None:
    """Triton version of :func:`rotary_embedding_ref`: rotates ``query`` and ``key`` in place.

    ``query``/``key`` may be strided views (e.g. of a fused QKV output); one program per token.
    """
    if query.dim() != 3 or key.dim() != 3 or query.shape[0] != key.shape[0]:
        raise ValueError(
            "query must be [num_tokens, num_heads, head_dim] and key "
            f"[num_tokens, num_kv_heads, head_dim]; got {tuple(query.shape)}, {tuple(key.shape)}"
        )
    num_tokens, num_heads, head_dim = query.shape
    if key.shape[2] != head_dim or positions.shape != (num_tokens,):
        raise ValueError(
            f"key's head_dim must be {head_dim} and positions [{num_tokens}]; got "
            f"{key.shape[2]} and {tuple(positions.shape)}"
        )
    rotary_dim = cos_sin_cache.shape[-1] if cos_sin_cache.dim() == 2 else -1
    if rotary_dim < 2 or rotary_dim % 2 != 0 or rotary_dim > head_dim:
        raise ValueError(
            "cos_sin_cache must be [max_position, rotary_dim] with an even rotary_dim <= "
            f"head_dim ({head_dim}); got {tuple(cos_sin_cache.shape)}"
        )
    if num_tokens == 0:
        return
    half = rotary_dim // 2
    chain = chain_launch(query.device)
    _ROTARY[(num_tokens,)](
        positions, query, key, cos_sin_cache, num_heads, key.shape[1],
        *query.stride(), *key.stride(), *cos_sin_cache.stride(),
        HALF=half, HALF_PAD=triton.next_power_of_2(half),
        HEADS_PAD=triton.next_power_of_2(num_heads),
        KV_HEADS_PAD=triton.next_power_of_2(key.shape[1]),
        CHAIN=chain, **({"launch_pdl": True} if chain else {}),
    )  # fmt: skip


def rotary_embedding_ref(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> None:
    """Rotate q and k in place by each token's position.

    positions:     [num_tokens] int64
    query:         [num_tokens, num_heads, head_dim]
    key:           [num_tokens, num_kv_heads, head_dim]
    cos_sin_cache: [max_position, rotary_dim] float32: cos in the first rotary_dim/2 columns,
                   sin in the rest (any rope scaling was applied when it was built). Only the
                   first ``rotary_dim`` channels of each head rotate.
    """
    rot = cos_sin_cache.shape[1]
    half = rot // 2
    cs = cos_sin_cache[positions.long()]
    cos = cs[:, None, :half]
    sin = cs[:, None, half:]
    for t in (query, key):
        x1 = t[..., :half].float()
        x2 = t[..., half:rot].float()
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        t[..., :half] = o1.to(t.dtype)
        t[..., half:rot] = o2.to(t.dtype)
