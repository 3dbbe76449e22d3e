"""A Hugging Face model directory: config.json, safetensors shards, generation config."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

INDEX_FILE = "model.safetensors.index.json"


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; ``{}`` when the file does not exist."""
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as file:
        value = json.load(file)
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(value).__name__}")
    return value


def normalize_hf_config(config: dict[str, Any]) -> dict[str, Any]:
    """Fill the keys the engine reads, whichever transformers version wrote config.json.

    transformers >= 5 writes ``rope_parameters`` (with ``rope_theta`` inside) and ``dtype``;
    older configs have ``rope_theta``, ``rope_scaling`` (``type`` or ``rope_type``) and
    ``torch_dtype``. Both spellings end up present. Also defaults ``num_key_value_heads``
    (= heads), ``head_dim`` (= hidden / heads) and ``tie_word_embeddings`` (False, as for
    Llama, Mistral and Qwen2). Returns a new dict.
    """
    config = dict(config)
    rope_parameters = config.get("rope_parameters")
    if isinstance(rope_parameters, dict):
        config.setdefault("rope_theta", rope_parameters.get("rope_theta"))
        if "rope_scaling" not in config:
            is_default = rope_parameters.get("rope_type", "default") == "default"
            config["rope_scaling"] = None if is_default else dict(rope_parameters)
    config.setdefault("rope_theta", 10000.0)
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict):
        scaling = dict(scaling)
        kind = scaling.get("rope_type", scaling.get("type"))
        scaling["rope_type"] = scaling["type"] = kind
        config["rope_scaling"] = None if kind == "default" else scaling
    else:
        config["rope_scaling"] = None
    config.setdefault("torch_dtype", config.get("dtype"))
    if "num_attention_heads" in config:
        config.setdefault("num_key_value_heads", config["num_attention_heads"])
        if config.get("head_dim") is None and "hidden_size" in config:
            config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    config.setdefault("tie_word_embeddings", False)
    return config


def safetensors_files(path: Path) -> list[Path]:
    """The weight files of a model directory: those the shard index names, else *.safetensors.

    Raises ``FileNotFoundError`` naming what is missing.
    """
    index_file = path / INDEX_FILE
    if index_file.is_file():
        weight_map = read_json(index_file).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index_file} has no 'weight_map' of tensor name -> shard file")
        files = [path / name for name in sorted(set(weight_map.values()))]
        missing = [file.name for file in files if not file.is_file()]
        if missing:
            raise FileNotFoundError(f"{index_file.name} names shards missing in {path}: {missing}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"no *.safetensors weights in {path} (pytorch_model.bin checkpoints are not "
            "supported; convert them to safetensors)"
        )
    return files


class HFWeights:
    """Lazily reads the tensors of a directory's safetensors files."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, tensor)`` one tensor at a time, file by file, as stored on disk."""
        for file in self.files:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():
                    yield name, handle.get_tensor(name)


def load_hf_parts(path: Path) -> dict[str, Any]:
    """Read config, generation config, quantization config and the weight file list.

    Raises ``FileNotFoundError`` when config.json or the weights are missing.
    """
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(
            f"{path} has no config.json; a model directory needs config.json, *.safetensors "
            "and tokenizer.json"
        )
    hf_config = normalize_hf_config(read_json(config_file))
    quantization_config = hf_config.get("quantization_config") or read_json(
        path / "quantize_config.json"
    )
    return {
        "hf_config": hf_config,
        "generation_config": read_json(path / "generation_config.json"),
        "quantization_config": quantization_config or None,
        "weights": HFWeights(safetensors_files(path)),
    }
