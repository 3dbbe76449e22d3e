"""The batch logic shared by ``tidal run`` and the Celery chunk task.

An input line becomes an engine request (chat messages rendered with the engine tokenizer's
chat template; prompt text encoded; ``SamplingParams`` from the body), or an error line that
says what was wrong. A finished ``RequestOutput`` becomes an OpenAI Batch output line with a
``chat.completion`` or ``text_completion`` body (usage, finish_reason, logprobs in OpenAI's
shape when asked).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any, Protocol

from engine.outputs import CompletionOutput, RequestOutput
from engine.sampling_params import SamplingParams
from producer import schemas
from worker.logprobs import chat_logprobs, completion_logprobs


class Tokenizer(Protocol):
    """What batch.py needs from ``engine.tokenizer.Tokenizer``."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True
    ) -> str: ...


@dataclass
class PreparedLine:
    """One input line, ready for the engine (``error`` is None) or already answered."""

    line_index: int
    custom_id: str | None
    url: str | None = None
    prompt_token_ids: list[int] | None = None
    params: SamplingParams | None = None
    model: str = ""
    error: tuple[str, str] | None = None  # (code, message)


def prepare_line(
    raw: str | bytes, line_index: int, tokenizer: Tokenizer, max_model_len: int, model_name: str
) -> PreparedLine:
    """Parse, validate and tokenize one input line; problems become ``error``."""
    try:
        line = schemas.parse_input_line(raw)
    except schemas.InvalidLine as exc:
        return PreparedLine(line_index, exc.custom_id, error=(schemas.INVALID_REQUEST, str(exc)))
    body = line.body
    prepared = PreparedLine(
        line_index, line.custom_id, url=line.url, model=body.model or model_name
    )
    try:
        prepared.params = SamplingParams(
            n=body.n,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            min_p=body.min_p,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            repetition_penalty=body.repetition_penalty,
            seed=body.seed,
            stop=body.stop_list(),
            ignore_eos=body.ignore_eos,
            max_tokens=body.max_new_tokens(),
            min_tokens=body.min_tokens,
            logprobs=body.num_logprobs(),
        )
    except ValueError as exc:
        prepared.error = (schemas.INVALID_REQUEST, f"body: {exc}")
        return prepared
    if isinstance(body, schemas.ChatBody):
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        # The template already holds any BOS token it wants.
        prepared.prompt_token_ids = tokenizer.encode(text, add_special_tokens=False)
    elif isinstance(body.prompt, str):
        prepared.prompt_token_ids = tokenizer.encode(body.prompt)
    else:
        prepared.prompt_token_ids = list(body.prompt)
    num_prompt_tokens = len(prepared.prompt_token_ids)
    num_new_tokens = prepared.params.max_tokens or 1
    if num_prompt_tokens + num_new_tokens > max_model_len:
        prepared.error = (
            schemas.PROMPT_TOO_LONG,
            f"prompt ({num_prompt_tokens} tokens) + max_tokens ({num_new_tokens}) is longer "
            f"than the model's context of {max_model_len} tokens; shorten the prompt "
            "or lower max_tokens",
        )
    return prepared


def _choice(url: str, completion: CompletionOutput, tokenizer: Tokenizer, num_top: int | None):
    reason = completion.finish_reason if completion.finish_reason in ("stop", "length") else "stop"
    if url == schemas.CHAT_URL:
        return {
            "index": completion.index,
            "message": {"role": "assistant", "content": completion.text},
            "logprobs": chat_logprobs(completion, tokenizer, num_top)
            if num_top is not None
            else None,
            "finish_reason": reason,
        }
    return {
        "index": completion.index,
        "text": completion.text,
        "logprobs": completion_logprobs(completion, tokenizer, num_top)
        if num_top is not None
        else None,
        "finish_reason": reason,
    }


def response_body(
    prepared: PreparedLine, output: RequestOutput, tokenizer: Tokenizer, created: int
) -> dict[str, Any]:
    """The ``chat.completion`` / ``text_completion`` body of a finished request."""
    assert prepared.params is not None and prepared.url is not None
    is_chat = prepared.url == schemas.CHAT_URL
    num_prompt_tokens = len(output.prompt_token_ids)
    num_completion_tokens = sum(len(c.token_ids) for c in output.outputs)
    return {
        "id": f"{'chatcmpl' if is_chat else 'cmpl'}-{output.request_id}",
        "object": "chat.completion" if is_chat else "text_completion",
        "created": created,
        "model": prepared.model,
        "choices": [
            _choice(prepared.url, c, tokenizer, prepared.params.logprobs) for c in output.outputs
        ],
        "usage": {
            "prompt_tokens": num_prompt_tokens,
            "completion_tokens": num_completion_tokens,
            "total_tokens": num_prompt_tokens + num_completion_tokens,
        },
    }


