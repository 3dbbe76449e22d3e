"""Quantization test fixtures (the root conftest runs Triton in its interpreter on CPU)."""

import json

import pytest


def write_byte_tokenizer(path) -> None:
    """A byte-level BPE tokenizer (one token per byte, no merges) with <s>, </s>, <unk>."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    specials = ("<unk>", "<s>", "</s>")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(specials)} | {c: i + 3 for i, c in enumerate(alphabet)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in specials])
    tokenizer.save(str(path / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A tiny random Llama saved by transformers, with a byte-level tokenizer.

    Dimensions are multiples of 32 so every group size of the tests divides them.
    """
    from tests.engine.conftest import save_tiny_model

    tokenizer_dir = tmp_path_factory.mktemp("byte-tokenizer")
    write_byte_tokenizer(tokenizer_dir)
    out = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_model(
        "llama", out, tokenizer_dir, vocab_size=512, intermediate_size=128,
        max_position_embeddings=256, tie_word_embeddings=False,
    )  # fmt: skip
    return out
