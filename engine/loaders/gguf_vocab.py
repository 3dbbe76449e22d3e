"""A `tokenizers.Tokenizer` rebuilt from a GGUF file's vocabulary.

A GGUF has no tokenizer.json: llama.cpp stores the vocabulary (``tokenizer.ggml.tokens``), the
BPE merges, a type per token (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte),
the special token ids and the name of the pre-tokenizer (``tokenizer.ggml.pre``). This module
turns those back into what the original tokenizer.json described, following transformers'
GGUF converter (``integrations/gguf/gguf_tokenizer_mapping.py``) and llama.cpp's
``llama-vocab.cpp`` for the pre-tokenizer regexes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from engine.loaders.gguf_meta import gguf_value, open_gguf

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# tokenizer.ggml.pre -> the split regex applied before byte-level encoding.
_SPLIT_REGEXES = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "gpt-4o": _GPT4O_SPLIT,
    "llama4": _GPT4O_SPLIT,
}
# Pre-tokenizers that are GPT-2's regex, some after splitting every digit on its own.
_GPT2_LIKE = {"default", "gpt2", "gpt-2", "smollm", "starcoder", "refact"}
_DIGIT_SPLIT_FIRST = {"smollm", "starcoder", "refact"}


def _byte_level_pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    if pre in _SPLIT_REGEXES:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLIT_REGEXES[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if pre not in _GPT2_LIKE and pre is not None:
        logger.warning(
            "GGUF pre-tokenizer %r is not known here; using GPT-2's split (known: %s)",
            pre,
            sorted(_GPT2_LIKE | set(_SPLIT_REGEXES)),
        )
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_SPLIT_FIRST:
        # llama.cpp splits on \p{N} first; the original tokenizer.json has Digits(individual).
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return byte_level


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (the byte-level BPE alphabet)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, codes), strict=True))


def _merges(reader: gguf.GGUFReader, tokens: list[str], scores: list[float] | None) -> list:
    merges = gguf_value(reader, "tokenizer.ggml.merges")
    if merges is not None:
        return [tuple(merge.split(" ", 1)) for merge in merges]
    if scores is None:
        raise ValueError("the GGUF vocabulary has neither merges nor scores to derive them from")
    # SentencePiece BPE without merges: every split of a token into two vocabulary tokens is a
    # merge, the merged token's score ranks it (then longer left, longer right pieces first):
    # transformers' generate_merges, whose order decides ties between equal scores.
    vocab = {token: index for index, token in enumerate(tokens)}
    ranked = []
    for token, score in dict(zip(tokens, scores, strict=True)).items():
        local = [
            (token[:cut], token[cut:], score)
            for cut in range(1, len(token))
            if token[:cut] in vocab and token[cut:] in vocab
        ]
        local.sort(key=lambda merge: (vocab[merge[0]], vocab[merge[1]]))
        ranked.extend(local)
    ranked.sort(key=lambda merge: (merge[2], len(merge[0]), len(merge[1])), reverse=True)
    return [(left, right) for left, right, _ in ranked]


def _bpe(**kwargs: Any) -> models.BPE:
    try:
        return models.BPE(**kwargs)
    except Exception as exc:  # tokenizers raises a bare Exception for a bad vocabulary
        raise ValueError(f"the GGUF vocabulary is inconsistent: {exc}") from exc


def _byte_level_backend(reader: gguf.GGUFReader, tokens: list[str]) -> tokenizers.Tokenizer:
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        token
        if set(token) <= alphabet
        else "".join(spelling[byte] for byte in token.encode("utf-8")): index
        for index, token in enumerate(tokens)
    }
    model = _bpe(
        vocab=vocab,
        merges=_merges(reader, tokens, None),
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
        byte_fallback=False,
    )
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = _byte_level_pre_tokenizer(gguf_value(reader, "tokenizer.ggml.pre"))
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece_backend(reader: gguf.GGUFReader, tokens: list[str]) -> tokenizers.Tokenizer:
    """SentencePiece BPE as transformers' LlamaTokenizer (legacy=False) builds it."""
    model = _bpe(
        vocab={token: index for index, token in enumerate(tokens)},
        merges=_merges(reader, tokens, gguf_value(reader, "tokenizer.ggml.scores")),
        fuse_unk=True,
        byte_fallback=True,
    )
    backend = tokenizers.Tokenizer(model)
    add_space_prefix = gguf_value(reader, "tokenizer.ggml.add_space_prefix", True)
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first" if add_space_prefix else "never", split=False
    )
    strip = [decoders.Strip(" ", 1, 0)] if add_space_prefix else []
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    return backend


