"""The engine's INT4 load hook: GGUF Q4_1 kept packed, and AWQ checkpoints, each against the
dense model holding the same values."""

from __future__ import annotations

import json

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from engine.loader import load_model_files
from engine.models.config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.quant.calibration import LINEAR_SITES, sequence_logits
from engine.quant.int4_linear import Int4Linear
from engine.quant.loading import _load_gguf_q4_1


def test_default_gguf_q4_1_packed_equals_dequantized():
    files = load_model_files(None)
    config = ModelConfig.from_hf_config(files.hf_config)
    dense = LlamaForCausalLM(config).float().eval()
    dense.load_weights(files.weights())
    packed = LlamaForCausalLM(config).float().eval()
    _load_gguf_q4_1(packed, files, torch.device("cpu"), torch.float32)
    for layer in packed.layers:
        for site in LINEAR_SITES:
            assert isinstance(layer.get_submodule(site), Int4Linear)
    ids = torch.tensor(files.tokenizer.encode("The quick brown fox jumps over", False))
    torch.testing.assert_close(
        sequence_logits(packed, ids), sequence_logits(dense, ids), rtol=1e-4, atol=1e-4
    )


def pack_awq(codes: np.ndarray) -> torch.Tensor:
    """[R, C] codes -> int32 [R, C/8]: nibble slot i of word c holds column 8c + ORDER[i]."""
    order = (0, 2, 4, 6, 1, 3, 5, 7)
    r, c = codes.shape
    out = np.zeros((r, c // 8), dtype=np.uint32)
    for col in range(c // 8):
        for i in range(8):
            out[:, col] |= codes[:, 8 * col + order[i]].astype(np.uint32) << np.uint32(4 * i)
    return torch.from_numpy(out.view(np.int32))


def test_awq_checkpoint_loads_and_generates(tiny_llama_dir, tmp_path):
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    group = 32
    rng = np.random.default_rng(0)
    tensors = load_file(str(tiny_llama_dir / "model.safetensors"))
    awq, dense = {}, {}
    for name, t in tensors.items():
        if not name.endswith("proj.weight"):
            awq[name] = dense[name] = t
            continue
        n, k = t.shape
        codes = rng.integers(0, 16, (k, n))
        zeros = rng.integers(0, 16, (k // group, n))
        scales = (rng.random((k // group, n)) * 0.05 + 0.01).astype(np.float16)
        base = name.removesuffix(".weight")
        awq[base + ".qweight"] = pack_awq(codes)
        awq[base + ".qzeros"] = pack_awq(zeros)
        awq[base + ".scales"] = torch.from_numpy(scales)
        g = np.arange(k) // group  # AWQ: w = (q - z) * s
        dense[name] = torch.from_numpy((scales.astype(np.float32)[g] * (codes - zeros[g])).T)
    out = tmp_path / "awq"
    out.mkdir()
    save_file({k: v.contiguous() for k, v in awq.items()}, str(out / "model.safetensors"))
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group,
        "zero_point": True,
        "version": "gemm",
    }
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((tiny_llama_dir / name).read_bytes())

    llm = LLM(str(out), kv_cache_memory_bytes=1 << 24)
    assert llm.engine.weight_format == "awq"
    ref = LlamaForCausalLM(ModelConfig.from_hf_config(config)).float().eval()
    ref.load_weights(dense.items())
    prompt = llm.get_tokenizer().encode("Life, Liberty and", add_special_tokens=False)
    got = llm.generate(prompt, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    ids = list(prompt)
    for _ in range(6):
        ids.append(int(sequence_logits(ref, torch.tensor(ids))[-1].argmax()))
    assert list(got[0].outputs[0].token_ids) == ids[len(prompt) :]
