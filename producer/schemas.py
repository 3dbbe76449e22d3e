"""Job line formats: OpenAI Batch input and output lines, validated with pydantic.

An input line is ``{"custom_id", "method": "POST", "url", "body"}``; ``body`` carries the
OpenAI fields that make sense offline plus vLLM's sampling extras. Ranges here match
``engine.SamplingParams`` so that a bad value is caught at submission, without torch.
An output line is ``{"id", "custom_id", "response": {"status_code", "request_id", "body"},
"error"}``; a bad line gets ``response: null`` and ``error: {"code", "message"}``.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
URLS = (CHAT_URL, COMPLETIONS_URL)

# Error codes of output lines.
INVALID_REQUEST = "invalid_request"  # the line or its body is malformed or out of range
PROMPT_TOO_LONG = "prompt_too_long"  # prompt (+ max_tokens) beyond the model's context
CANCELLED = "cancelled"  # the job was cancelled before this request finished
ENGINE_ERROR = "engine_error"  # the engine failed on this request


class InvalidLine(ValueError):
    """A batch input line that can never run; ``custom_id`` is set when it could be read."""

    def __init__(self, message: str, custom_id: str | None = None) -> None:
        super().__init__(message)
        self.custom_id = custom_id


class ChatMessage(BaseModel):
    """One chat message; ``content`` is text or a list of ``{"type": "text", "text"}`` parts."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]]
    name: str | None = None

    def text(self) -> str:
        """The message text, with text parts joined."""
        if isinstance(self.content, str):
            return self.content
        texts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(
                    f"message content parts must be {{'type': 'text', 'text': str}}, got {part!r}"
                )
            texts.append(part["text"])
        return "".join(texts)


class _SamplingBody(BaseModel):
    """Body fields shared by chat and text completions (OpenAI names plus vLLM extras)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=16)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    top_k: int = Field(default=0, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    user: str | None = None
    stream: Literal[False] = False

    @model_validator(mode="after")
    def _check_stop(self) -> _SamplingBody:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(stops) > 4 or not all(stops):
            raise ValueError(
                "stop must be a non-empty string or a list of up to 4 non-empty strings"
            )
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})"
            )
        return self

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatBody(_SamplingBody):
    """Body of a ``/v1/chat/completions`` line."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @model_validator(mode="after")
    def _check_chat(self) -> ChatBody:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        for message in self.messages:
            message.text()
        return self

    def num_logprobs(self) -> int | None:
        """vLLM's ``logprobs``: how many alternatives per position, or None for none."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionBody(_SamplingBody):
    """Body of a ``/v1/completions`` line; ``prompt`` is text or a list of token ids."""

    prompt: str | list[int]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: Literal[False] = False

    @model_validator(mode="after")
    def _check_prompt(self) -> CompletionBody:
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be an empty list of token ids")
        return self

    def num_logprobs(self) -> int | None:
        return self.logprobs

    def max_new_tokens(self) -> int | None:
        return self.max_tokens


class BatchInputLine(BaseModel):
    """One OpenAI Batch input line with its body parsed for its ``url``."""

    model_config = ConfigDict(extra="forbid")

    custom_id: str = Field(min_length=1)
    method: Literal["POST"] = "POST"
    url: Literal["/v1/chat/completions", "/v1/completions"]
    body: ChatBody | CompletionBody


def _describe(error: ValidationError, model: type[BaseModel], prefix: str = "") -> str:
    """One clause per problem: ``where: what`` (pydantic's text says what range is allowed)."""
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden" and len(item["loc"]) == 1:
            message = f"unknown field; allowed: {', '.join(sorted(model.model_fields))}"
        parts.append(f"{prefix}{where}: {message}" if where else f"{prefix}{message}")
    return "; ".join(parts)


def parse_input_line(raw: str | bytes) -> BatchInputLine:
    """Parse and validate one input line. Raises ``InvalidLine`` saying what is wrong."""
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidLine(f"line is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise InvalidLine(f"line must be a JSON object, got {type(obj).__name__}")
    custom_id = obj.get("custom_id") if isinstance(obj.get("custom_id"), str) else None
    url = obj.get("url")
    if url not in URLS:
        raise InvalidLine(f"url must be one of {', '.join(URLS)}; got {url!r}", custom_id)
    body = obj.get("body")
    if not isinstance(body, dict):
        raise InvalidLine("body must be a JSON object", custom_id)
    body_model = ChatBody if url == CHAT_URL else CompletionBody
    try:
        parsed_body = body_model.model_validate(body)
        envelope = {k: v for k, v in obj.items() if k != "body"}
        _check_envelope(envelope)
        line = BatchInputLine.model_construct(
            custom_id=envelope.get("custom_id"),
            method=envelope.get("method", "POST"),
            url=url,
            body=parsed_body,
        )
    except ValidationError as exc:
        raise InvalidLine(_describe(exc, body_model, "body."), custom_id) from None
    except ValueError as exc:
        raise InvalidLine(str(exc), custom_id) from None
    return line


def _check_envelope(envelope: dict[str, Any]) -> None:
    allowed = {"custom_id", "method", "url"}
    extra = sorted(set(envelope) - allowed)
    if extra:
        raise ValueError(f"unknown line fields {extra}; allowed: custom_id, method, url, body")
    if not isinstance(envelope.get("custom_id"), str) or not envelope["custom_id"]:
        raise ValueError("custom_id must be a non-empty string")
    if envelope.get("method", "POST") != "POST":
        raise ValueError(f"method must be 'POST', got {envelope.get('method')!r}")


def error_line(line_id: str, custom_id: str | None, code: str, message: str) -> dict[str, Any]:
    """An output line for a request that produced no response."""
    return {
        "id": line_id,
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def response_line(line_id: str, custom_id: str, request_id: str, body: dict) -> dict[str, Any]:
    """An output line carrying a 200 response body."""
    return {
        "id": line_id,
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": request_id, "body": body},
        "error": None,
    }


def line_id(run_id: str, line_index: int) -> str:
    """The output line id: ``batch_req_<run>_<index>``; sorting by it gives input order."""
    return f"batch_req_{run_id}_{line_index:08d}"


def line_index_of(output_id: str) -> int:
    """The input line index encoded in an output line id."""
    return int(output_id.rsplit("_", 1)[1])
