"""Load-time hook: put INT4 checkpoints (GPTQ, AWQ) and GGUF Q4_1 weights into Int4Linear.

``load_weights(model, files, device, dtype)`` replaces ``model.load_weights(files.weights())``:

- a Hugging Face directory with a GPTQ or AWQ ``quantization_config``: every quantized
  module's ``qweight``/``qzeros``/``scales``(/``g_idx``) is converted to the canonical form,
  fused modules (``qkv_proj``, ``gate_up_proj``) concatenated along N, and the model's
  ``Linear`` swapped for ``Int4Linear`` (Triton kernel on CUDA, reference on CPU);
- a GGUF file on CUDA: Q4_1 linear weights stay packed (``Int4Linear``, no dequantization);
- anything else: the model's own dense loading.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import torch

from engine.quant.awq_format import awq_to_int4
from engine.quant.gguf_q4_1 import q4_1_to_int4
from engine.quant.gptq_format import gptq_to_int4
from engine.quant.int4_linear import Int4Linear
from kernels.int4_gemm import Int4Weight, dequantize_int4

QUANT_METHODS = ("gptq", "awq")
_SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")


def quant_method(quantization_config: dict[str, Any] | None) -> str | None:
    """``"gptq"``, ``"awq"`` or None (dense); ``ValueError`` for what we cannot run."""
    if not quantization_config:
        return None
    method = str(quantization_config.get("quant_method", "gptq")).lower()
    bits = quantization_config.get("bits", quantization_config.get("w_bit", 4))
    if method not in QUANT_METHODS:
        raise ValueError(f"quant_method {method!r} is not supported; supported: {QUANT_METHODS}")
    if bits != 4:
        raise ValueError(f"only 4-bit {method} checkpoints are supported, this one has {bits}")
    if method == "awq" and str(quantization_config.get("version", "gemm")).lower() != "gemm":
        raise ValueError("only AWQ's GEMM packing is supported (quantization_config.version)")
    return method


def _linear_sites(model: torch.nn.Module):
    """(module path, parent module, attribute, HF module names in output order) per Linear."""
    from engine.models.llama import Linear

    packed = getattr(model, "packed_modules", {})
    for path, module in list(model.named_modules()):
        if not isinstance(module, Linear):
            continue
        parent_path, _, leaf = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        prefix = f"model.{parent_path}." if parent_path else ""
        hf_names = [prefix + part for part in packed.get(leaf, [leaf])]
        yield path, parent, leaf, hf_names


def _swap(model, converted: dict[str, Int4Weight], device, dtype) -> int:
    num_swapped = 0
    for path, parent, leaf, hf_names in _linear_sites(model):
        present = [name in converted for name in hf_names]
        if not any(present):
            continue
        if not all(present):
            raise ValueError(f"{path} fuses {hf_names}, but only some of them are quantized")
        old = getattr(parent, leaf)
        # Tensor parallelism: the model keeps only its rank's slice (groups kept whole).
        shard = getattr(model, "shard_int4", lambda _name, weight: weight)
        parts = [shard(name, converted.pop(name)).to(device) for name in hf_names]
        setattr(parent, leaf, Int4Linear(parts, has_bias=old.bias is not None, bias_dtype=dtype))
        num_swapped += 1
    if converted:
        raise ValueError(f"quantized tensors with no place in the model: {sorted(converted)[:4]}")
    return num_swapped


def _load_hf_int4(model, files, method: str, device, dtype) -> None:
    qcfg = files.quantization_config
    checkpoint_format = str(qcfg.get("checkpoint_format", "gptq")).lower()
    groups: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    dense = []
    for name, tensor in files.weights():
        base, _, suffix = name.rpartition(".")
        if suffix in _SUFFIXES:
            groups[base][suffix] = tensor
        else:
            dense.append((name, tensor))
    converted = {}
    for base, t in groups.items():
        if "qweight" not in t or "scales" not in t:
            raise ValueError(f"{base} lacks qweight or scales in this {method} checkpoint")
        if method == "gptq":
            converted[base] = gptq_to_int4(
                t["qweight"],
                t.get("qzeros"),
                t["scales"],
                t.get("g_idx"),
                checkpoint_format=checkpoint_format,
                group_size=qcfg.get("group_size"),
                dtype=dtype,
            )
        else:
            converted[base] = awq_to_int4(t["qweight"], t["qzeros"], t["scales"], dtype=dtype)
    _swap(model, converted, device, dtype)
    model.load_weights(dense)


def _load_gguf_q4_1(model, files, device, dtype) -> None:
    import gguf  # only GGUF models need it

    linear_names = {n for _, _, _, names in _linear_sites(model) for n in names}
    converted, dense = {}, []
    for name, type_name, data, shape in files.gguf_tensors():
        base = name.removesuffix(".weight")
        if type_name == "Q4_1" and base in linear_names and len(shape) == 2:
            converted[base] = q4_1_to_int4(data, shape, dtype=dtype)
            continue
        values = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[type_name])
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(shape).copy()
        dense.append((name, torch.from_numpy(values)))
    # A fused module whose parts are not all Q4_1 stays dense: dequantize its Q4_1 parts.
    for _path, _parent, _leaf, hf_names in _linear_sites(model):
        present = [n in converted for n in hf_names]
        if any(present) and not all(present):
            for n in hf_names:
                if n in converted:
                    dense.append((n + ".weight", dequantize_int4(converted.pop(n))))
    _swap(model, converted, device, dtype)
    model.load_weights(dense)


def load_weights(model: torch.nn.Module, files, device: torch.device, dtype: torch.dtype) -> str:
    """Fill ``model`` from ``files`` (``engine.loader.ModelFiles``); returns how:
    ``"gptq"``, ``"awq"``, ``"gguf-q4_1"`` or ``"dense"``. May replace Linear modules."""
    method = quant_method(files.quantization_config)
    if method is not None:
        _load_hf_int4(model, files, method, device, dtype)
        return method
    if files.source == "gguf" and device.type == "cuda":
        _load_gguf_q4_1(model, files, device, dtype)
        return "gguf-q4_1"
    model.load_weights(files.weights())
    return "dense"
