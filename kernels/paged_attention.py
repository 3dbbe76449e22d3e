"""Attention over the paged KV cache for one step's flattened batch.

Contract (DESIGN.md): ``key_cache``/``value_cache`` are
``[num_blocks, block_size, num_kv_heads, head_dim]``; a step's tokens are flattened, sequence
``i`` owning query rows ``query_start_loc[i]:query_start_loc[i+1]``; ``seq_lens[i]`` is its
context length after this step's tokens were written to the cache, so its new tokens sit at
positions ``seq_lens[i] - q_len_i ... seq_lens[i] - 1``.
"""

from __future__ import annotations

import torch


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
    # longer query runs go one at a time.
    decode_idx = [i for i in range(num_seqs) if q_lens[i] == 1]
    other_idx = [i for i in range(num_seqs) if q_lens[i] > 1]
    if decode_idx:
        idx = torch.tensor(decode_idx, device=query.device, dtype=torch.long)
        ctx = max(lens[i] for i in decode_idx)
        nblk = (ctx + block_size - 1) // block_size
        tables = block_tables[idx, :nblk].long()  # [B, nblk]
        k = key_cache[tables].reshape(len(decode_idx), nblk * block_size, num_kv_heads, head_dim)
        v = value_cache[tables].reshape(len(decode_idx), nblk * block_size, num_kv_heads, head_dim)
        k = k[:, :ctx].float()
        v = v[:, :ctx].float()
        rows = torch.tensor([starts[i] for i in decode_idx], device=query.device)
        q = query[rows].float().view(len(decode_idx), num_kv_heads, group, head_dim)
        scores = torch.einsum("bhgd,bkhd->bhgk", q, k) * scale  # [B, Hkv, G, ctx]
        kpos = torch.arange(ctx, device=query.device)
        slens = seq_lens[idx].long()
        mask = kpos[None, :] < slens[:, None]
        if sliding_window is not None:
            mask &= kpos[None, :] > (slens[:, None] - 1 - sliding_window)
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        o = torch.einsum("bhgk,bkhd->bhgd", probs, v)
        out[rows] = o.reshape(len(decode_idx), num_heads, head_dim).to(out.dtype)
    for i in other_idx:
        ctx = lens[i]
        q_len = q_lens[i]
        nblk = (ctx + block_size - 1) // block_size
        table = block_tables[i, :nblk].long()
        k = key_cache[table].reshape(nblk * block_size, num_kv_heads, head_dim)[:ctx].float()
        v = value_cache[table].reshape(nblk * block_size, num_kv_heads, head_dim)[:ctx].float()
        q = query[starts[i] : starts[i + 1]].float().view(q_len, num_kv_heads, group, head_dim)
        scores = torch.einsum("qhgd,khd->hgqk", q, k) * scale  # [Hkv, G, q_len, ctx]
        qpos = torch.arange(ctx - q_len, ctx, device=query.device)
        kpos = torch.arange(ctx, device=query.device)
        mask = kpos[None, :] <= qpos[:, None]
        if sliding_window is not None:
            mask &= kpos[None, :] > (qpos[:, None] - sliding_window)
        scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        o = torch.einsum("hgqk,khd->qhgd", probs, v)
        out[starts[i] : starts[i + 1]] = o.reshape(q_len, num_heads, head_dim).to(out.dtype)
    return out
