"""Engine test fixtures: tiny random models saved with transformers, and the default model."""

from __future__ import annotations

import pytest
import torch

from engine.default_model import default_model_path


@pytest.fixture(scope="session")
def default_tokenizer_dir(tmp_path_factory):
    """The default model's tokenizer saved in Hugging Face form (for tiny random models)."""
    from transformers import AutoTokenizer

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    out = tmp_path_factory.mktemp("tokenizer")
    tok.save_pretrained(out)
    return out


def write_wordlevel_tokenizer(out_dir, vocab_size: int) -> None:
    """A word-level tokenizer ("w0" ... "wN", split on spaces) for models fed token ids."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.save(str(out_dir / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.fixture(scope="session")
def wordlevel_tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("wordlevel-tokenizer")
    write_wordlevel_tokenizer(out, 49152)
    return out


def save_tiny_model(kind: str, out_dir, tokenizer_dir, **overrides):
    """Build a tiny random ``kind`` model with transformers and save it with the tokenizer."""
    import shutil

    import transformers

    common = dict(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
    )
    common.update(overrides)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        cls = transformers.Qwen2ForCausalLM
    elif kind == "mistral":
        cfg = transformers.MistralConfig(**common)
        cls = transformers.MistralForCausalLM
    else:
        raise ValueError(kind)
    torch.manual_seed(0)
    model = cls(cfg).eval()
    with torch.no_grad():  # larger weights than the default init, so logits are not flat
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(out_dir, safe_serialization=True)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, out_dir / f.name)
    return model
