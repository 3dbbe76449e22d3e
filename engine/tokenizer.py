"""The tokenizer: a `tokenizers.Tokenizer` plus the special tokens and chat template around it.

Two sources: a Hugging Face model directory (``tokenizer.json`` and friends) and a GGUF file's
vocabulary (see ``engine.loaders.gguf_vocab``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import processors

from engine.chat_template import render_chat_template
from engine.loaders.hf import read_json


class Tokenizer:
    """Wraps a ``tokenizers.Tokenizer`` with the model's special tokens and chat template.

    Attributes: ``bos_token_id``, ``eos_token_id``, ``eos_token_ids`` (every id that ends a
    generation: the tokenizer's eos plus generation_config's), ``pad_token_id``,
    ``unk_token_id``, ``all_special_ids`` (every added token marked special, which is what
    ``decode(skip_special_tokens=True)`` drops), ``vocab_size`` (tokenizer size including added
    tokens; the model's embedding may have more rows), ``chat_template``.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        unk_token: str | None = None,
        extra_eos_token_ids: Iterable[int] = (),
        chat_template: str | None = None,
    ) -> None:
        self.backend = backend
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.pad_token = pad_token
        self.unk_token = unk_token
        self.bos_token_id = self._id_of(bos_token)
        self.eos_token_id = self._id_of(eos_token)
        self.pad_token_id = self._id_of(pad_token)
        self.unk_token_id = self._id_of(unk_token)
        self.eos_token_ids: set[int] = set(extra_eos_token_ids)
        if self.eos_token_id is not None:
            self.eos_token_ids.add(self.eos_token_id)
        self.all_special_ids: set[int] = {
            token_id
            for token_id, added in backend.get_added_tokens_decoder().items()
            if added.special
        }
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.chat_template = chat_template

    def _id_of(self, token: str | None) -> int | None:
        if token is None:
            return None
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            raise ValueError(f"special token {token!r} is not in the tokenizer's vocabulary")
        return token_id

    # construction ----------------------------------------------------------------------------

    @classmethod
    def from_hf_dir(
        cls, path: str | Path, generation_config: Mapping[str, Any] | None = None
    ) -> Tokenizer:
        """Load ``tokenizer.json`` with ``tokenizer_config.json`` from a model directory.

        Special tokens, ``add_bos_token`` / ``add_eos_token`` and the chat template come from
        ``tokenizer_config.json`` (the template may also be in ``chat_template.jinja`` or
        ``chat_template.json``); generation_config's ``eos_token_id`` (an int or a list) joins
        ``eos_token_ids``. Raises ``FileNotFoundError`` when ``tokenizer.json`` is missing.
        """
        path = Path(path)
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(
                f"{tokenizer_file} not found: a model directory needs a fast-tokenizer "
                "tokenizer.json (a SentencePiece tokenizer.model alone is not supported)"
            )
        backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        config = read_json(path / "tokenizer_config.json")
        specials = {name: _token_text(config.get(name)) for name in _SPECIAL_NAMES}
        add_bos = config.get("add_bos_token")
        add_eos = config.get("add_eos_token")
        if add_bos is not None or add_eos is not None:
            # transformers rebuilds the post-processor from these flags (LlamaTokenizerFast).
            set_bos_eos_post_processor(
                backend,
                specials["bos_token"] if add_bos else None,
                specials["eos_token"] if add_eos else None,
            )
        generation_eos = (generation_config or {}).get("eos_token_id")
        if isinstance(generation_eos, int):
            generation_eos = [generation_eos]
        generation_eos = [token_id for token_id in generation_eos or () if token_id is not None]
        return cls(
            backend,
            **specials,
            extra_eos_token_ids=generation_eos or (),
            chat_template=_find_chat_template(path, config),
        )

    @classmethod
    def from_gguf(cls, reader_or_path: Any) -> Tokenizer:
        """Build the tokenizer from a GGUF file's vocabulary (a path or a ``gguf.GGUFReader``).

        Supported vocabularies: ``tokenizer.ggml.model`` ``gpt2`` (byte-level BPE) and
        ``llama`` (SentencePiece BPE). Raises ``ValueError`` for other kinds.
        """
        from engine.loaders.gguf_vocab import tokenizer_from_gguf

        return tokenizer_from_gguf(cls, reader_or_path)

    # encoding --------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special tokens written in the text map to their ids.

        ``add_special_tokens`` adds what the model's post-processor adds (BOS for most Llama
        tokenizers, nothing for SmolLM2).
        """
        if not isinstance(text, str):
            raise ValueError(f"encode() takes a str, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; bytes of an incomplete UTF-8 character come out as U+FFFD."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        """Vocabulary strings of ``ids`` (byte-level spelling, e.g. ``'Ġhello'``)."""
        tokens = []
        for token_id in ids:
            token = self.backend.id_to_token(int(token_id))
            if token is None:
                raise ValueError(f"token id {token_id} is outside the vocabulary [0, {len(self)})")
            tokens.append(token)
        return tokens

    def __len__(self) -> int:
        return self.vocab_size

    # chat ------------------------------------------------------------------------------------

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render a conversation to prompt text with the model's chat template.

        Extra ``kwargs`` become template variables. Raises ``ValueError`` when the model has no
        chat template or a message lacks a string ``role`` or a ``content``.
        """
        if not self.chat_template:
            raise ValueError(
                "this model has no chat template; pass a plain prompt instead of messages"
            )
        special_tokens = {
            "bos_token": self.bos_token or "",
            "eos_token": self.eos_token or "",
            "pad_token": self.pad_token or "",
            "unk_token": self.unk_token or "",
        }
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=special_tokens,
            **kwargs,
        )


_SPECIAL_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token")


def _token_text(value: Any) -> str | None:
    """A special token from tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _find_chat_template(path: Path, config: Mapping[str, Any]) -> str | None:
    template = config.get("chat_template")
    jinja_file = path / "chat_template.jinja"
    if template is None and jinja_file.is_file():
        template = jinja_file.read_text(encoding="utf-8")
    if template is None:
        template = read_json(path / "chat_template.json").get("chat_template")
    if isinstance(template, list):
        # Several named templates: the one named "default" is what apply_chat_template uses.
        named = {entry["name"]: entry["template"] for entry in template}
        template = named.get("default")
    return template


def set_bos_eos_post_processor(
    backend: tokenizers.Tokenizer, bos_token: str | None, eos_token: str | None
) -> None:
    """Make ``encode(add_special_tokens=True)`` add exactly ``bos_token`` / ``eos_token``."""
    single, pair, special_tokens = "$A:0", "$A:0 $B:1", []
    if bos_token is not None:
        bos_id = backend.token_to_id(bos_token)
        single, pair = f"{bos_token}:0 {single}", f"{bos_token}:0 $A:0 {bos_token}:1 $B:1"
        special_tokens.append((bos_token, bos_id))
    if eos_token is not None:
        eos_id = backend.token_to_id(eos_token)
        single = f"{single} {eos_token}:0"
        pair = pair.replace("$A:0", f"$A:0 {eos_token}:0") + f" {eos_token}:1"
        special_tokens.append((eos_token, eos_id))
    backend.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=special_tokens
    )
