"""The Llama family (Llama 2/3, Mistral-style configs, Qwen2) over the paged KV cache.

All tokens of a step come flattened as one batch; attention reads and writes the paged cache
through ``Ops`` (Triton on CUDA, PyTorch references on CPU).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata
from engine.models.config import ModelConfig
from engine.models.rotary import build_cos_sin_cache
from engine.ops import Ops


class Linear(nn.Module):
    """A dense linear layer with uninitialized storage (weights always come from a checkpoint).

    weight [out_features, in_features]; the INT4 path swaps this module for one with the same
    ``forward``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.sliding_window = cfg.sliding_window
        o_bias = cfg.attention_bias and cfg.architecture != "Qwen2ForCausalLM"
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, cfg.attention_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, o_bias)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        cos_sin_cache: torch.Tensor,
        ops: Ops,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        ops.rotary_embedding(positions, q, k, cos_sin_cache)
        key_cache, value_cache = kv_cache
        ops.reshape_and_cache(k, v, key_cache, value_cache, meta.slot_mapping)
        o = ops.paged_attention(
            q,
            key_cache,
            value_cache,
            meta.query_start_loc,
            meta.seq_lens,
            meta.block_tables,
            self.scale,
            meta.max_query_len,
            meta.max_seq_len,
            self.sliding_window,
        )
        return self.o_proj(o.reshape(num_tokens, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, cfg.mlp_bias)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, cfg.mlp_bias)

    def forward(self, x: torch.Tensor, ops: Ops) -> torch.Tensor:
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x)))


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.eps = eps


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Llama-family decoder; ``forward`` returns the final hidden states of every token."""

    # Fused module -> the checkpoint's modules, in the order their outputs are concatenated.
    packed_modules = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _freeze=True)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size)
        rotary_dim = int(cfg.head_dim * cfg.partial_rotary_factor)
        self.register_buffer(
            "cos_sin_cache",
            build_cos_sin_cache(
                rotary_dim,
                cfg.max_position_embeddings,
                cfg.rope_theta,
                cfg.rope_scaling,
                device=self.embed_tokens.weight.device,
            ),
            persistent=False,
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        ops: Ops,
    ) -> torch.Tensor:
        """input_ids, positions: [num_tokens] -> hidden states [num_tokens, hidden_size]."""
        h = self.embed_tokens(input_ids)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            ln = layer.input_layernorm
            if residual is None:
                residual = h
                x = ops.rms_norm(h, ln.weight, ln.eps)
            else:
                x, residual = ops.rms_norm(h, ln.weight, ln.eps, residual)
            h = layer.self_attn(positions, x, kv_cache, meta, self.cos_sin_cache, ops)
            ln = layer.post_attention_layernorm
            x, residual = ops.rms_norm(h, ln.weight, ln.eps, residual)
            h = layer.mlp(x, ops)
        out, _ = ops.rms_norm(h, self.norm.weight, self.norm.eps, residual)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[num_rows, hidden] -> float32 logits [num_rows, vocab_size]."""
        if self.lm_head is None:
            return F.linear(hidden, self.embed_tokens.weight).float()
        return self.lm_head(hidden).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors (Hugging Face names) into the fused parameters.

        Returns the names of parameters that were loaded; raises ``ValueError`` for a
        checkpoint tensor this model has no place for, or parameters left unloaded.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        cfg = self.config
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        shard_offsets = {
            "q_proj": ("qkv_proj", 0, q),
            "k_proj": ("qkv_proj", q, kv),
            "v_proj": ("qkv_proj", q + kv, kv),
            "gate_proj": ("gate_up_proj", 0, cfg.intermediate_size),
            "up_proj": ("gate_up_proj", cfg.intermediate_size, cfg.intermediate_size),
        }
        for hf_name, tensor in weights:
            if "rotary_emb.inv_freq" in hf_name:
                continue
            name = hf_name.removeprefix("model.")
            if name == "lm_head.weight" and self.lm_head is None:
                continue  # tied: the embedding serves as the head
            target, offset, size = name, 0, None
            for part, (fused, start, length) in shard_offsets.items():
                if f".{part}." in name:
                    target, offset, size = name.replace(part, fused), start, length
                    break
            param = params.get(target)
            if param is None:
                raise ValueError(f"checkpoint tensor {hf_name!r} has no matching parameter")
            dest = param.data if size is None else param.data.narrow(0, offset, size)
            if dest.shape != tensor.shape:
                raise ValueError(
                    f"checkpoint tensor {hf_name!r} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(dest.shape)}"
                )
            dest.copy_(tensor)
            loaded.add(target)
        missing = set(params) - loaded
        if missing:
            raise ValueError(f"checkpoint lacks tensors for: {sorted(missing)[:8]}")
        return loaded
