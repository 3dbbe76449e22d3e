"""GPTQ and RTN on a tiny model: the calibration forward against transformers, GPTQ's layer
error against RTN's, and quantize -> save (GPTQ format) -> load in the engine -> generate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from engine.quant.calibration import LINEAR_SITES, layer_forward, sequence_logits
from engine.quant.gptq import gptq_quantize
from engine.quant.quantize import load_dense_model, quantize_checkpoint
from engine.quant.rtn import rtn_quantize

DATA = Path(__file__).resolve().parents[1] / "data"


def test_calibration_forward_matches_transformers(tiny_llama_dir):
    import transformers

    model, _ = load_dense_model(tiny_llama_dir)
    hf = transformers.LlamaForCausalLM.from_pretrained(tiny_llama_dir).eval()
    ids = torch.randint(0, 512, (23,), generator=torch.Generator().manual_seed(1))
    ours = sequence_logits(model, ids)
    with torch.no_grad():
        theirs = hf(ids[None]).logits[0].float()
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("group_size,act_order", [(32, False), (32, True), (-1, False)])
def test_gptq_layer_error_below_rtn(tiny_llama_dir, group_size, act_order):
    model, files = load_dense_model(tiny_llama_dir)
    text = (DATA / "declaration_of_independence.txt").read_text()
    ids = torch.tensor(files.tokenizer.encode(text, add_special_tokens=False)[:256])
    inputs: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():
        h = layer_forward(
            model,
            model.layers[0],
            model.embed_tokens(ids),
            lambda site, x: inputs.setdefault(site, []).append(x.clone()),
        )
        layer_forward(
            model,
            model.layers[1],
            h,
            lambda site, x: inputs.setdefault("1." + site, []).append(x.clone()),
        )
    for site, xs in inputs.items():
        layer = model.layers[1] if site.startswith("1.") else model.layers[0]
        weight = layer.get_submodule(site.removeprefix("1.")).weight.data
        x = torch.cat(xs).double()
        errors = {}
        for name, q in (
            ("rtn", rtn_quantize(weight, group_size)),
            ("gptq", gptq_quantize(weight, x.t() @ x, group_size, act_order)),
        ):
            errors[name] = float(((x @ (weight.double() - q.dequantize().double()).t()) ** 2).sum())
        assert errors["gptq"] < errors["rtn"], f"{site}: {errors}"


def dequantize_gptq_file(path: Path) -> dict[str, torch.Tensor]:
    """Read a GPTQ v1 checkpoint as the format describes it, independently of engine.quant:
    qweight [K/8, N] (row k in bits 4*(k%8)), qzeros [G, N/8] holding zero - 1, fp16 scales,
    g_idx; w[k, n] = scale[g, n] * (q[k, n] - zero[g, n]) with g = g_idx[k]."""
    out = {}
    with safe_open(str(path), framework="pt") as f:
        names = list(f.keys())
        for name in names:
            if not name.endswith(".qweight"):
                if not any(name.endswith(s) for s in (".qzeros", ".scales", ".g_idx")):
                    out[name] = f.get_tensor(name).float()
                continue
            base = name.removesuffix(".qweight")
            qweight = f.get_tensor(name).numpy().view(np.uint32)
            qzeros = f.get_tensor(base + ".qzeros").numpy().view(np.uint32)
            scales = f.get_tensor(base + ".scales").float().numpy()
            g_idx = f.get_tensor(base + ".g_idx").numpy()
            k = qweight.shape[0] * 8
            q = np.stack([(qweight[kk // 8] >> (4 * (kk % 8))) & 15 for kk in range(k)])
            n = scales.shape[1]
            z = np.stack([(qzeros[:, c // 8] >> (4 * (c % 8))) & 15 for c in range(n)], 1) + 1
            w = scales[g_idx] * (q.astype(np.float32) - z[g_idx])
            out[base + ".weight"] = torch.from_numpy(w.T.copy())
    return out


def greedy(model, ids: list[int], num_tokens: int) -> list[int]:
    ids = list(ids)
    for _ in range(num_tokens):
        ids.append(int(sequence_logits(model, torch.tensor(ids))[-1].argmax()))
    return ids[-num_tokens:]


@pytest.mark.parametrize("method,act_order", [("gptq", True), ("rtn", False)])
def test_quantize_save_load_generate(tiny_llama_dir, tmp_path, method, act_order):
    from engine.llm import LLM
    from engine.models.config import ModelConfig
    from engine.models.llama import LlamaForCausalLM
    from engine.quant.int4_linear import Int4Linear
    from engine.sampling_params import SamplingParams

    calibration = tmp_path / "calibration.jsonl"
    text = (DATA / "declaration_of_independence.txt").read_text()
    calibration.write_text("\n".join(json.dumps({"text": p}) for p in text.split("\n\n")))
    out = quantize_checkpoint(
        tiny_llama_dir,
        tmp_path / "out",
        method=method,
        group_size=32,
        act_order=act_order,
        calibration=calibration,
    )
    config = json.loads((out / "config.json").read_text())
    qcfg = config["quantization_config"]
    assert (qcfg["quant_method"], qcfg["bits"], qcfg["group_size"], qcfg["desc_act"]) == (
        "gptq",
        4,
        32,
        act_order,
    )
    assert qcfg["checkpoint_format"] == "gptq"

    # Reference: a dense model holding the checkpoint's weights as the GPTQ format defines them.
    ref = LlamaForCausalLM(ModelConfig.from_hf_config(config)).float().eval()
    ref.load_weights(dequantize_gptq_file(out / "model.safetensors").items())

    llm = LLM(str(out), kv_cache_memory_bytes=1 << 24)
    assert llm.engine.weight_format == "gptq"
    for layer in llm.engine.runner.model.layers:
        for site in LINEAR_SITES:
            assert isinstance(layer.get_submodule(site), Int4Linear)
    prompt = llm.get_tokenizer().encode("We hold these truths", add_special_tokens=False)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    got = llm.generate(prompt, params)[0].outputs[0].token_ids
    assert list(got) == greedy(ref, prompt, 8)
