"""Tensor parallelism on two GPUs (NCCL): the ranks replay CUDA graphs of their shards, the
all-reduces captured in them, and give the greedy tokens of one GPU without graphs."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from tests.engine.conftest import save_tiny_model

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _two_gpus():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs (the device tool's nvidia-h200-x2)")


def _greedy(model_dir, prompts, params, **args) -> tuple[list[list[int]], dict]:
    """Greedy tokens of ``prompts``, and what rank 0 captured (graph keys), engine shut down."""
    llm = LLM(model=str(model_dir), device="cuda", dtype="float32", **args)
    try:
        tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        runner = llm.engine.runner
        captured = {
            "decode": sorted(runner.graphs.graphs) if runner.graphs else [],
            "piecewise": sorted(runner.piecewise.graphs) if runner.piecewise else [],
        }
        return tokens, captured
    finally:
        llm.engine.shutdown()


def test_tp2_with_cuda_graphs_equals_one_gpu_eager(tmp_path, wordlevel_tokenizer_dir):
    """TP=2 with decode and piecewise graphs against one GPU with eager launches and against
    TP=2 eager: the same greedy tokens. Chunks of up to 40 tokens beside decodes, a shared
    prefix, batches of 1-4 decodes; piecewise graphs up to 16 tokens, so steps of 17-40 run
    eagerly beside graph steps. Ranks that took a step differently would capture different
    collectives and hang or garble the all-reduces."""
    save_tiny_model(
        "llama", tmp_path, wordlevel_tokenizer_dir, hidden_size=256, intermediate_size=512,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32, num_hidden_layers=3,
        max_position_embeddings=2048,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(5)
    shared = torch.randint(100, 40000, (48,), generator=gen).tolist()
    prompts = [torch.randint(100, 40000, (n,), generator=gen).tolist()
               for n in (150, 7, 33, 1, 20)]  # fmt: skip
    prompts += [shared + [101, 102, 103], shared + [104] * 9]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)
              for m in (12, 30, 9, 25, 16, 14, 11)]  # fmt: skip
    args = dict(max_num_batched_tokens=40, max_num_seqs=4, kv_cache_memory_bytes=64 << 20)
    want, _ = _greedy(tmp_path, prompts, params, enforce_eager=True, **args)
    eager2, _ = _greedy(tmp_path, prompts, params, enforce_eager=True, tensor_parallel_size=2,
                        **args)  # fmt: skip
    got, captured = _greedy(tmp_path, prompts, params, tensor_parallel_size=2,
                            max_cudagraph_capture_size=16, **args)  # fmt: skip
    assert eager2 == want
    assert got == want
    assert captured["decode"], captured
    assert 16 in captured["piecewise"] and set(captured["piecewise"]) <= {1, 2, 4, 8, 16}
