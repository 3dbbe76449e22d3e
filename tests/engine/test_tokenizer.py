"""engine.tokenizer against transformers' tokenizer for the default model (its GGUF vocabulary)."""

from __future__ import annotations

import pytest

from engine.default_model import default_model_path
from engine.tokenizer import Tokenizer

TEXTS = [
    "Hello, world! How are you doing today?",
    "The quick brown fox jumps over the lazy dog. It's 3:45pm; we'll see 1,234,567 of them.",
    "中文测试：今天天气很好，我们去公园散步吧。",
    "日本語のテキストと한국어 텍스트, and Ελληνικά, русский текст.",
    "Emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 and ✨ sparkles",
    "   leading spaces, trailing spaces   ",
    "tabs\there\t\tand\t\t\tmore\ttabs",
    "newlines\n\n\nruns\r\nof\n \n  \n\twhitespace\u00a0nbsp\u2003em",
    "def f(x):\n    return x ** 2  # square\n\nclass A:\n\tpass\n",
    'for (int i = 0; i < n; ++i) { printf("%d\\n", a[i]); }',
    "Numbers 0123456789 3.14159 -42 1e-10 and 100000000000",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "special tokens inside text: <|endoftext|><file_sep><repo_name>x<|im_end|>",
    "<|im_start|> spaced <|im_end|> and partial <|im_ and <im_end>",
    "Ünïcödé àccents: café, naïve, résumé, Straße, ÆØÅ",
    "mixed\u200bzero\u200bwidth and combining e\u0301 a\u0308",
    "",
    " ",
    "a",
    "URL https://example.com/path?q=1&r=two#frag and email a.b@c.org",
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a color."},
    ],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Write a haiku about 中文 and 😀.\n\nThanks."},
    ],
    [
        {"role": "system", "content": "  padded system  "},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ],
]


@pytest.fixture(scope="module")
def reference():
    """transformers' tokenizer built from the default model's GGUF."""
    from transformers import AutoTokenizer

    path = default_model_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def ours():
    return Tokenizer.from_gguf(default_model_path())


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(ours, reference, text):
    for add_special_tokens in (True, False):
        expected = reference.encode(text, add_special_tokens=add_special_tokens)
        got = ours.encode(text, add_special_tokens=add_special_tokens)
        assert got == expected, (text, add_special_tokens)


@pytest.mark.parametrize("text", TEXTS)
def test_decode_matches_transformers_and_round_trips(ours, reference, text):
    ids = reference.encode(text, add_special_tokens=False)
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == reference.decode(
            ids, skip_special_tokens=skip
        )
    assert ours.decode(ours.encode(text), skip_special_tokens=False) == text
    assert ours.convert_ids_to_tokens(ids) == reference.convert_ids_to_tokens(ids)


def test_digits_are_split_one_by_one(ours):
    # SmolLM's pre-tokenizer (llama.cpp "smollm") isolates every digit.
    tokens = ours.convert_ids_to_tokens(ours.encode("year 2024", add_special_tokens=False))
    assert tokens[-4:] == ["2", "0", "2", "4"]


def test_special_token_attributes(ours, reference):
    assert ours.bos_token_id == reference.bos_token_id == 1
    assert ours.eos_token_id == reference.eos_token_id == 2
    assert ours.pad_token_id == reference.pad_token_id
    assert ours.unk_token_id == reference.unk_token_id
    assert ours.eos_token_ids == {2}
    assert ours.vocab_size == len(reference) == 49152
    assert set(reference.all_special_ids) <= ours.all_special_ids
    # every control token of the vocabulary is dropped when decoding with skip_special_tokens
    assert ours.all_special_ids == set(range(17))
    assert ours.decode(sorted(ours.all_special_ids)) == ""


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=lambda c: f"{len(c)}msgs")
def test_chat_template_matches_transformers(ours, reference, conversation, add_generation_prompt):
    expected = reference.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    got = ours.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt)
    assert got == expected


