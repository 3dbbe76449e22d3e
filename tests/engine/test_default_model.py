"""The real default model (SmolLM2-135M-Instruct GGUF) against transformers, and batch
invariance of its greedy outputs under batching, prefix caching, chunked prefill, preemption."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.default_model import default_model_path

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
    "List three colors:\n1.",
    "北京是中国的",
    "The quick brown fox 🦊 jumps",
    "Q: What is 12 + 7?\nA:",
    "import numpy as np\nx = np.",
    "In 1492, Columbus",
    "   leading spaces and\ttabs\n\n",
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "Photosynthesis is the process by which",
]
NUM_STEPS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_STEPS, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", device="cpu", max_model_len=2048)


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    return tok, model


def test_greedy_matches_transformers_on_a_dozen_prompts(llm, hf):
    tok, model = hf
    outs = llm.generate(PROMPTS, GREEDY)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = tok(prompt, return_tensors="pt").input_ids
        assert out.prompt_token_ids == ids[0].tolist(), f"tokenization differs for {prompt!r}"
        with torch.no_grad():
            ref = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=NUM_STEPS,
                min_new_tokens=NUM_STEPS,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0, ids.shape[1] :].tolist()
        assert out.outputs[0].token_ids == ref, f"greedy output differs for {prompt!r}"


def _mixed_batch(target: str, num: int = 32) -> list[str]:
    fillers = [
        "Tell me about " + "the history of science " * (1 + i % 7) + f"number {i}."
        for i in range(num - 1)
    ]
    return fillers[: num // 2] + [target] + fillers[num // 2 :]


@pytest.fixture(scope="module")
def alone(llm):
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:4], GREEDY)]


def test_same_output_inside_a_batch_of_32_mixed_requests(llm, alone):
    for prompt, expected in zip(PROMPTS[:4], alone, strict=True):
        batch = _mixed_batch(prompt)
        lengths = [
            SamplingParams(temperature=0.0, max_tokens=4 + i % 13, ignore_eos=True)
            for i in range(len(batch))
        ]
        lengths[len(batch) // 2] = GREEDY
        outs = llm.generate(batch, lengths)
        assert outs[len(batch) // 2].outputs[0].token_ids == expected, prompt


@pytest.mark.parametrize(
    "engine_args",
    [
        pytest.param(dict(enable_prefix_caching=False), id="no-prefix-caching"),
        pytest.param(dict(max_num_batched_tokens=7), id="chunked-prefill-budget-7"),
    ],
)
def test_same_output_without_prefix_cache_and_with_tiny_budget(engine_args, alone):
    other = LLM(dtype="float32", device="cpu", max_model_len=2048, **engine_args)
    outs = other.generate(PROMPTS[:4], GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == alone


def test_prefix_cache_hits_keep_outputs_identical(llm):
    shared = "Background notes: " + "the history of science and its instruments " * 5
    prompts = [shared + p for p in PROMPTS[:4]]
    # First run: all four are prefilled in one step, before any block is cached.
    first = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    before = llm.engine.stats().prefix_cache_hits_total
    second = llm.generate(prompts, GREEDY)
    assert llm.engine.stats().prefix_cache_hits_total - before >= 4 * 32
    assert all(o.num_cached_tokens >= 32 for o in second)
    assert [o.outputs[0].token_ids for o in second] == first


def test_same_output_under_preemption(alone):
    # 48 blocks of 16 tokens: far fewer than 32 requests of ~60 tokens need at once.
    block_bytes = 2 * 30 * 16 * 3 * 64 * 4
    small = LLM(
        dtype="float32", device="cpu", max_model_len=2048, kv_cache_memory_bytes=48 * block_bytes
    )
    batch = _mixed_batch(PROMPTS[0])
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)] * len(batch)
    params[len(batch) // 2] = GREEDY
    outs = small.generate(batch, params)
    assert small.engine.stats().num_preemptions_total > 0, "the test did not cause preemption"
    assert outs[len(batch) // 2].outputs[0].token_ids == alone[0]
