"""On CUDA the engine runs the Triton kernels; its greedy output must equal the CPU reference
path on the same weights (fp32 both sides, so no precision difference hides a bug)."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from tests.engine.conftest import save_tiny_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, wordlevel_tokenizer_dir):
    out = tmp_path_factory.mktemp("tiny-cuda")
    save_tiny_model(
        "llama", out, wordlevel_tokenizer_dir, hidden_size=256, intermediate_size=512,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32, num_hidden_layers=3,
    )  # fmt: skip
    return out


def mixed_requests():
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (n,), generator=gen).tolist()
               for n in (1, 7, 16, 33, 80, 150, 5, 64)]  # fmt: skip
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)
              for m in (24, 3, 30, 17, 9, 24, 40, 12)]  # fmt: skip
    return prompts, params


def test_cuda_triton_greedy_equals_cpu_reference(tiny_dir):
    prompts, params = mixed_requests()
    args = dict(dtype="float32", block_size=16, max_num_batched_tokens=64,
                kv_cache_memory_bytes=64 << 20)  # fmt: skip
    cpu = LLM(model=str(tiny_dir), device="cpu", **args)
    gpu = LLM(model=str(tiny_dir), device="cuda", **args)
    assert gpu.engine.runtime.attention_backend == "triton"
    want = [o.outputs[0].token_ids for o in cpu.generate(prompts, params)]
    got = [o.outputs[0].token_ids for o in gpu.generate(prompts, params)]
    assert got == want


def test_cuda_bf16_runs_to_the_requested_lengths(tiny_dir):
    prompts, params = mixed_requests()
    gpu = LLM(model=str(tiny_dir), device="cuda", dtype="bfloat16", max_num_batched_tokens=64)
    outs = gpu.generate(prompts, params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [p.max_tokens for p in params]


def test_cuda_graph_decode_equals_eager(tiny_dir):
    """Decode steps replayed from CUDA graphs (the default) give the eager launches' greedy
    tokens: batches shrink 8 -> 1 as requests finish (padded to 8, 4, 2, 1), and the longest
    context sets the decode kernel's KV split count, a graph each: the 300-token prompt, done
    first, puts it at 4 splits, the short ones at 1 and later 2 as they grow past 128."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(100, 40000, (n,), generator=gen).tolist()
               for n in (300, 60, 30, 7, 25, 40, 3, 18)]  # fmt: skip
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)
              for m in (5, 95, 80, 65, 50, 35, 20, 10)]  # fmt: skip
    args = dict(dtype="float32", max_num_batched_tokens=128, kv_cache_memory_bytes=64 << 20)
    eager = LLM(model=str(tiny_dir), device="cuda", enforce_eager=True, **args)
    graphs = LLM(model=str(tiny_dir), device="cuda", **args)
    assert eager.engine.runner.graphs is None
    want = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
    got = [o.outputs[0].token_ids for o in graphs.generate(prompts, params)]
    assert got == want
    keys = set(graphs.engine.runner.graphs.graphs)
    assert {size for size, _ in keys} >= {8, 4, 2, 1}, keys
    assert len({splits for _, splits in keys}) >= 2, keys