def test_chat_template_hf_semantics():
    """trim/lstrip blocks, raise_exception, tojson without HTML escaping, bos/eos variables."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import models

    backend = Backend(models.BPE(vocab={"<s>": 0, "</s>": 1}, merges=[]))
    template = (
        "{{ bos_token }}\n"
        "{% for m in messages %}\n"
        "    {% if m.role not in ['user', 'assistant'] %}"
        "{{ raise_exception('bad role ' + m.role) }}{% endif %}\n"
        "    {{ m.role }}={{ m.content | tojson }}{{ eos_token }}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}go:{% endif %}{{ extra }}"
    )
    tok = Tokenizer(backend, bos_token="<s>", eos_token="</s>", chat_template=template)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "<a> & 中"}], add_generation_prompt=True, extra="!"
    )
    # Newlines after block tags and indentation before them go; text around {{ }} stays.
    assert text == '<s>\n    user="<a> & 中"</s>\ngo:!'
    with pytest.raises(ValueError, match="bad role system"):
        tok.apply_chat_template([{"role": "system", "content": "x"}])


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([{"content": "no role"}], "role"),
        ([{"role": "user"}], "content"),
        ([{"role": "user", "content": 5}], "content"),
        (["just a string"], "dict"),
        ("a plain string", "list"),
        ([], "at least one"),
    ],
)
def test_malformed_messages_raise(ours, messages, match):
    with pytest.raises(ValueError, match=match):
        ours.apply_chat_template(messages)


def test_no_chat_template_raises(ours):
    bare = Tokenizer(ours.backend, bos_token="<|im_start|>", eos_token="<|im_end|>")
    with pytest.raises(ValueError, match="no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "hi"}])


def test_hf_dir_matches_transformers(reference, tmp_path):
    """tokenizer.json + tokenizer_config.json (as transformers saves them) load the same."""
    from transformers import AutoTokenizer

    reference.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [2, 0]}')
    ours = Tokenizer.from_hf_dir(tmp_path, generation_config={"eos_token_id": [2, 0]})
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert ours.encode(text) == reloaded.encode(text), text
    for conversation in CONVERSATIONS:
        assert ours.apply_chat_template(conversation) == reloaded.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True
        )
    assert ours.eos_token_ids == {0, 2}
    assert ours.bos_token_id == reloaded.bos_token_id


def test_hf_dir_add_bos_token_is_honoured(reference, tmp_path):
    import json

    reference.save_pretrained(tmp_path)
    config_file = tmp_path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["add_bos_token"] = True
    config_file.write_text(json.dumps(config))
    ours = Tokenizer.from_hf_dir(tmp_path)
    assert ours.encode("hi") == [ours.bos_token_id, *ours.encode("hi", add_special_tokens=False)]


def test_missing_tokenizer_json_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)


def test_encode_rejects_non_text(ours):
    with pytest.raises(ValueError, match="str"):
        ours.encode([1, 2, 3])


# a SentencePiece ("llama") GGUF vocabulary -------------------------------------------------------

SPM_PIECES = [
    "▁", "e", "t", "h", "a", "o", "l", "n", "i", "s", "r", "d", "w", "中", "▁t", "he", "▁the",
    "▁a", "in", "ll", "llo", "▁he", "▁hello", "er", "▁w", "or", "▁wor", "ld", "▁world", "▁in",
    "ing", "▁s", "▁sh", "▁中", "▁▁", "▁▁▁▁", "an", "▁an", "▁and", "re", "▁re", "es", "st",
]  # fmt: skip
SPM_TEXTS = [
    "hello world",
    "the world and the shell in a wording",
    "  two leading spaces and    runs",
    "Uppercase Hello, punctuation! ünïcode 中文 😀",
    "new\nlines\n\nand\ttabs",
    "<s>hello</s> world <ctrl> and <user>",
    "",
]


@pytest.fixture(scope="module")
def spm_gguf(tmp_path_factory):
    """A GGUF holding only a SentencePiece vocabulary: control, byte, normal, user tokens."""
    import gguf

    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{byte:02X}>" for byte in range(256)]]
    types = [2, 3, 3, *[6] * 256]
    tokens += SPM_PIECES + ["<ctrl>", "<user>"]
    types += [1] * len(SPM_PIECES) + [3, 4]
    scores = [0.0] * 259 + [-float(i) for i in range(len(SPM_PIECES))] + [0.0, 0.0]
    path = tmp_path_factory.mktemp("spm") / "spm.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_eot_token_id(tokens.index("<ctrl>"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_sentencepiece_gguf_matches_transformers(spm_gguf):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(spm_gguf.parent), gguf_file=spm_gguf.name)
    ours = Tokenizer.from_gguf(spm_gguf)
    assert ours.bos_token_id == reference.bos_token_id == 1
    assert ours.unk_token_id == reference.unk_token_id == 0
    # an end-of-turn token (Llama 3's <|eot_id|>) ends generation too
    assert ours.eos_token_ids == {2, ours.backend.token_to_id("<ctrl>")}
    for text in SPM_TEXTS:
        for add_special_tokens in (True, False):
            expected = reference.encode(text, add_special_tokens=add_special_tokens)
            assert ours.encode(text, add_special_tokens=add_special_tokens) == expected, text
        ids = reference.encode(text)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == reference.decode(
                ids, skip_special_tokens=skip
            ), (text, skip)
    # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise
    assert ours.encode("hello")[0] == 1
    assert ours.convert_ids_to_tokens(ours.encode("hello world", add_special_tokens=False)) == [
        "▁hello",
        "▁world",
    ]


def test_text_content_parts_are_joined_for_a_string_template(ours, reference):
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    expected = reference.apply_chat_template(
        [{"role": "user", "content": "first\nsecond"}], tokenize=False, add_generation_prompt=True
    )
    assert ours.apply_chat_template([{"role": "user", "content": parts}]) == expected
    image = [{"type": "image_url", "image_url": {"url": "http://x"}}]
    with pytest.raises(ValueError, match="'image_url'"):
        ours.apply_chat_template([{"role": "user", "content": image}])


def test_content_parts_reach_a_template_that_iterates_them():
    from tokenizers import Tokenizer as Backend
    from tokenizers import models

    template = (
        "{% for m in messages %}{% for p in m['content'] %}[{{ p.type }}:{{ p.text }}]"
        "{% endfor %}{% endfor %}"
    )
    tok = Tokenizer(Backend(models.BPE(vocab={"a": 0}, merges=[])), chat_template=template)
    parts = [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]
    assert tok.apply_chat_template([{"role": "user", "content": parts}]) == "[text:x][text:y]"
