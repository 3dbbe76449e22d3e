"""Asynchronous scheduling: step n + 1 is launched before step n's samples are read back and
takes them on the device. Its outputs must be those of synchronous steps, token for token,
with stops, seeds, logprobs, penalties, n > 1, prefix caching, chunked prefill, preemption
and aborts in the mix. On CPU the forward runs on the calling thread, so nothing overlaps
here; the bookkeeping (placeholders, gathered tokens, dropped rows) is the same as on CUDA,
where ``test_cuda_engine.py`` checks it again with graphs and that the steps never wait for
the GPU."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.llm_engine import LLMEngine
from tests.engine.conftest import save_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, wordlevel_tokenizer_dir):
    out = tmp_path_factory.mktemp("tiny-async")
    save_tiny_model("llama", out, wordlevel_tokenizer_dir, max_position_embeddings=256)
    return out


def engines(tiny_dir, **args) -> tuple[LLM, LLM]:
    base = dict(device="cpu", dtype="float32", block_size=16) | args
    sync = LLM(model=str(tiny_dir), async_scheduling=False, **base)
    asyn = LLM(model=str(tiny_dir), async_scheduling=True, **base)
    assert not sync.engine._async and asyn.engine._async
    return sync, asyn


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 90, (count,), generator=gen).tolist()
    shared = torch.randint(100, 40000, (40,), generator=gen).tolist()  # a cached prefix
    out = []
    for i, n in enumerate(lengths):
        own = torch.randint(100, 40000, (n,), generator=gen).tolist()
        out.append(shared + own if i % 3 == 0 else own)
    return out


def summary(outputs) -> list:
    """Everything a caller sees of each completion."""
    return [
        [
            (
                c.token_ids,
                c.text,
                c.finish_reason,
                c.stop_reason,
                c.cumulative_logprob,
                [{t: (lp.logprob, lp.rank) for t, lp in pos.items()} for pos in c.logprobs or []],
            )
            for c in o.outputs
        ]  # fmt: skip
        for o in outputs
    ]


def mixed_params(sync: LLM, batch: list[list[int]]) -> list[SamplingParams]:
    """Params that stop mid-way: the stop tokens and strings are taken from a first greedy
    run, so requests do end on a token the next step has already computed past."""
    free = sync.generate(batch, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    tokens = [o.outputs[0].token_ids for o in free]
    tok = sync.get_tokenizer()
    params = []
    for i, toks in enumerate(tokens):
        kind = i % 8
        if kind == 0:
            p = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[toks[5]])
        elif kind == 1:
            p = SamplingParams(temperature=0.0, max_tokens=3 + i % 5, ignore_eos=True)
        elif kind == 2:
            p = SamplingParams(temperature=0.8, max_tokens=20, seed=100 + i, logprobs=3)
        elif kind == 3:
            p = SamplingParams(n=2, temperature=1.0, max_tokens=16, seed=7, ignore_eos=True)
        elif kind == 4:
            p = SamplingParams(
                temperature=0.0, max_tokens=20, repetition_penalty=1.3, frequency_penalty=0.5,
                presence_penalty=0.2, min_tokens=4, stop_token_ids=[toks[2]],
            )  # fmt: skip
        elif kind == 5:
            p = SamplingParams(temperature=0.0, max_tokens=24, stop=[tok.decode(toks[7:9])])
        elif kind == 6:
            p = SamplingParams(
                temperature=0.7, top_k=20, min_p=0.05, top_p=0.9, max_tokens=18, seed=i
            )
        else:
            p = SamplingParams(temperature=0.0, max_tokens=1, logprobs=2)
        params.append(p)
    return params


@pytest.mark.parametrize(
    "args",
    [
        dict(max_num_batched_tokens=2048),  # whole prompts
        dict(max_num_batched_tokens=48, max_num_seqs=6),  # chunked prefill, few sequences
        dict(max_num_batched_tokens=64, kv_cache_memory_bytes=36 * 8192),  # 36 blocks
    ],
    ids=["whole", "chunked", "preempting"],
)
def test_async_outputs_equal_sync_outputs(tiny_dir, args):
    sync, asyn = engines(tiny_dir, **args)
    batch = prompts(24)
    params = mixed_params(sync, batch)
    want = summary(sync.generate(batch, params))
    got = summary(asyn.generate(batch, params))
    assert got == want
    stops = [c[3] for o in want for c in o]
    assert any(s is not None for s in stops), "no request stopped on a token or a string"
    if "kv_cache_memory_bytes" in args:
        assert asyn.engine.stats().num_preemptions_total > 0, "the cache was never short"
    for llm in (sync, asyn):
        assert not llm.engine.has_unfinished_requests()
        assert llm.engine.pool.num_free_blocks == llm.engine.pool.num_blocks  # nothing leaked


def test_async_step_launches_the_next_step_before_reading_back(tiny_dir, monkeypatch):
    """The order that makes the overlap: each step's forward is queued before the previous
    step's samples are waited for, and reads its token from them."""
    _, asyn = engines(tiny_dir)
    engine: LLMEngine = asyn.engine
    events: list[str] = []
    execute = engine.runner.execute

    def traced_execute(sched, pending=None):
        events.append("execute" + ("+pending" if pending is not None else ""))
        return execute(sched, pending)

    from engine.sampler import PendingSample

    result = PendingSample.result

    def traced_result(self):
        events.append("read")
        return result(self)

    monkeypatch.setattr(engine.runner, "execute", traced_execute)
    monkeypatch.setattr(PendingSample, "result", traced_result)
    engine.add_request("a", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=3))
    while engine.has_unfinished_requests():
        engine.step()
    # prefill, then two decodes that gather their input token; the last read has no next step
    assert events == ["execute", "execute+pending", "read", "execute+pending", "read", "read"]


def test_abort_while_a_token_is_in_flight(tiny_dir):
    sync, asyn = engines(tiny_dir)
    batch = prompts(4, seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    full = [o.outputs[0].token_ids for o in sync.generate(batch, params)]
    engine = asyn.engine
    for i, p in enumerate(batch):
        engine.add_request(str(i), p, params)
    for _ in range(5):
        engine.step()
    assert any(r.num_pending_tokens for r in engine.scheduler.running)
    aborted = engine.abort("1")
    assert aborted is not None and aborted.outputs[0].finish_reason == "abort"
    got_aborted = aborted.outputs[0].token_ids
    assert got_aborted == full[1][: len(got_aborted)]
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            done[out.request_id] = out.outputs[0].token_ids
    assert done == {"0": full[0], "2": full[2], "3": full[3]}
    assert engine.pool.num_free_blocks == engine.pool.num_blocks


def test_switching_modes_waits_for_the_step_in_flight(tiny_dir):
    _, asyn = engines(tiny_dir)
    engine = asyn.engine
    engine.add_request("a", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=4))
    engine.step()
    with pytest.raises(RuntimeError, match="in flight"):
        engine.async_scheduling = False
    while engine.has_unfinished_requests():
        engine.step()
    engine.async_scheduling = False
    engine.add_request("b", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=4))
    engine.step()
    assert engine._inflight is None  # a synchronous step reads its samples back at once


def test_async_scheduling_defaults_to_the_device():
    from engine.config import EngineConfig

    assert EngineConfig().resolve_async_scheduling(torch.device("cuda"))
    assert not EngineConfig().resolve_async_scheduling(torch.device("cpu"))
    assert EngineConfig(async_scheduling=True).resolve_async_scheduling(torch.device("cpu"))
    assert not EngineConfig(async_scheduling=False).resolve_async_scheduling(torch.device("cuda"))
