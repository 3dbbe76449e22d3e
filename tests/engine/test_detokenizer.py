"""Incremental detokenizer tests with the default model's tokenizer.

The reference is always a full ``decode`` of the ids so far (what a non-incremental engine
would produce), computed independently of the detokenizer's offsets.
"""

from __future__ import annotations

import pytest

from engine.default_model import default_model_path
from engine.detokenizer import IncrementalDetokenizer
from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "机器学习是人工智能的一个分支。中文标点，还有全角字符！",
    "Emoji: 🎉🚀 family 👩‍👩‍👧‍👦, flag 🇫🇷, robot 🤖.",
    "Accents: café, naïve, Ångström, Straße, Ελληνικά, русский, ǅ.",
    "def f(x):\n\treturn {'a': [1, 2]}  # comment\n\n\n    indented = True\n",
    "  leading and   multiple   spaces\t\ttabs\r\nwindows line\u00a0nbsp  ",
    "日本語のテキストと한국어 텍스트, then English 🙂 again.",
]
PROMPT = "<|im_start|>user\nWrite something.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf(default_model_path())


def reference_text(tokenizer, ids, skip_special_tokens=True) -> str:
    """Full decode of ``ids`` minus a trailing incomplete character."""
    return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens).rstrip("\ufffd")


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_token_by_token_equals_full_decode(tokenizer, text):
    prompt_ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, SamplingParams())
    previous = ""
    for k in range(1, len(ids) + 1):
        assert detok.update([ids[k - 1]]) is None
        current = detok.output_text
        assert "\ufffd" not in current, f"broken UTF-8 emitted after token {k}: {current!r}"
        assert current.startswith(previous), f"text shrank after token {k}"
        # Nothing complete is held back: the text is the full decode minus a cut character.
        assert current == reference_text(tokenizer, ids[:k])
        previous = current
    assert detok.output_text == tokenizer.decode(ids) == text


def test_multi_byte_characters_are_held_back_until_complete(tokenizer):
    ids = tokenizer.encode("🎉", add_special_tokens=False)
    assert len(ids) > 1  # byte-level BPE splits the emoji's four bytes
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams())
    texts = []
    for token_id in ids:
        detok.update([token_id])
        texts.append(detok.output_text)
    assert texts[:-1] == [""] * (len(ids) - 1)
    assert texts[-1] == "🎉"


def test_many_tokens_in_one_update(tokenizer):
    ids = tokenizer.encode(TEXTS[2] + TEXTS[1], add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [5, 6], SamplingParams())
    detok.update(ids[:7])
    assert detok.output_text == reference_text(tokenizer, ids[:7])
    detok.update(ids[7:])
    assert detok.output_text == tokenizer.decode(ids)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_special_tokens_follow_skip_special_tokens(tokenizer, skip_special_tokens):
    text = "<|im_start|>assistant\nSure: 你好 🎉<|im_end|>\nmore"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert set(ids) & tokenizer.all_special_ids
    params = SamplingParams(skip_special_tokens=skip_special_tokens)
    detok = IncrementalDetokenizer(tokenizer, [], params)
    for token_id in ids:
        detok.update([token_id])
    expected = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    assert detok.output_text == expected
    assert ("<|im_end|>" in expected) is not skip_special_tokens


def feed_until_stop(detok, ids, check_stop=True) -> tuple[int | None, str | None]:
    """Update one token at a time as the engine does; (tokens fed, stop string) at the stop."""
    for k, token_id in enumerate(ids, start=1):
        stop = detok.update([token_id], check_stop=check_stop)
        if stop is not None:
            return k, stop
    return None, None


def stop_reference(tokenizer, ids, stops, include):
    """Brute force: the first k whose full decode contains a stop string, and the text."""
    for k in range(1, len(ids) + 1):
        text = reference_text(tokenizer, ids[:k])
        found = [(text.find(s), len(s), s) for s in stops if s in text]
        if found:
            start, length, stop = min(found)
            return k, stop, text[: start + length] if include else text[:start]
    return None, None, reference_text(tokenizer, ids)


