"""INT4 on CUDA: a GPTQ checkpoint runs through the engine on the Triton kernel."""

from __future__ import annotations

import pytest


@pytest.mark.gpu
def test_gptq_checkpoint_on_cuda_matches_cpu(tiny_llama_dir, tmp_path):
    from engine.llm import LLM
    from engine.quant.int4_linear import Int4Linear
    from engine.quant.quantize import quantize_checkpoint
    from engine.sampling_params import SamplingParams

    out = quantize_checkpoint(tiny_llama_dir, tmp_path / "out", group_size=32, act_order=True)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    tokens = {}
    for device in ("cpu", "cuda"):
        llm = LLM(str(out), device=device, dtype="float32", kv_cache_memory_bytes=1 << 24)
        assert llm.engine.weight_format == "gptq"
        module = llm.engine.runner.model.layers[0].mlp.down_proj
        assert isinstance(module, Int4Linear) and module.parts[0].qweight.device.type == device
        outs = llm.generate(["We hold these truths", "When in the Course"], params)
        tokens[device] = [list(o.outputs[0].token_ids) for o in outs]
    assert tokens["cuda"] == tokens["cpu"]