def _add_special_tokens(
    backend: tokenizers.Tokenizer, tokens: list[str], token_types: list[int] | None, vocab_kind: str
) -> None:
    """Keep control tokens (special) and user-defined tokens (not special) whole in text."""
    if not token_types:
        return
    alphabet = set(_bytes_to_unicode().values()) if vocab_kind == "gpt2" else None
    control = [
        AddedToken(token, normalized=False, special=True)
        for token, token_type in zip(tokens, token_types, strict=True)
        if token_type == TOKEN_TYPE_CONTROL and (alphabet is None or set(token) <= alphabet)
    ]
    user_defined = [
        AddedToken(token, normalized=False, special=False)
        for token, token_type in zip(tokens, token_types, strict=True)
        if token_type == TOKEN_TYPE_USER_DEFINED
    ]
    backend.add_special_tokens(control)
    backend.add_tokens(user_defined)


def tokenizer_from_gguf(cls: type[Tokenizer], reader_or_path: Any) -> Tokenizer:
    """Build ``cls`` (engine.tokenizer.Tokenizer) from a GGUF reader or path."""
    from engine.tokenizer import set_bos_eos_post_processor

    reader = reader_or_path
    if isinstance(reader_or_path, (str, Path)):
        reader = open_gguf(reader_or_path)
    vocab_kind = gguf_value(reader, "tokenizer.ggml.model")
    tokens = gguf_value(reader, "tokenizer.ggml.tokens")
    if vocab_kind is None or tokens is None:
        raise ValueError("the GGUF file has no tokenizer (tokenizer.ggml.model / .tokens missing)")
    if vocab_kind == "gpt2":
        backend = _byte_level_backend(reader, tokens)
    elif vocab_kind == "llama":
        backend = _sentencepiece_backend(reader, tokens)
    else:
        raise ValueError(
            f"GGUF tokenizer.ggml.model {vocab_kind!r} is not supported; "
            "supported: 'gpt2' (byte-level BPE) and 'llama' (SentencePiece BPE)"
        )
    token_types = gguf_value(reader, "tokenizer.ggml.token_type")
    _add_special_tokens(backend, tokens, token_types, vocab_kind)

    def token(key: str) -> str | None:
        token_id = gguf_value(reader, f"tokenizer.ggml.{key}")
        return tokens[token_id] if token_id is not None else None

    bos_token, eos_token = token("bos_token_id"), token("eos_token_id")
    pad_token, unk_token = token("padding_token_id"), token("unknown_token_id")
    # The named special tokens are special even where the file types them otherwise (<unk>).
    named = [name for name in (bos_token, eos_token, pad_token, unk_token) if name is not None]
    backend.add_special_tokens([AddedToken(name, normalized=False, special=True) for name in named])
    # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise.
    add_bos = gguf_value(reader, "tokenizer.ggml.add_bos_token", vocab_kind == "llama")
    add_eos = gguf_value(reader, "tokenizer.ggml.add_eos_token", False)
    set_bos_eos_post_processor(
        backend, bos_token if add_bos else None, eos_token if add_eos else None
    )
    # End-of-turn / end-of-message tokens also end a generation (Llama 3's <|eot_id|>).
    extra_eos = [
        token_id
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
        if (token_id := gguf_value(reader, key)) is not None
    ]
    return cls(
        backend,
        bos_token=bos_token,
        eos_token=eos_token,
        pad_token=pad_token,
        unk_token=unk_token,
        extra_eos_token_ids=extra_eos,
        chat_template=gguf_value(reader, "tokenizer.chat_template"),
    )
