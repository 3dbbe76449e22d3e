"""Chat templates rendered with jinja2 the way Hugging Face transformers renders them.

A chat template is untrusted code that ships with a model, so it runs in jinja2's immutable
sandbox. The environment matches transformers' ``apply_chat_template``: ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter that does not escape HTML
and keeps non-ASCII text, and the ``raise_exception`` and ``strftime_now`` globals.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja2's own tojson escapes <, >, & and ' for HTML; templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@functools.lru_cache(maxsize=16)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compile ``template`` in the sandboxed environment (cached by template text).

    Raises ``ValueError`` when the template is not valid jinja2.
    """
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ValueError(f"the model's chat template is not valid jinja2: {exc}") from exc


# A template that loops over a message's content takes OpenAI-style lists of content parts.
_ITERATES_CONTENT = re.compile(
    r"\{%-?\s*for\s+\w+\s+in\s+\w+\s*(\[\s*['\"]content['\"]\s*\]|\.content)"
)


def takes_content_parts(template: str) -> bool:
    """Whether ``template`` iterates over ``message.content`` (vLLM's "openai" content format)."""
    return _ITERATES_CONTENT.search(template) is not None


def flatten_text_parts(index: int, content: list[Any]) -> str:
    """OpenAI content parts ``[{"type": "text", "text": ...}, ...]`` joined by newlines."""
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and part.get("type") == "text" and "text" in part:
            texts.append(str(part["text"]))
        else:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise ValueError(
                f"message {index} has a content part of type {kind!r}; only text parts "
                "({'type': 'text', 'text': ...}) are supported"
            )
    return "\n".join(texts)


def validate_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Check a conversation and return it as a list of plain dicts.

    Every message must be a mapping with a string ``role`` and a ``content`` that is a string or
    a list of content parts; ``content`` may be ``None`` only on a message carrying
    ``tool_calls``. Raises ``ValueError`` naming the first bad message otherwise.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(
            f"messages must be a list of {{'role': ..., 'content': ...}} dicts, "
            f"got {type(messages).__name__}"
        )
    if not messages:
        raise ValueError("messages must hold at least one message, got an empty list")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(
                f"message {index} must be a dict with 'role' and 'content', "
                f"got {type(message).__name__}"
            )
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError(f"message {index} needs a non-empty string 'role', got {role!r}")
        if "content" not in message:
            raise ValueError(f"message {index} (role {role!r}) has no 'content'")
        content = message["content"]
        is_tool_call = content is None and message.get("tool_calls")
        if not (isinstance(content, (str, list)) or is_tool_call):
            raise ValueError(
                f"message {index} (role {role!r}) needs 'content' as a string or a list of "
                f"content parts, got {type(content).__name__}"
            )
        checked.append(dict(message))
    return checked


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str | None] | None = None,
    **kwargs: Any,
) -> str:
    """Render ``messages`` with ``template`` and return the prompt text.

    ``special_tokens`` supplies template variables such as ``bos_token`` and ``eos_token``;
    ``kwargs`` (for example ``tools`` or ``documents``) are passed to the template as variables
    too. Lists of text parts are joined into one string unless the template iterates over
    content itself. Raises ``ValueError`` for malformed messages and for errors the template
    raises (``raise_exception``) or hits (adding a list to a string).
    """
    checked = validate_messages(messages)
    if not takes_content_parts(template):
        # A template that concatenates content as a string gets text parts joined, as in vLLM.
        for index, message in enumerate(checked):
            if isinstance(message["content"], list):
                message["content"] = flatten_text_parts(index, message["content"])
    compiled = compile_chat_template(template)
    variables: dict[str, Any] = {"tools": None, "documents": None}
    variables.update(special_tokens or {})
    variables.update(kwargs)
    try:
        return compiled.render(
            messages=checked, add_generation_prompt=add_generation_prompt, **variables
        )
    except (jinja2.exceptions.TemplateError, TypeError) as exc:
        raise ValueError(f"the chat template rejected the conversation: {exc}") from exc
