"""Write a quantized model as a Hugging Face GPTQ checkpoint ("v1" format, 4 bits).

Per quantized module (HF names, fused modules split back into q/k/v and gate/up):
``qweight`` int32 [K/8, N] packed along K, ``qzeros`` int32 [G, N/8] packed along N holding
zero - 1, ``scales`` fp16 [G, N], ``g_idx`` int32 [K]. Everything else is fp16. config.json
carries the ``quantization_config`` that transformers' GPTQ integration and the engine read.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.quant.gptq_format import pack_along_cols, pack_along_rows
from engine.quant.rtn import QuantizedWeight

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
)


def _split_sizes(model) -> dict[str, list[tuple[str, int]]]:
    cfg = model.config
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    return {
        "qkv_proj": [("q_proj", q), ("k_proj", kv), ("v_proj", kv)],
        "gate_up_proj": [("gate_proj", cfg.intermediate_size), ("up_proj", cfg.intermediate_size)],
    }


def gptq_tensors(q: QuantizedWeight) -> dict[str, torch.Tensor]:
    """One module's GPTQ v1 tensors from a QuantizedWeight ([N, K] codes)."""
    n = q.codes.shape[0]
    if n % 8:
        raise ValueError(
            f"GPTQ packs zeros 8 per int32: out_features must be a multiple of 8, got {n}"
        )
    if int(q.zeros.min()) < 1:
        raise ValueError("GPTQ v1 stores zero - 1: zero points must be >= 1")
    return {
        "qweight": pack_along_rows(q.codes.t().contiguous()),
        "qzeros": pack_along_cols(q.zeros - 1),
        "scales": q.scales.half(),
        "g_idx": q.g_idx.to(torch.int32),
    }


def _slice(q: QuantizedWeight, start: int, size: int) -> QuantizedWeight:
    return QuantizedWeight(
        q.codes[start : start + size],
        q.scales[:, start : start + size],
        q.zeros[:, start : start + size],
        q.g_idx,
        q.group_size,
    )


def write_gptq_checkpoint(
    out_dir: str | Path,
    model,
    quantized: dict[str, QuantizedWeight],
    hf_config: dict,
    tokenizer,
    source_dir: Path | None,
    act_order: bool,
    sym: bool,
    damp_percent: float = 0.01,
) -> Path:
    """Write model.safetensors, config.json and the tokenizer files into out_dir.

    quantized: {"layers.N.self_attn.qkv_proj": QuantizedWeight, ...} (engine module paths).
    Tokenizer files are copied from source_dir when it is a HF directory, else written from
    ``tokenizer`` (an engine Tokenizer, e.g. built from a GGUF vocabulary).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    splits = _split_sizes(model)
    tensors: dict[str, torch.Tensor] = {}
    group_sizes = {q.group_size for q in quantized.values()}
    for path, q in quantized.items():
        parent, _, leaf = path.rpartition(".")
        bias = model.get_submodule(path).bias
        start = 0
        for hf_leaf, size in splits.get(leaf, [(leaf, q.codes.shape[0])]):
            prefix = f"model.{parent}.{hf_leaf}"
            for suffix, t in gptq_tensors(_slice(q, start, size)).items():
                tensors[f"{prefix}.{suffix}"] = t.clone()
            if bias is not None:
                tensors[f"{prefix}.bias"] = bias.data[start : start + size].half().contiguous()
            start += size
    quantized_params = {f"{p}.weight" for p in quantized} | {f"{p}.bias" for p in quantized}
    for name, param in model.named_parameters():
        if name in quantized_params:
            continue
        hf_name = name if name.startswith("lm_head") else f"model.{name}"
        tensors[hf_name] = param.data.half().contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    group_size = group_sizes.pop() if len(group_sizes) == 1 else None
    k_values = {q.codes.shape[1] for q in quantized.values()}
    config = dict(hf_config)
    config["torch_dtype"] = config["dtype"] = "float16"
    config["quantization_config"] = {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": -1 if group_size in k_values and len(k_values) == 1 else group_size,
        "desc_act": act_order,
        "sym": sym,
        "checkpoint_format": "gptq",
        "damp_percent": damp_percent,
        "true_sequential": True,  # what quantize_model does by default
        "static_groups": False,
        "tool": "tidal quantize",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if source_dir is not None and source_dir.is_dir():
        for name in TOKENIZER_FILES:
            if (source_dir / name).is_file():
                shutil.copy(source_dir / name, out / name)
    else:
        save_tokenizer(tokenizer, out)
    return out


def save_tokenizer(tokenizer, out_dir: str | Path) -> None:
    """Write an engine Tokenizer as tokenizer.json + tokenizer_config.json (special tokens,
    chat template), which ``Tokenizer.from_hf_dir`` reads back."""
    out = Path(out_dir)
    tokenizer.backend.save(str(out / "tokenizer.json"))
    names = ("bos_token", "eos_token", "pad_token", "unk_token")
    config = {name: getattr(tokenizer, name) for name in names if getattr(tokenizer, name)}
    if tokenizer.chat_template:
        config["chat_template"] = tokenizer.chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
