"""A plain dense forward of the engine's Llama model, for calibration and perplexity.

The engine's own forward runs over the paged KV cache; quantization only needs whole
sequences, so this runs each decoder layer on one sequence with causal SDPA, and lets the
caller see (and record) the input of every linear layer on the way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels.rms_norm import rms_norm_ref
from kernels.rotary_embedding import rotary_embedding_ref
from kernels.silu_and_mul import silu_and_mul_ref

# The linear layers of a decoder layer in the order their inputs appear.
LINEAR_SITES = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")

Record = Callable[[str, torch.Tensor], None]


def layer_forward(model, layer, h: torch.Tensor, record: Record | None = None) -> torch.Tensor:
    """One decoder layer on one sequence: h [T, hidden] -> [T, hidden]. ``record(site, x)``
    sees the input x [T, in_features] of each linear layer before it runs."""

    def linear(site: str, module, x: torch.Tensor) -> torch.Tensor:
        if record is not None:
            record(site, x)
        return module(x)

    attn = layer.self_attn
    num_tokens = h.shape[0]
    x = rms_norm_ref(h, layer.input_layernorm.weight, layer.input_layernorm.eps)
    qkv = linear("self_attn.qkv_proj", attn.qkv_proj, x)
    q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    q = q.reshape(num_tokens, attn.num_heads, attn.head_dim).contiguous()
    k = k.reshape(num_tokens, attn.num_kv_heads, attn.head_dim).contiguous()
    v = v.reshape(num_tokens, attn.num_kv_heads, attn.head_dim)
    positions = torch.arange(num_tokens)
    rotary_embedding_ref(positions, q, k, model.cos_sin_cache)
    rep = attn.num_heads // attn.num_kv_heads
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.repeat_interleave(rep, 1).transpose(0, 1),
        v.repeat_interleave(rep, 1).transpose(0, 1),
        is_causal=True,
        scale=attn.scale,
    )
    o = o.transpose(0, 1).reshape(num_tokens, attn.q_size)
    h = h + linear("self_attn.o_proj", attn.o_proj, o)
    ln = layer.post_attention_layernorm
    x = rms_norm_ref(h, ln.weight, ln.eps)
    gate_up = linear("mlp.gate_up_proj", layer.mlp.gate_up_proj, x)
    return h + linear("mlp.down_proj", layer.mlp.down_proj, silu_and_mul_ref(gate_up))


@torch.no_grad()
def sequence_logits(model, token_ids: torch.Tensor) -> torch.Tensor:
    """token_ids [T] -> float32 logits [T, vocab] (positions 0..T-1, causal)."""
    h = model.embed_tokens(token_ids)
    for layer in model.layers:
        h = layer_forward(model, layer, h)
    h = rms_norm_ref(h, model.norm.weight, model.norm.eps)
    return model.compute_logits(h)


@torch.no_grad()
def perplexity(model, sequences: list[torch.Tensor]) -> float:
    """exp(mean next-token negative log-likelihood) over all sequences."""
    total, count = 0.0, 0
    for ids in sequences:
        logits = sequence_logits(model, ids)
        nll = F.cross_entropy(logits[:-1].float(), ids[1:], reduction="sum")
        total += float(nll)
        count += ids.numel() - 1
    return float(torch.exp(torch.tensor(total / count)))


def token_chunks(tokenizer, texts: list[str], seq_len: int, max_sequences: int) -> list:
    """Tokenize texts (one BOS-less stream) and cut it into up to max_sequences of seq_len."""
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer.encode(text, add_special_tokens=False))
    chunks = [ids[i : i + seq_len] for i in range(0, len(ids), seq_len)]
    chunks = [c for c in chunks if len(c) >= 2][:max_sequences]
    if not chunks:
        raise ValueError("the calibration text is empty after tokenization")
    return [torch.tensor(c, dtype=torch.long) for c in chunks]


def read_calibration_texts(path: str | Path) -> list[str]:
    """Texts from a JSONL file: each line ``{"text": ...}``, ``{"prompt": ...}`` or an OpenAI
    batch line whose body has ``prompt`` or ``messages``. ValueError names a bad line."""
    texts = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
        body = obj.get("body", obj) if isinstance(obj, dict) else None
        if not isinstance(body, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object")
        text = body.get("text") or body.get("prompt")
        if text is None and isinstance(body.get("messages"), list):
            text = "\n".join(str(m.get("content", "")) for m in body["messages"])
        if not isinstance(text, str) or not text:
            raise ValueError(f"{path}:{number}: needs a 'text', 'prompt' or 'messages' field")
        texts.append(text)
    if not texts:
        raise ValueError(f"{path} holds no calibration text")
    return texts
