"""GGUF metadata: reading values and turning them into a Hugging Face config dict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

# general.architecture -> (HF model_type, HF architecture class). Mistral files converted by
# llama.cpp usually say "llama"; their weights are Llama-compatible.
GGUF_ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "mistral": ("mistral", "MistralForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
}

_MISSING = object()


class _PlainArrayGGUFReader(gguf.GGUFReader):
    """``gguf.GGUFReader`` over a plain ndarray view of its memory map.

    The reader slices its ``np.memmap`` once per metadata value (about 250,000 times for a
    49k-token vocabulary) and every slice of a memmap subclass pays for ``__array_finalize__``;
    a base-class view of the same mapping parses about 3x faster and is still zero-copy.
    """

    @property  # type: ignore[override]  # a plain view where the base class has a memmap
    def data(self) -> np.ndarray:
        return self._plain_data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._plain_data = np.asarray(value)


def open_gguf(path: str | Path) -> gguf.GGUFReader:
    """Open a GGUF file read-only (memory-mapped). Raises ``ValueError`` if it is not GGUF."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    try:
        return _PlainArrayGGUFReader(path, "r")
    except ValueError as exc:
        raise ValueError(f"{path} is not a readable GGUF file: {exc}") from exc


def gguf_value(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    """The value of metadata ``key`` (str, int, float, bool or a list of them), or ``default``."""
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def _required(reader: gguf.GGUFReader, key: str) -> Any:
    value = gguf_value(reader, key, _MISSING)
    if value is _MISSING:
        raise ValueError(f"the GGUF file lacks the metadata key {key!r}")
    return value


def _rope_scaling(reader: gguf.GGUFReader, arch: str) -> dict[str, Any] | None:
    kind = gguf_value(reader, f"{arch}.rope.scaling.type")
    factor = gguf_value(reader, f"{arch}.rope.scaling.factor")
    if kind in (None, "none") or factor is None:
        return None
    scaling: dict[str, Any] = {"rope_type": kind, "type": kind, "factor": float(factor)}
    original = gguf_value(reader, f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling


def hf_config_from_gguf(reader: gguf.GGUFReader) -> dict[str, Any]:
    """A config.json-like dict (HF key names) from the GGUF metadata.

    ``tie_word_embeddings`` is true when the file has no ``output.weight``. ``torch_dtype`` is
    ``float32``: the weights are dequantized to it. Raises ``ValueError`` for an architecture
    other than those in ``GGUF_ARCHITECTURES`` or missing metadata.
    """
    arch = _required(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; supported: {sorted(GGUF_ARCHITECTURES)}"
        )
    model_type, architecture = GGUF_ARCHITECTURES[arch]
    hidden_size = int(_required(reader, f"{arch}.embedding_length"))
    num_heads = int(_required(reader, f"{arch}.attention.head_count"))
    num_kv_heads = int(gguf_value(reader, f"{arch}.attention.head_count_kv", num_heads))
    head_dim = gguf_value(reader, f"{arch}.attention.key_length")
    if head_dim is None:
        head_dim = gguf_value(reader, f"{arch}.rope.dimension_count", hidden_size // num_heads)
    vocab_size = gguf_value(reader, f"{arch}.vocab_size")
    if vocab_size is None:
        vocab_size = len(_required(reader, "tokenizer.ggml.tokens"))
    tensor_names = {tensor.name for tensor in reader.tensors}
    if "rope_freqs.weight" in tensor_names:
        raise ValueError(
            "this GGUF carries rope_freqs.weight (Llama 3.1-style rope scaling as per-dimension "
            "factors), which is not supported; load the Hugging Face directory instead"
        )
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": int(vocab_size),
        "hidden_size": hidden_size,
        "intermediate_size": int(_required(reader, f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(_required(reader, f"{arch}.block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": int(head_dim),
        "rms_norm_eps": float(_required(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(gguf_value(reader, f"{arch}.rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(reader, arch),
        "max_position_embeddings": int(_required(reader, f"{arch}.context_length")),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "hidden_act": "silu",
        "bos_token_id": gguf_value(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": gguf_value(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": gguf_value(reader, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }
