"""The engine's models against Hugging Face transformers on the same weights (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.models.llama import Linear
from tests.engine.conftest import save_tiny_model

CASES = {
    "llama-gqa-untied-llama3rope": (
        "llama",
        dict(
            tie_word_embeddings=False,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            rope_theta=500000.0,
        ),
    ),
    "llama-tied-mha": ("llama", dict(tie_word_embeddings=True, num_key_value_heads=4)),
    "llama-linear-rope": ("llama", dict(rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "qwen2-bias": ("qwen2", dict(tie_word_embeddings=False)),
    "mistral-sliding-window": ("mistral", dict(sliding_window=8, head_dim=16)),
}

PROMPTS = [
    [5, 17, 300, 2048, 77, 9, 1000],
    [12, 13] * 9 + [401],
    [900],
    list(range(1000, 1040)),
]


def hf_greedy(model, prompt: list[int], num_steps: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = []
    with torch.no_grad():
        for _ in range(num_steps):
            nxt = int(model(ids).logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


@pytest.fixture(scope="module", params=sorted(CASES))
def tiny(request, tmp_path_factory, default_tokenizer_dir):
    kind, overrides = CASES[request.param]
    out = tmp_path_factory.mktemp(request.param)
    hf_model = save_tiny_model(kind, out, default_tokenizer_dir, **overrides)
    llm = LLM(
        model=str(out), dtype="float32", device="cpu", block_size=4, kv_cache_memory_bytes=4 << 20
    )
    return hf_model, llm


def engine_logits(llm: LLM, prompt: list[int]) -> torch.Tensor:
    """Logits at every prompt position from one flattened engine forward pass."""
    engine = llm.engine
    engine.add_request("logits-probe", prompt, SamplingParams(max_tokens=1))
    sched = engine.scheduler.schedule()
    ids, pos, meta, _ = engine.runner.prepare(sched)
    with torch.inference_mode():
        hidden = engine.runner.model(ids, pos, engine.runner.kv_caches, meta, engine.runner.ops)
        logits = engine.runner.model.compute_logits(hidden)
    engine.scheduler.update_after_step(sched)
    engine.abort("logits-probe")
    return logits


def test_cpu_linears_run_on_packed_weights(tiny):
    """On a CPU with oneDNN, every dense linear (the LM head too) runs on a packed weight, so
    the equality tests below cover that path."""
    from kernels.cpu_linear import packed_linear_supported

    if not packed_linear_supported(torch.float32):
        pytest.skip("this PyTorch build has no oneDNN linear")
    _, llm = tiny
    model = llm.engine.runner.model
    linears = [m for m in model.modules() if type(m) is Linear]
    assert model.lm_head is not None and model.lm_head in linears
    assert linears and all(m.packed is not None and m.weight is None for m in linears)


def test_logits_match_transformers(tiny):
    hf_model, llm = tiny
    for prompt in PROMPTS:
        ours = engine_logits(llm, prompt)
        with torch.no_grad():
            ref = hf_model(torch.tensor([prompt])).logits[0].float()
        err = (ours - ref).abs().max().item()
        assert err < 1e-3 * max(1.0, ref.abs().max().item()), f"prompt {prompt[:4]}: max err {err}"


def test_greedy_32_steps_identical_to_transformers(tiny):
    hf_model, llm = tiny
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(hf_model, prompt, 32), f"prompt {prompt[:4]}"
