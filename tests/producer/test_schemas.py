"""Input line validation: every bad line is refused with a message that says what is wrong."""

from __future__ import annotations

import json

import pytest

from producer import schemas

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def _line(**overrides):
    line = {"custom_id": "a", "method": "POST", "url": schemas.CHAT_URL, "body": dict(CHAT)}
    line.update(overrides)
    return json.dumps(line)


def test_valid_chat_and_completion_lines_parse():
    chat = schemas.parse_input_line(_line(body={**CHAT, "max_tokens": 5, "stop": "x"}))
    assert isinstance(chat.body, schemas.ChatBody)
    assert chat.body.max_new_tokens() == 5 and chat.body.stop_list() == ["x"]
    assert chat.body.num_logprobs() is None
    completion = schemas.parse_input_line(
        _line(url=schemas.COMPLETIONS_URL, body={"prompt": [1, 2, 3], "logprobs": 2})
    )
    assert isinstance(completion.body, schemas.CompletionBody)
    assert completion.body.prompt == [1, 2, 3] and completion.body.num_logprobs() == 2


def test_chat_logprobs_follow_openai_fields():
    line = schemas.parse_input_line(_line(body={**CHAT, "logprobs": True, "top_logprobs": 3}))
    assert line.body.num_logprobs() == 3
    assert schemas.parse_input_line(_line(body={**CHAT, "logprobs": True})).body.num_logprobs() == 0
    assert (
        schemas.parse_input_line(
            _line(body={**CHAT, "max_completion_tokens": 7})
        ).body.max_new_tokens()
        == 7
    )


@pytest.mark.parametrize(
    ("raw", "custom_id", "fragment"),
    [
        ("{not json", None, "not valid JSON"),
        ("[1, 2]", None, "must be a JSON object"),
        (_line(url="/v1/embeddings"), "a", "url must be one of /v1/chat/completions"),
        (_line(body={"max_tokens": 3}), "a", "body.messages: Field required"),
        (_line(body={**CHAT, "temperature": -1}), "a", "body.temperature"),
        (_line(body={**CHAT, "top_p": 0}), "a", "body.top_p"),
        (_line(body={**CHAT, "n": 0}), "a", "body.n"),
        (_line(body={**CHAT, "max_tokens": 0}), "a", "body.max_tokens"),
        (_line(body={**CHAT, "colour": 1}), "a", "allowed: frequency_penalty"),
        (_line(body={**CHAT, "stream": True}), "a", "body.stream"),
        (_line(body={**CHAT, "top_logprobs": 2}), "a", "top_logprobs needs logprobs"),
        (_line(body={**CHAT, "min_tokens": 9, "max_tokens": 3}), "a", "min_tokens (9)"),
        (_line(body={**CHAT, "stop": ["a", ""]}), "a", "stop must be"),
        (_line(body={"messages": [{"role": "robot", "content": "x"}]}), "a", "role"),
        (_line(custom_id=""), "", "custom_id must be a non-empty string"),
        (_line(method="GET"), "a", "method must be 'POST'"),
        (_line(extra=1), "a", "unknown line fields ['extra']"),
        (_line(url=schemas.COMPLETIONS_URL, body={"prompt": []}), "a", "empty list"),
    ],
)
def test_bad_lines_say_what_is_wrong(raw, custom_id, fragment):
    with pytest.raises(schemas.InvalidLine) as info:
        schemas.parse_input_line(raw)
    assert fragment in str(info.value)
    assert info.value.custom_id == custom_id


def test_line_ids_sort_in_input_order():
    ids = [schemas.line_id("job-x_y", i) for i in (0, 7, 123, 99999)]
    assert [schemas.line_index_of(i) for i in ids] == [0, 7, 123, 99999]
    assert sorted(ids) == ids
