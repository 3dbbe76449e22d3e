"""Quantization test fixtures (the root conftest runs Triton in its interpreter on CPU)."""

import json

import pytest
import torch


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
    import transformers

    out = tmp_path_factory.mktemp("tiny-llama")
    cfg = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # larger weights than the default init, so logits are not flat
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(out, safe_serialization=True)
    write_byte_tokenizer(out)
    return out
