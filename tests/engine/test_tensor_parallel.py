"""Tensor parallelism on CPU: 2 gloo ranks (this process + one spawned worker) give the same
greedy tokens as one process, dense fp32 and INT4 (GPTQ), with KV heads split or replicated."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from tests.engine.conftest import save_tiny_model

PROMPTS = [
    [5, 17, 300, 999, 77, 9, 1000],
    [12, 13] * 9 + [401],
    [900],
    list(range(600, 641)),
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
ENGINE_ARGS = dict(dtype="float32", device="cpu", block_size=4, kv_cache_memory_bytes=2 << 20)


def greedy_tokens(
    model_dir, tensor_parallel_size: int, **args
) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy outputs of PROMPTS, and the prompt logits of the first prompt."""
    llm = LLM(
        model=str(model_dir), tensor_parallel_size=tensor_parallel_size, **ENGINE_ARGS, **args
    )
    try:
        attn = llm.engine.runner.model.layers[0].self_attn
        assert attn.num_heads == 4 // tensor_parallel_size  # this rank's share of the heads
        outs = llm.generate(PROMPTS, GREEDY)
        probe = llm.generate(PROMPTS[0], SamplingParams(max_tokens=1, logprobs=5))[0]
        top = probe.outputs[0].logprobs[0]
        top_lp = torch.tensor([top[t].logprob for t in sorted(top)])
        return [o.outputs[0].token_ids for o in outs], top_lp
    finally:
        llm.engine.shutdown()


# vocab_size 1001 is odd: the last rank's vocabulary shard is padded.
CASES = {
    "gqa-untied-kv2": dict(num_key_value_heads=2, tie_word_embeddings=False),
    "mqa-tied-kv1-replicated": dict(num_key_value_heads=1, tie_word_embeddings=True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tp2_greedy_identical_to_tp1_fp32(case, tmp_path, wordlevel_tokenizer_dir):
    save_tiny_model(
        "llama",
        tmp_path,
        wordlevel_tokenizer_dir,
        vocab_size=1001,
        intermediate_size=128,
        **CASES[case],
    )
    tokens1, lp1 = greedy_tokens(tmp_path, 1)
    tokens2, lp2 = greedy_tokens(tmp_path, 2)
    assert tokens2 == tokens1
    torch.testing.assert_close(lp2, lp1, rtol=1e-4, atol=1e-4)
    if case == "gqa-untied-kv2":
        # Asynchronous scheduling: rank 0 gathers each step's pending tokens into the input
        # ids it broadcasts, so the other ranks never see a placeholder.
        tokens2_async, _ = greedy_tokens(tmp_path, 2, async_scheduling=True)
        assert tokens2_async == tokens1


def test_tp2_int4_identical_to_tp1_int4(tmp_path, wordlevel_tokenizer_dir):
    from engine.quant.quantize import quantize_checkpoint

    dense = tmp_path / "dense"
    dense.mkdir()
    save_tiny_model(
        "llama",
        dense,
        wordlevel_tokenizer_dir,
        vocab_size=1001,
        intermediate_size=128,
        tie_word_embeddings=False,
    )
    # group 32: o_proj's per-rank K (32) and down_proj's (64) are whole groups.
    quantized = quantize_checkpoint(dense, tmp_path / "gptq", method="gptq", group_size=32)
    tokens1, lp1 = greedy_tokens(quantized, 1)
    tokens2, lp2 = greedy_tokens(quantized, 2)
    assert tokens2 == tokens1
    torch.testing.assert_close(lp2, lp1, rtol=1e-4, atol=1e-4)


def test_tp_shapes_that_do_not_split_are_refused(tmp_path, wordlevel_tokenizer_dir):
    save_tiny_model("llama", tmp_path, wordlevel_tokenizer_dir, vocab_size=1001)
    with pytest.raises(ValueError, match="num_attention_heads"):
        LLMEngine(EngineConfig(model=str(tmp_path), tensor_parallel_size=3, **ENGINE_ARGS))


def test_rank_worker_exits_when_the_engine_process_is_killed(tmp_path, wordlevel_tokenizer_dir):
    """No orphaned rank after kill -9 (gloo also sees the closed socket; NCCL relies on the
    worker's parent watch, which this CPU test cannot tell apart)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    save_tiny_model("llama", tmp_path, wordlevel_tokenizer_dir, vocab_size=1001)
    script = (
        "import sys, time\n"
        "from engine.config import EngineConfig\n"
        "from engine.llm_engine import LLMEngine\n"
        f"e = LLMEngine(EngineConfig(model={str(tmp_path)!r}, tensor_parallel_size=2, "
        f"**{ENGINE_ARGS!r}))\n"
        "print(e._rank_workers.processes[0].pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        worker_pid = int(proc.stdout.readline())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.kill(worker_pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        os.kill(worker_pid, signal.SIGKILL)
        raise AssertionError("the rank worker outlived the killed engine process")
    finally:
        proc.kill()
