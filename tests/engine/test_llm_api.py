"""The offline API and the step API on the default model: limits, n, seeds, stops, logprobs,
and the background loop."""

from __future__ import annotations

import threading
import time

import pytest

from engine import LLM, SamplingParams
from engine.engine_loop import EngineLoop
from engine.llm_engine import LLMEngine

MAX_LEN = 96


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", device="cpu", max_model_len=MAX_LEN)


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, **kw)


def test_too_long_requests_are_rejected_at_add_with_clear_errors(llm):
    with pytest.raises(ValueError, match="longer than the maximum model length of 96"):
        llm.generate("word " * 200, greedy(4))
    with pytest.raises(ValueError, match="exceeds the maximum model length"):
        llm.generate("hello", greedy(MAX_LEN))
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]], greedy(4))
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize("tp", [1, 2])
def test_max_model_len_beyond_the_model_is_refused(tp, tmp_path, wordlevel_tokenizer_dir):
    """A clear error, with one process and with tensor-parallel ranks (gloo) alike."""
    from tests.engine.conftest import save_tiny_model

    save_tiny_model("llama", tmp_path, wordlevel_tokenizer_dir, max_position_embeddings=256)
    with pytest.raises(ValueError, match="max_model_len 100000 exceeds the model's "
                                         "max_position_embeddings 256"):  # fmt: skip
        LLM(model=str(tmp_path), device="cpu", max_model_len=100_000, tensor_parallel_size=tp)


def test_default_max_tokens_runs_to_the_context_limit(llm):
    out = llm.generate("Count: 1, 2, 3,", SamplingParams(temperature=0.0, ignore_eos=True))[0]
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == MAX_LEN
    assert out.outputs[0].finish_reason == "length"


def test_seeded_sampling_is_independent_of_the_batch(llm):
    params = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=12, seed=1234, ignore_eos=True)
    alone = llm.generate("Write a poem about rain:", params)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=5 + i) for i in range(7)]
    batch = [f"Tell me a story about cat number {i}" for i in range(7)]
    outs = llm.generate(
        batch[:3] + ["Write a poem about rain:"] + batch[3:], others[:3] + [params] + others[3:]
    )
    assert outs[3].outputs[0].token_ids == alone
    other_seed = SamplingParams(
        temperature=0.9, top_p=0.95, max_tokens=12, seed=99, ignore_eos=True
    )
    assert llm.generate("Write a poem about rain:", other_seed)[0].outputs[0].token_ids != alone


def test_n_completions_share_the_prompt_blocks(llm):
    prompt = "The history of the printing press " * 4
    before = llm.engine.stats().prefix_cache_hits_total
    out = llm.generate(prompt, SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=7))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    num_full_blocks = (len(out.prompt_token_ids) - 1) // 16
    # Siblings 1 and 2 found the leader's full prompt blocks in the cache.
    assert llm.engine.stats().prefix_cache_hits_total - before >= 2 * num_full_blocks * 16


def test_stop_string_straddling_tokens_truncates_text(llm):
    prompt = "Once upon a time, in a small village,"
    full = llm.generate(prompt, greedy(24, ignore_eos=True))[0].outputs[0]
    tokens = full.token_ids
    tok = llm.get_tokenizer()
    # A stop string that begins inside token 3 and ends inside token 5 of the output.
    head = tok.decode(tokens[:3])
    upto5 = tok.decode(tokens[:5])
    stop = upto5[len(head) - 2 : len(upto5) - 1]
    assert stop.strip(), "degenerate stop string"
    out = llm.generate(prompt, greedy(24, ignore_eos=True, stop=[stop]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == full.text[: full.text.index(stop)]
    kept = llm.generate(
        prompt, greedy(24, ignore_eos=True, stop=[stop], include_stop_str_in_output=True)
    )[0].outputs[0]
    assert kept.text == full.text[: full.text.index(stop) + len(stop)]


def test_stop_token_ids_and_min_tokens(llm):
    prompt = "List three colors:\n1."
    full = llm.generate(prompt, greedy(20, ignore_eos=True))[0].outputs[0].token_ids
    stop_id = full[4]
    first = full.index(stop_id)
    out = llm.generate(prompt, greedy(20, ignore_eos=True, stop_token_ids=[stop_id]))[0]
    assert out.outputs[0].token_ids == full[: first + 1]
    assert out.outputs[0].stop_reason == stop_id
    later = llm.generate(
        prompt, greedy(20, ignore_eos=True, stop_token_ids=[stop_id], min_tokens=first + 2)
    )[0].outputs[0]
    assert len(later.token_ids) >= first + 2


def test_logprobs_rank_the_greedy_token_first(llm):
    out = llm.generate("The capital of France is", greedy(6, logprobs=3))[0].outputs[0]
    assert len(out.logprobs) == len(out.token_ids)
    total = 0.0
    for token, pos in zip(out.token_ids, out.logprobs, strict=True):
        assert pos[token].rank == 1 and len(pos) == 3
        assert all(lp.logprob <= pos[token].logprob + 1e-6 for lp in pos.values())
        assert isinstance(pos[token].decoded_token, str)
        total += pos[token].logprob
    assert out.cumulative_logprob == pytest.approx(total, rel=1e-5)


def test_chat_renders_the_template(llm):
    conv = [{"role": "user", "content": "Say hello."}]
    out = llm.chat(conv, greedy(8))[0]
    tok = llm.get_tokenizer()
    assert out.prompt_token_ids == tok.encode(
        tok.apply_chat_template(conv, add_generation_prompt=True), add_special_tokens=False
    )
    assert out.outputs[0].text


def test_engine_loop_serves_threads_and_sleeps_when_idle():
    from engine.config import EngineConfig

    loop = EngineLoop(LLMEngine(EngineConfig(dtype="float32", device="cpu", max_model_len=MAX_LEN)))
    try:
        results = {}

        def client(i: int) -> None:
            fut = loop.submit(f"t{i}", f"Fact number {i}:", greedy(5))
            results[i] = fut.result(timeout=120)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == list(range(6))
        assert all(len(r.outputs[0].token_ids) == 5 for r in results.values())
        with pytest.raises(ValueError, match="maximum model length"):
            loop.submit("too-long", "word " * 300, greedy(4))

        long_fut = loop.submit(
            "to-abort",
            "Tell me everything:",
            SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True),
        )
        time.sleep(0.3)
        loop.abort("to-abort")
        aborted = long_fut.result(timeout=60)
        assert aborted.outputs[0].finish_reason == "abort"
        assert len(aborted.outputs[0].token_ids) < 60

        # Idle: the loop thread waits on a condition, so the process burns ~no CPU.
        time.sleep(0.2)
        cpu0 = time.process_time()
        time.sleep(1.0)
        assert time.process_time() - cpu0 < 0.2
        assert loop.num_unfinished == 0
    finally:
        loop.shutdown()
