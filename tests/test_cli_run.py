"""`tidal run` on the shipped examples with the default model: every line answered in input
order, bad lines as error lines that say what was wrong, exit code 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def tidal(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "producer.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_summarize_example_every_line_answered(tmp_path):
    out = tmp_path / "summarize.out.jsonl"
    proc = tidal("run", "examples/summarize.jsonl", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    inputs = read_jsonl(REPO / "examples/summarize.jsonl")
    outputs = read_jsonl(out)
    assert [o["custom_id"] for o in outputs] == [i["custom_id"] for i in inputs]
    for line in outputs:
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "chat.completion"
        choice = body["choices"][0]
        assert choice["message"]["role"] == "assistant" and choice["message"]["content"].strip()
        assert choice["finish_reason"] in ("stop", "length")
        usage = body["usage"]
        assert 0 < usage["completion_tokens"] <= 48
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"{len(inputs)} requests: {len(inputs)} ok, 0 failed")


def test_bad_lines_become_error_lines(tmp_path):
    out = tmp_path / "with_errors.out.jsonl"
    proc = tidal("run", "examples/with_errors.jsonl", "-o", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    outputs = read_jsonl(out)
    assert [o["custom_id"] for o in outputs] == [
        "ok-chat",
        None,
        "bad-url",
        "no-messages",
        "bad-temperature",
        "too-long",
        "ok-completion",
    ]
    errors = {o["custom_id"]: o["error"] for o in outputs if o["error"] is not None}
    assert errors[None]["message"].startswith("line is not valid JSON")
    assert (
        "url must be one of /v1/chat/completions, /v1/completions" in errors["bad-url"]["message"]
    )
    assert errors["no-messages"]["message"] == "body.messages: Field required"
    assert "body.temperature" in errors["bad-temperature"]["message"]
    assert errors["too-long"]["code"] == "prompt_too_long"
    assert "context of 8192 tokens" in errors["too-long"]["message"]
    for line in outputs:
        assert (line["response"] is None) == (line["error"] is not None)
    completion = outputs[-1]["response"]["body"]
    assert completion["object"] == "text_completion"
    logprobs = completion["choices"][0]["logprobs"]
    num_tokens = completion["usage"]["completion_tokens"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == num_tokens
    assert "".join(logprobs["tokens"]) == completion["choices"][0]["text"]
    for top, sampled in zip(logprobs["top_logprobs"], logprobs["token_logprobs"], strict=True):
        assert len(top) == 2 and max(top.values()) >= sampled - 1e-6
    assert "7 requests: 2 ok, 5 failed" in proc.stdout


def test_unreadable_input_and_bad_model_fail_clearly(tmp_path):
    proc = tidal("run", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o.jsonl"))
    assert proc.returncode == 1
    assert "cannot read input file" in proc.stderr and "missing.jsonl" in proc.stderr
    proc = tidal("run", "examples/with_errors.jsonl", "-o", str(tmp_path / "o.jsonl"),
                 "--model", str(tmp_path / "no-such-model"))  # fmt: skip
    assert proc.returncode == 1
    assert "cannot load model" in proc.stderr and "no-such-model" in proc.stderr