def num_generated_tokens(output: RequestOutput) -> int:
    return sum(len(c.token_ids) for c in output.outputs)


class Submitter(Protocol):
    """The part of ``engine.engine_loop.EngineLoop`` that run_lines uses."""

    def submit(
        self, request_id: str, prompt: str | list[int], params: SamplingParams, priority: int = 0
    ) -> Future: ...
    def abort(self, request_id: str) -> None: ...


ABORT_GRACE_S = 10.0  # how long aborted requests may take to report back

# on_done(output line, finished RequestOutput or None for an error line)
DoneCallback = Callable[[dict[str, Any], RequestOutput | None], None]


def run_lines(
    raw_lines: Iterable[str | bytes],
    *,
    first_index: int,
    loop: Submitter,
    tokenizer: Tokenizer,
    max_model_len: int,
    model_name: str,
    run_id: str,
    priority: int = 0,
    on_done: DoneCallback | None = None,
    should_cancel: Callable[[], bool] | None = None,
    poll_s: float = 0.25,
) -> list[dict[str, Any]]:
    """Run input lines through the engine loop; return their output lines in input order.

    Every line gets exactly one output line. Bad lines and requests the engine refuses become
    error lines; ``should_cancel`` (polled) aborts what is still running, which then gets
    ``cancelled`` error lines. ``EngineDeadError`` propagates: the caller must not ack.
    """
    created = int(time.time())
    attempt = uuid.uuid4().hex[:8]  # a redelivered copy may share this process's engine
    lines: list[dict[str, Any] | None] = []
    pending: dict[Future, tuple[PreparedLine, str]] = {}

    def finish(position: int, line: dict[str, Any], output: RequestOutput | None) -> None:
        lines[position] = line
        if on_done is not None:
            on_done(line, output)

    def fail(position: int, prepared: PreparedLine, code: str, message: str) -> None:
        line_id = schemas.line_id(run_id, prepared.line_index)
        finish(position, schemas.error_line(line_id, prepared.custom_id, code, message), None)

    for offset, raw in enumerate(raw_lines):
        lines.append(None)
        prepared = prepare_line(raw, first_index + offset, tokenizer, max_model_len, model_name)
        if prepared.error is not None:
            fail(offset, prepared, *prepared.error)
            continue
        assert prepared.prompt_token_ids is not None and prepared.params is not None
        request_id = f"{run_id}-{prepared.line_index}-{attempt}"
        try:
            future = loop.submit(request_id, prepared.prompt_token_ids, prepared.params, priority)
        except ValueError as exc:
            fail(offset, prepared, schemas.INVALID_REQUEST, str(exc))
            continue
        pending[future] = (prepared, request_id)
    positions = {f: p.line_index - first_index for f, (p, _) in pending.items()}
    cancelled_at: float | None = None
    while pending:
        done, _ = wait(list(pending), timeout=poll_s, return_when=FIRST_COMPLETED)
        for future in done:
            prepared, _ = pending.pop(future)
            _settle(future, prepared, positions[future], run_id, tokenizer, created, finish, fail)
        if cancelled_at is None and pending and should_cancel is not None and should_cancel():
            cancelled_at = time.monotonic()
            for _prepared, request_id in pending.values():
                loop.abort(request_id)
        elif cancelled_at is not None and time.monotonic() - cancelled_at > ABORT_GRACE_S:
            for future, (prepared, _) in list(pending.items()):
                del pending[future]
                fail(positions[future], prepared, schemas.CANCELLED, "the job was cancelled")
    assert all(line is not None for line in lines)
    return lines  # type: ignore[return-value]


def _settle(future, prepared, position, run_id, tokenizer, created, finish, fail) -> None:
    from engine.engine_loop import EngineDeadError

    try:
        output: RequestOutput = future.result()
    except EngineDeadError:
        raise
    except Exception as exc:  # the engine failed this one request, not itself
        fail(position, prepared, schemas.ENGINE_ERROR, f"{type(exc).__name__}: {exc}")
        return
    if any(c.finish_reason == "abort" for c in output.outputs):
        fail(position, prepared, schemas.CANCELLED, "the job was cancelled before this finished")
        return
    body = response_body(prepared, output, tokenizer, created)
    line_id = schemas.line_id(run_id, prepared.line_index)
    finish(
        position,
        schemas.response_line(line_id, prepared.custom_id, output.request_id, body),
        output,
    )
