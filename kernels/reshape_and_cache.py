"""Write a step's new K/V rows into their cache slots."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.launch import FastLaunch
from kernels.pdl import chain_launch


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    num_kv_heads,
    stride_k_t,
    stride_k_h,
    stride_k_d,
    stride_v_t,
    stride_v_h,
    stride_v_d,
    stride_kc_b,
    stride_kc_s,
    stride_kc_h,
    stride_kc_d,
    stride_vc_b,
    stride_vc_s,
    stride_vc_h,
    stride_vc_d,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    CHAIN: tl.constexpr,
):
    if CHAIN:  # a programmatic dependent: wait for the previous kernel, then let the next launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # padding token: nothing to write
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask = (offs_h < num_kv_heads)[:, None] & (offs_d < HEAD_DIM)[None, :]
    k = tl.load(
        key_ptr + token * stride_k_t + offs_h[:, None] * stride_k_h + offs_d[None, :] * stride_k_d,
        mask=mask,
    )
    v = tl.load(
        value_ptr
        + token * stride_v_t
        + offs_h[:, None] * stride_v_h
        + offs_d[None, :] * stride_v_d,
        mask=mask,
    )
    kc_ptrs = key_cache_ptr + block * stride_kc_b + offset * stride_kc_s
    vc_ptrs = value_cache_ptr + block * stride_vc_b + offset * stride_vc_s
    kc_ptrs += offs_h[:, None] * stride_kc_h + offs_d[None, :] * stride_kc_d
    vc_ptrs += offs_h[:, None] * stride_vc_h + offs_d[None, :] * stride_vc_d
    tl.store(kc_ptrs, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(vc_ptrs, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


_RESHAPE_AND_CACHE = FastLaunch(_reshape_and_cache_kernel)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Triton version of :func:`reshape_and_cache_ref`: same arguments, same in-place writes.

    ``key``/``value`` may be strided views (e.g. slices of a fused QKV output). One program per
    token; a negative slot makes its program return without writing.
    """
    if key.dim() != 3 or key.shape != value.shape or key_cache.dim() != 4:
        raise ValueError(
            "key and value must both be [num_tokens, num_kv_heads, head_dim] and key_cache "
            f"[num_blocks, block_size, num_kv_heads, head_dim]; got {tuple(key.shape)}, "
            f"{tuple(value.shape)}, {tuple(key_cache.shape)}"
        )
    if value_cache.shape != key_cache.shape or key_cache.shape[2:] != key.shape[1:]:
        raise ValueError(
            f"caches {tuple(key_cache.shape)}/{tuple(value_cache.shape)} must match each other "
            f"and end in key's [num_kv_heads, head_dim] = {tuple(key.shape[1:])}"
        )
    if slot_mapping.shape != (key.shape[0],) or slot_mapping.dtype not in (
        torch.int64,
        torch.int32,
    ):
        raise ValueError(
            f"slot_mapping must be [{key.shape[0]}] int64 (or int32), got "
            f"{tuple(slot_mapping.shape)} {slot_mapping.dtype}"
        )
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    chain = chain_launch(key.device)
    _RESHAPE_AND_CACHE[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping, num_kv_heads,
        *key.stride(), *value.stride(), *key_cache.stride(), *value_cache.stride(),
        BLOCK_SIZE=key_cache.shape[1], HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        CHAIN=chain, **({"launch_pdl": True} if chain else {}),
    )  # fmt: skip


def reshape_and_cache_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter new K/V into the paged cache, in place.

    key, value:   [num_tokens, num_kv_heads, head_dim]
    key_cache:    [num_blocks, block_size, num_kv_heads, head_dim] (value_cache alike)
    slot_mapping: [num_tokens] int64, slot = block_id * block_size + offset; a negative slot
                  means "do not write" (padding).
    """
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    flat = (num_blocks * block_size, num_kv_heads, head_dim)
    key_cache.view(flat).index_copy_(0, slots, key[valid].to(key_cache.dtype))
    value_cache.view(flat).index_copy_(0, slots, value[valid].to(value_cache.dtype))