def straddling_stops(tokenizer, ids) -> list[str]:
    """Stop strings from inside token i to inside token i + 2 (so they cross two boundaries)."""
    ends = [len(reference_text(tokenizer, ids[:k])) for k in range(1, len(ids) + 1)]
    text = tokenizer.decode(ids)
    stops = []
    for i in range(1, len(ids) - 2, 3):
        start = ends[i - 1] + (1 if ends[i] - ends[i - 1] > 1 else 0)
        end = ends[i + 2] - (1 if ends[i + 2] - ends[i + 1] > 1 else 0)
        if end > ends[i] and end - start >= 2:
            stops.append(text[start:end])
    return stops


@pytest.mark.parametrize("include", [False, True], ids=["exclude", "include"])
@pytest.mark.parametrize("text", [TEXTS[0], TEXTS[1], TEXTS[4]], ids=["en", "zh", "code"])
def test_straddling_stop_strings(tokenizer, text, include):
    ids = tokenizer.encode(text, add_special_tokens=False)
    stops = straddling_stops(tokenizer, ids)
    assert len(stops) >= 2
    for stop in stops:
        expected_k, expected_stop, expected_text = stop_reference(tokenizer, ids, [stop], include)
        params = SamplingParams(stop=[stop], include_stop_str_in_output=include)
        detok = IncrementalDetokenizer(tokenizer, [1, 2, 3], params)
        assert feed_until_stop(detok, ids) == (expected_k, expected_stop), stop
        assert detok.output_text == expected_text


def test_earliest_stop_string_wins_whatever_the_order(tokenizer):
    ids = tokenizer.encode("hello wonderful world, hello again", add_special_tokens=False)
    for stops in (["world", "lo w", "again"], ["again", "lo w", "world"]):
        detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=stops))
        k, stop = feed_until_stop(detok, ids)
        assert stop == "lo w"
        assert detok.output_text == "hel"
    # Two matches starting at the same place: the shorter one ends first.
    detok = IncrementalDetokenizer(
        tokenizer, [], SamplingParams(stop=["wonderful", "won"], include_stop_str_in_output=True)
    )
    assert detok.update(ids) == "won"
    assert detok.output_text == "hello won"


def test_stop_string_inside_one_token_and_check_stop_off(tokenizer):
    ids = tokenizer.encode("The answer is here.", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=["answer"]))
    assert feed_until_stop(detok, ids, check_stop=False) == (None, None)
    assert detok.output_text == "The answer is here."
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=["nswe"]))
    assert feed_until_stop(detok, ids)[1] == "nswe"
    assert detok.output_text == "The a"


def test_stop_string_of_multi_byte_characters(tokenizer):
    ids = tokenizer.encode("先说这个，然后🎉庆祝一下", add_special_tokens=False)
    params = SamplingParams(stop=["🎉庆"], include_stop_str_in_output=True)
    detok = IncrementalDetokenizer(tokenizer, [], params)
    assert feed_until_stop(detok, ids)[1] == "🎉庆"
    assert detok.output_text == "先说这个，然后🎉庆"


def test_decode_token(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams())
    space_def = tokenizer.encode(" def", add_special_tokens=False)
    assert len(space_def) == 1
    assert detok.decode_token(space_def[0]) == " def"
    assert detok.decode_token(tokenizer.eos_token_id) == "<|im_end|>"
    for token_id in (88, 2756, 7906, 15107):
        assert detok.decode_token(token_id) == tokenizer.decode([token_id], False)


def test_prompt_ending_inside_a_character_leaves_it_to_the_output(tokenizer):
    ids = tokenizer.encode("Party 🎉 time, 中文!", add_special_tokens=False)
    full = tokenizer.decode(ids)
    cut_points = [k for k in range(1, len(ids)) if tokenizer.decode(ids[:k]).endswith("\ufffd")]
    assert cut_points
    for k in cut_points:
        prompt_text = reference_text(tokenizer, ids[:k])
        detok = IncrementalDetokenizer(tokenizer, ids[:k], SamplingParams())
        for token_id in ids[k:]:
            detok.update([token_id])
            assert "\ufffd" not in detok.output_text
        assert detok.output_text == full[len(prompt_text) :], k
