"""Engine logprobs in OpenAI's two shapes (chat ``content`` list, legacy completions arrays)."""

from __future__ import annotations

from typing import Any, Protocol

from engine.outputs import CompletionOutput, Logprob


class _Decoder(Protocol):
    def decode(self, ids: list[int]) -> str: ...


def _token_text(token_id: int, logprob: Logprob | None, tokenizer: _Decoder) -> str:
    if logprob is not None and logprob.decoded_token is not None:
        return logprob.decoded_token
    return tokenizer.decode([token_id])


def _ranked(position: dict[int, Logprob]) -> list[tuple[int, Logprob]]:
    """Alternatives at one position, most likely first."""
    return sorted(position.items(), key=lambda item: -item[1].logprob)


def _positions(completion: CompletionOutput):
    """(sampled token id, its Logprob or None, the top alternatives) per generated token."""
    logprobs = completion.logprobs or []
    for i, token_id in enumerate(completion.token_ids):
        position = logprobs[i] if i < len(logprobs) else {}
        yield token_id, position.get(token_id), _ranked(position)


def chat_logprobs(
    completion: CompletionOutput, tokenizer: _Decoder, num_top: int
) -> dict[str, Any]:
    """``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}``;
    ``num_top`` alternatives per position, most likely first."""
    content = []
    for token_id, sampled, ranked in _positions(completion):
        text = _token_text(token_id, sampled, tokenizer)
        content.append(
            {
                "token": text,
                "logprob": sampled.logprob if sampled is not None else None,
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [
                    {
                        "token": (alt_text := _token_text(tid, lp, tokenizer)),
                        "logprob": lp.logprob,
                        "bytes": list(alt_text.encode("utf-8")),
                    }
                    for tid, lp in ranked[:num_top]
                ],
            }
        )
    return {"content": content}


def completion_logprobs(
    completion: CompletionOutput, tokenizer: _Decoder, num_top: int
) -> dict[str, Any]:
    """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` (legacy completions)."""
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    offset = 0
    for token_id, sampled, ranked in _positions(completion):
        text = _token_text(token_id, sampled, tokenizer)
        tokens.append(text)
        token_logprobs.append(sampled.logprob if sampled is not None else None)
        top_logprobs.append(
            {_token_text(tid, lp, tokenizer): lp.logprob for tid, lp in ranked[:num_top]}
        )
        text_offset.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }
