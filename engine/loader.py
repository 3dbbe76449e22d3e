"""Model files: config, generation config, tokenizer and weights from a HF directory or a GGUF.

``load_model_files(path)`` reads everything but the weights up front; ``ModelFiles.weights()``
then streams tensors one at a time under Hugging Face names, so a model can be built layer by
layer without holding a second copy of the checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.loaders.hf import load_hf_parts
from engine.tokenizer import Tokenizer


@dataclass
class ModelFiles:
    """What a model is made of, read from disk.

    ``hf_config`` uses config.json key names (for GGUF, built from the metadata) and always has
    ``rope_theta``, ``rope_scaling`` (None or a dict with ``rope_type``), ``head_dim``,
    ``num_key_value_heads``, ``tie_word_embeddings`` and ``torch_dtype``.
    ``generation_config`` is generation_config.json (``{}`` when absent, always for GGUF).
    ``quantization_config`` is config.json's ``quantization_config`` or quantize_config.json,
    None for GGUF. ``source`` is ``"hf"`` or ``"gguf"``.
    """

    hf_config: dict[str, Any]
    generation_config: dict[str, Any]
    tokenizer: Tokenizer
    quantization_config: dict[str, Any] | None
    source: str
    path: Path
    _weights: Any = field(repr=False, default=None)

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(hf_name, tensor)`` lazily, one tensor at a time.

        Names are HF's (``model.embed_tokens.weight``, ``model.layers.N.self_attn.q_proj.weight``,
        ..., ``model.norm.weight``, ``lm_head.weight``). A tied model has no ``lm_head.weight``:
        use the embedding. HF tensors keep their stored dtype; GGUF tensors are dequantized to
        float32 with llama.cpp's q/k row permutation undone.
        """
        return self._weights.weights()

    def gguf_tensors(self) -> Iterator[tuple[str, str, np.ndarray, tuple[int, ...]]]:
        """GGUF only: yield ``(hf_name, ggml type name, raw numpy data, HF shape)`` undequantized.

        Raises ``ValueError`` for a HF directory.
        """
        if self.source != "gguf":
            raise ValueError(f"gguf_tensors() needs a GGUF model, this one is {self.source!r}")
        return self._weights.gguf_tensors()


def _load_hf_dir(path: Path) -> ModelFiles:
    parts = load_hf_parts(path)
    generation_config = parts["generation_config"]
    if "eos_token_id" not in generation_config:
        # As transformers does without generation_config.json: config.json's eos ends generation.
        generation_config = {"eos_token_id": parts["hf_config"].get("eos_token_id")}
    tokenizer = Tokenizer.from_hf_dir(path, generation_config=generation_config)
    return ModelFiles(
        hf_config=parts["hf_config"],
        generation_config=parts["generation_config"],
        tokenizer=tokenizer,
        quantization_config=parts["quantization_config"],
        source="hf",
        path=path,
        _weights=parts["weights"],
    )


def _load_gguf(path: Path) -> ModelFiles:
    from engine.loaders.gguf_meta import gguf_value, hf_config_from_gguf, open_gguf
    from engine.loaders.gguf_weights import GGUFWeights

    reader = open_gguf(path)
    hf_config = hf_config_from_gguf(reader)
    arch = gguf_value(reader, "general.architecture")
    return ModelFiles(
        hf_config=hf_config,
        generation_config={},
        tokenizer=Tokenizer.from_gguf(reader),
        quantization_config=None,
        source="gguf",
        path=path,
        _weights=GGUFWeights(reader, hf_config, arch),
    )


def load_model_files(path: str | Path | None) -> ModelFiles:
    """Open a model: ``None`` for the default model, a directory (HF) or a ``*.gguf`` file.

    Raises ``FileNotFoundError`` when the path or a required file is missing and ``ValueError``
    when the path is neither a directory nor a ``.gguf`` file, or the model is unsupported.
    """
    if path is None:
        from engine.default_model import default_model_path

        path = default_model_path()
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model path {path} does not exist; pass a Hugging Face model directory or a .gguf file"
        )
    if path.is_dir():
        return _load_hf_dir(path)
    if path.suffix.lower() == ".gguf":
        return _load_gguf(path)
    raise ValueError(
        f"model path {path} is neither a directory nor a .gguf file; pass a Hugging Face model "
        "directory (config.json, *.safetensors, tokenizer.json) or a .gguf file"
    )
