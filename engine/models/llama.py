"""The Llama family (Llama 2/3, Mistral-style configs, Qwen2) over the paged KV cache.

All tokens of a step come flattened as one batch; attention reads and writes the paged cache
through ``Ops`` (Triton on CUDA, PyTorch references on CPU).

Tensor parallelism (``tp``, see ``engine.distributed``): q/k/v and gate/up are split by
output (each rank holds its heads' q, k, v rows and its share of the MLP), o and down by
input with one all-reduce each, the embedding and LM head by vocabulary (padded to a
multiple of the rank count; logits gathered on rank 0). KV heads are split across ranks, or
replicated when there are fewer KV heads than ranks. A bias of o/down lives on rank 0 only.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata
from engine.distributed import TensorParallel
from engine.models.config import ModelConfig
from engine.models.rotary import build_cos_sin_cache
from engine.ops import Ops
from kernels.cpu_linear import pack_linear_weight, packed_linear


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
        self.packed: torch.Tensor | None = None  # the weight in oneDNN's layout (CPU)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return packed_linear(x, self.packed, self.bias)
        return F.linear(x, self.weight, self.bias)

    def pack_for_cpu(self) -> bool:
        """Reorder the weight once for oneDNN and drop the dense copy (False: not supported)."""
        packed = pack_linear_weight(self.weight)
        if packed is None:
            return False
        self.packed = packed
        self.weight = None
        return True


def check_tensor_parallel(cfg: ModelConfig, tp_size: int) -> None:
    """ValueError unless ``cfg`` splits ``tp_size`` ways (heads, KV heads, MLP width)."""
    if tp_size == 1:
        return
    if cfg.num_attention_heads % tp_size:
        raise ValueError(
            f"num_attention_heads ({cfg.num_attention_heads}) must be divisible by "
            f"tensor_parallel_size ({tp_size})"
        )
    kv = cfg.num_key_value_heads
    if kv % tp_size and tp_size % kv:
        raise ValueError(
            f"num_key_value_heads ({kv}) and tensor_parallel_size ({tp_size}) must divide one "
            "another (KV heads are split across ranks, or replicated when fewer)"
        )
    if cfg.intermediate_size % tp_size:
        raise ValueError(
            f"intermediate_size ({cfg.intermediate_size}) must be divisible by "
            f"tensor_parallel_size ({tp_size})"
        )


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.num_heads = cfg.num_attention_heads // tp.world_size
        # Fewer KV heads than ranks: each rank keeps the one KV head its q heads read.
        self.num_kv_heads = max(1, cfg.num_key_value_heads // tp.world_size)
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
        return self.tp.all_reduce(self.o_proj(o.reshape(num_tokens, self.q_size)))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        width = cfg.intermediate_size // tp.world_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * width, cfg.mlp_bias)
        self.down_proj = Linear(width, cfg.hidden_size, cfg.mlp_bias)

    def forward(self, x: torch.Tensor, ops: Ops) -> torch.Tensor:
        return self.tp.all_reduce(self.down_proj(ops.silu_and_mul(self.gate_up_proj(x))))


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.eps = eps


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallel) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, tp)
        self.mlp = LlamaMLP(cfg, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Llama-family decoder; ``forward`` returns the final hidden states of every token."""

    # Fused module -> the checkpoint's modules, in the order their outputs are concatenated.
    packed_modules = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, cfg: ModelConfig, tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.tp = tp = tp or TensorParallel()
        check_tensor_parallel(cfg, tp.world_size)
        # This rank's share (everything without tensor parallelism).
        self.num_local_heads = cfg.num_attention_heads // tp.world_size
        self.num_local_kv_heads = max(1, cfg.num_key_value_heads // tp.world_size)
        self.local_intermediate_size = cfg.intermediate_size // tp.world_size
        # This rank's vocabulary rows [vocab_start, vocab_start + num_vocab_rows); padded.
        self.num_vocab_rows = -(-cfg.vocab_size // tp.world_size)
        self.vocab_start = tp.rank * self.num_vocab_rows
        self.embed_tokens = nn.Embedding(self.num_vocab_rows, cfg.hidden_size, _freeze=True)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, tp) for _ in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (
            None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, self.num_vocab_rows)
        )
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
        h = self._embed(input_ids)
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

    def pack_linears_for_cpu(self) -> int:
        """Run the dense linear layers (LM head included) on oneDNN-packed weights; a tied
        head gets its own packed copy of the embedding. Call after loading. Returns how many
        layers were packed (0 where oneDNN cannot run this dtype)."""
        packed = sum(m.pack_for_cpu() for m in self.modules() if type(m) is Linear)
        if self.lm_head is None:  # tied: a packed copy of the embedding, where oneDNN runs
            head = pack_linear_weight(self.embed_tokens.weight)
            if head is not None:
                with torch.device("meta"):  # no storage: the weight is dropped at once
                    self.lm_head = Linear(self.config.hidden_size, self.num_vocab_rows)
                self.lm_head.weight, self.lm_head.packed = None, head
                packed += 1
        return packed

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if not self.tp.is_enabled:
            return self.embed_tokens(input_ids)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_vocab_rows)
        h = F.embedding(local.masked_fill(outside, 0), self.embed_tokens.weight)
        return self.tp.all_reduce(h.masked_fill(outside.unsqueeze(-1), 0.0))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """[num_rows, hidden] -> float32 logits [num_rows, vocab_size] (None on ranks > 0)."""
        if self.lm_head is None:
            logits = F.linear(hidden, self.embed_tokens.weight).float()
        else:
            logits = self.lm_head(hidden).float()
        if not self.tp.is_enabled:
            return logits
        if logits.shape[-1] < self.num_vocab_rows:  # an INT4 head sliced to the true vocab
            logits = F.pad(logits, (0, self.num_vocab_rows - logits.shape[-1]))
        gathered = self.tp.gather_last_dim(logits)
        return None if gathered is None else gathered[:, : self.config.vocab_size]

    def tp_slices(self) -> dict[str, tuple[int, int, int]]:
        """Checkpoint module leaf -> (dim, start, length) of this rank's slice of its weight.

        dim 0 splits outputs (column-parallel), dim 1 inputs (row-parallel); a module not
        listed is replicated. Vocabulary slices may run past the vocabulary (padding).
        """
        cfg, tp = self.config, self.tp
        if not tp.is_enabled:
            return {}
        q_size = self.num_local_heads * cfg.head_dim
        kv_size = self.num_local_kv_heads * cfg.head_dim
        q_start = tp.rank * q_size
        kv_start = tp.rank * cfg.num_key_value_heads // tp.world_size * cfg.head_dim
        width = self.local_intermediate_size
        vocab = (0, self.vocab_start, self.num_vocab_rows)
        return {
            "q_proj": (0, q_start, q_size),
            "k_proj": (0, kv_start, kv_size),
            "v_proj": (0, kv_start, kv_size),
            "o_proj": (1, q_start, q_size),
            "gate_proj": (0, tp.rank * width, width),
            "up_proj": (0, tp.rank * width, width),
            "down_proj": (1, tp.rank * width, width),
            "embed_tokens": vocab,
            "lm_head": vocab,
        }

    def shard_int4(self, hf_module: str, weight):
        """This rank's slice of a checkpoint module's ``Int4Weight`` (narrowed on group
        boundaries; ``ValueError`` from the weight when a slice would cut a group)."""
        spec = self.tp_slices().get(hf_module.rpartition(".")[2])
        if spec is None:
            return weight
        dim, start, length = spec
        if dim == 1:
            return weight.narrow_k(start, length)
        length = max(0, min(length, weight.out_features - start))
        return weight.narrow_n(start, length)

    def _shard_tensor(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's slice of checkpoint tensor ``name`` (engine name, no ``model.``)."""
        module, _, kind = name.rpartition(".")
        spec = self.tp_slices().get(module.rpartition(".")[2])
        if spec is None:
            return tensor
        dim, start, length = spec
        if dim == 1 and kind == "bias":  # added once after the all-reduce: rank 0 holds it
            return tensor if self.tp.rank == 0 else torch.zeros_like(tensor)
        length = max(0, min(length, tensor.shape[dim] - start))
        return tensor.narrow(dim, start, length)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors (Hugging Face names) into the fused parameters.

        Returns the names of parameters that were loaded; raises ``ValueError`` for a
        checkpoint tensor this model has no place for, or parameters left unloaded.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        q = self.num_local_heads * self.config.head_dim
        kv = self.num_local_kv_heads * self.config.head_dim
        width = self.local_intermediate_size
        shard_offsets = {
            "q_proj": ("qkv_proj", 0, q),
            "k_proj": ("qkv_proj", q, kv),
            "v_proj": ("qkv_proj", q + kv, kv),
            "gate_proj": ("gate_up_proj", 0, width),
            "up_proj": ("gate_up_proj", width, width),
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
            tensor = self._shard_tensor(name, tensor)
            if name in ("embed_tokens.weight", "lm_head.weight") and self.tp.is_enabled:
                dest[tensor.shape[0] :].zero_()  # vocabulary padding of the last rank
                dest = dest[: tensor.shape[0]]
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
