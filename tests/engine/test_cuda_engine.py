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
        max_position_embeddings=2048,
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
    # A bounded cache: by default the engine takes 90% of the GPU, and the GPU suite runs
    # its files in parallel processes (a kernel test beside this one then ran out of memory).
    gpu = LLM(model=str(tiny_dir), device="cuda", dtype="bfloat16", max_num_batched_tokens=64,
              kv_cache_memory_bytes=64 << 20)  # fmt: skip
    outs = gpu.generate(prompts, params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [p.max_tokens for p in params]


def _generate_eager_and_with_graphs(tiny_dir, prompts, params, args: dict) -> LLM:
    """Greedy tokens with eager launches and with CUDA graphs (the default) must be equal;
    returns the engine with graphs for a look at what it captured."""
    eager = LLM(model=str(tiny_dir), device="cuda", enforce_eager=True, **args)
    graphs = LLM(model=str(tiny_dir), device="cuda", **args)
    assert eager.engine.runner.graphs is None and eager.engine.runner.piecewise is None
    want = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
    got = [o.outputs[0].token_ids for o in graphs.generate(prompts, params)]
    assert got == want
    return graphs


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
    graphs = _generate_eager_and_with_graphs(tiny_dir, prompts, params, args)
    keys = set(graphs.engine.runner.graphs.graphs)
    assert {size for size, _ in keys} >= {8, 4, 2, 1}, keys
    assert len({splits for _, splits in keys}) >= 2, keys


def test_piecewise_graphs_for_prefill_steps_equal_eager(tiny_dir):
    """Steps with prefill tokens replay piecewise graphs (one per stretch between attention
    calls, the attention eager on the real tokens): chunks of up to 40 tokens beside
    decodes, padded to 8, 16, 24, 32, 40 tokens, give the eager launches' greedy tokens.
    Two prompts share a 48-token prefix (the later one may extend over it, cached), and the
    largest step (the 150-token prompt is chunked at 40) stays within the graphs."""
    gen = torch.Generator().manual_seed(2)
    shared = torch.randint(100, 40000, (48,), generator=gen).tolist()
    prompts = [torch.randint(100, 40000, (n,), generator=gen).tolist()
               for n in (150, 7, 33, 1, 20)]  # fmt: skip
    prompts += [shared + [101, 102, 103], shared + [104] * 9]  # the second extends a prefix
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)
              for m in (12, 30, 9, 25, 16, 14, 11)]  # fmt: skip
    args = dict(dtype="float32", max_num_batched_tokens=40, max_num_seqs=4,
                kv_cache_memory_bytes=64 << 20)  # fmt: skip
    graphs = _generate_eager_and_with_graphs(tiny_dir, prompts, params, args)
    piecewise = graphs.engine.runner.piecewise
    assert len(piecewise.graphs) >= 3, sorted(piecewise.graphs)
    assert set(piecewise.graphs) <= {1, 2, 4, 8, 16, 24, 32, 40}, sorted(piecewise.graphs)
    pieces, calls, _ = next(iter(piecewise.graphs.values()))
    num_layers = graphs.engine.runner.model.config.num_hidden_layers
    assert (len(pieces), len(calls)) == (num_layers + 1, num_layers)


