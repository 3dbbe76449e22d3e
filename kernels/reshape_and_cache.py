"""Write a step's new K/V rows into their cache slots."""

from __future__ import annotations

import torch


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
    key_cache.view(num_blocks * block_size, num_kv_heads, head_dim)[slots] = key[valid].to(
        key_cache.dtype
    )
    value_cache.view(num_blocks * block_size, num_kv_heads, head_dim)[slots] = value[valid].to(
        value_cache.dtype
    )
