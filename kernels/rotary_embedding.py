"""Rotary position embeddings (rotate-half convention of Llama and Qwen2), in place."""

from __future__ import annotations

import torch


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