def test_piecewise_graphs_off_keeps_prefill_steps_eager(tiny_dir):
    """``max_cudagraph_capture_size=0``: no piecewise graphs; decode steps still replay."""
    prompts, params = mixed_requests()
    llm = LLM(model=str(tiny_dir), device="cuda", dtype="float32", max_num_batched_tokens=64,
              max_cudagraph_capture_size=0, kv_cache_memory_bytes=64 << 20)  # fmt: skip
    outs = llm.generate(prompts, params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [p.max_tokens for p in params]
    assert llm.engine.runner.piecewise is None and llm.engine.runner.graphs.graphs


def test_piecewise_graphs_above_512_tokens_pad_to_multiples_of_64(tiny_dir):
    """A step of 830 prompt tokens replays the graphs of size 832; a later one with a
    90-token prompt beside a decode, those of 96; both give the eager launches' tokens."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(100, 40000, (n,), generator=gen).tolist() for n in (530, 300, 90)]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (6, 3, 5)]
    args = dict(dtype="float32", max_num_batched_tokens=1024, max_num_seqs=2,
                kv_cache_memory_bytes=64 << 20)  # fmt: skip
    graphs = _generate_eager_and_with_graphs(tiny_dir, prompts, params, args)
    assert {832, 96} <= set(graphs.engine.runner.piecewise.graphs), graphs.engine.runner.piecewise


def test_async_scheduling_on_cuda_equals_sync(tiny_dir):
    """With CUDA graphs, asynchronous scheduling (the default on CUDA) gives the synchronous
    steps' outputs: stops on tokens and strings, seeds, logprobs, penalties, n = 2, a cached
    prefix, chunked prefill (``test_async_scheduling.py`` has the CPU side)."""
    from tests.engine.test_async_scheduling import mixed_params, prompts

    args = dict(device="cuda", dtype="float32", max_num_batched_tokens=48, max_num_seqs=6,
                kv_cache_memory_bytes=64 << 20)  # fmt: skip
    sync = LLM(model=str(tiny_dir), async_scheduling=False, **args)
    asyn = LLM(model=str(tiny_dir), **args)
    assert asyn.engine._async and asyn.engine.runner.graphs is not None
    batch = prompts(24)
    params = mixed_params(sync, batch)
    want = sync.generate(batch, params)
    got = asyn.generate(batch, params)
    # The steps' compositions differ (a stopped request's extra row, blocks freed a step
    # later), and on the GPU a row's float32 logits can move in their last bits with the
    # batch (GEMM tilings): tokens, text and stops must agree exactly, logprobs closely.
    for w, g in zip(want, got, strict=True):
        for cw, cg in zip(w.outputs, g.outputs, strict=True):
            assert (cg.token_ids, cg.text, cg.finish_reason, cg.stop_reason) == (
                cw.token_ids, cw.text, cw.finish_reason, cw.stop_reason,
            ), w.request_id  # fmt: skip
            if cw.logprobs is not None:
                for pw, pg in zip(cw.logprobs, cg.logprobs, strict=True):
                    assert pg.keys() == pw.keys()
                    for t in pw:
                        assert pg[t].logprob == pytest.approx(pw[t].logprob, abs=1e-4)
    assert asyn.engine.runner.graphs.graphs, "no decode step replayed a graph"


def test_async_decode_steps_never_wait_for_the_gpu(tiny_dir):
    """Once its graphs are captured, an asynchronous decode step makes no call that waits for
    the stream (a blocking copy, ``.item()``, ``.tolist()`` of a device tensor): torch's sync
    debug mode raises on any. The one wait, for the previous step's samples, is on an event
    recorded right behind them, so the step just launched keeps the GPU busy meanwhile.
    Sampling with top-k and top-p included (their thresholds: ``kernels.sampling_filters``)."""
    llm = LLM(model=str(tiny_dir), device="cuda", dtype="float32", max_num_batched_tokens=256,
              kv_cache_memory_bytes=64 << 20)  # fmt: skip
    engine = llm.engine
    gen = torch.Generator().manual_seed(4)
    for i, seed in enumerate((None, 11, None, 12)):
        prompt = torch.randint(100, 40000, (20 + i,), generator=gen).tolist()
        params = SamplingParams(temperature=0.0 if seed is None else 0.8, seed=seed,
                                max_tokens=40, ignore_eos=True, top_k=0 if seed is None else 50,
                                top_p=1.0 if seed is None else 0.9,
                                logprobs=2 if i == 1 else None)  # fmt: skip
        engine.add_request(str(i), prompt, params)
    for _ in range(4):  # the prefill, then decodes that capture the batch's graph
        assert engine.step() == []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):
            assert engine.step() == []
    finally:
        torch.cuda.set_sync_debug_mode(0)
    done = []
    while engine.has_unfinished_requests():
        done += engine.step()
    assert sorted(len(o.outputs[0].token_ids) for o in done) == [40] * 4
