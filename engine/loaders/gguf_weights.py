"""GGUF tensors under Hugging Face names, dequantized to float32 or left packed.

llama.cpp's converter renames every tensor (``blk.N.attn_q.weight`` for
``model.layers.N.self_attn.q_proj.weight``) and, for the ``llama`` architecture, permutes the
rows of q_proj and k_proj so that rotary embedding pairs are adjacent (GPT-J style) instead of
split in halves (GPT-NeoX style, what HF Llama uses). Both are undone here, as transformers'
``LlamaTensorProcessor`` does. The permutation moves whole rows, so it applies to quantized
payloads as well (a quantization block never crosses a row).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as QType

# Tensor types dequantized at load; the quantized ones go through gguf.quants (numpy).
SUPPORTED_TYPES = frozenset(
    {
        QType.F32,
        QType.F16,
        QType.BF16,
        QType.Q4_0,
        QType.Q4_1,
        QType.Q5_0,
        QType.Q5_1,
        QType.Q8_0,
        QType.Q2_K,
        QType.Q3_K,
        QType.Q4_K,
        QType.Q5_K,
        QType.Q6_K,
    }
)

_TOP_LEVEL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_PER_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_LAYER_NAME = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def hf_name(gguf_name: str) -> str:
    """The Hugging Face name of a GGUF tensor. Raises ``ValueError`` for an unknown tensor."""
    if gguf_name in _TOP_LEVEL:
        return _TOP_LEVEL[gguf_name]
    match = _LAYER_NAME.match(gguf_name)
    if match is None or match.group(2) not in _PER_LAYER:
        raise ValueError(
            f"GGUF tensor {gguf_name!r} has no Hugging Face counterpart here; known: "
            f"{sorted(_TOP_LEVEL)} and blk.N.{{{','.join(_PER_LAYER)}}}.weight/bias"
        )
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_PER_LAYER[part]}.{kind}"


def unpermute_rows(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary row permutation of q_proj / k_proj (weight, bias or payload).

    ``rows`` is ``[num_heads * head_dim, ...]``; within each head llama.cpp interleaved the two
    rotary halves, this puts them back in halves.
    """
    half = rows.shape[0] // num_heads // 2
    grouped = rows.reshape(num_heads, half, 2, *rows.shape[1:])
    return grouped.swapaxes(2, 1).reshape(rows.shape)


class GGUFWeights:
    """Iterates a GGUF file's tensors under HF names; see the module docstring."""

    def __init__(self, reader: gguf.GGUFReader, hf_config: dict[str, Any], arch: str) -> None:
        self.reader = reader
        self.is_rotary_permuted = arch == "llama"
        self.num_heads = hf_config["num_attention_heads"]
        self.num_kv_heads = hf_config["num_key_value_heads"]
        for tensor in reader.tensors:
            hf_name(tensor.name)  # fail at load, not halfway through the weights
            if tensor.tensor_type not in SUPPORTED_TYPES:
                raise ValueError(
                    f"GGUF tensor {tensor.name} has type {tensor.tensor_type.name}, which is "
                    f"not supported; supported: {sorted(t.name for t in SUPPORTED_TYPES)}"
                )

    def _unpermute(self, name: str, rows: np.ndarray) -> np.ndarray:
        if self.is_rotary_permuted and ".attn_q." in name:
            return unpermute_rows(rows, self.num_heads)
        if self.is_rotary_permuted and ".attn_k." in name:
            return unpermute_rows(rows, self.num_kv_heads)
        return rows

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(hf_name, float32 tensor)`` one tensor at a time, in file order."""
        for tensor in self.reader.tensors:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            values = self._unpermute(tensor.name, values.astype(np.float32, copy=False))
            if not values.flags.writeable or not values.flags.c_contiguous:
                # A view of the read-only memory map: torch needs its own writable copy.
                values = np.ascontiguousarray(values).copy()
            yield hf_name(tensor.name), torch.from_numpy(values)

    def gguf_tensors(self) -> Iterator[tuple[str, str, np.ndarray, tuple[int, ...]]]:
        """Yield ``(hf_name, ggml type name, raw data, shape)`` without dequantizing.

        ``raw data`` is the file's payload as numpy (``uint8`` blocks ``[rows, bytes_per_row]``
        for quantized types, the values for F32/F16), rows already un-permuted; ``shape`` is the
        logical HF shape (``[out_features, in_features]`` for a linear weight).
        """
        for tensor in self.reader.tensors:
            shape = tuple(int(dim) for dim in reversed(tensor.shape.tolist()))
            data = self._unpermute(tensor.name, np.asarray(tensor.data))
            yield hf_name(tensor.name), tensor.tensor_type.name, data, shape
