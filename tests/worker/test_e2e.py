"""End to end: a bulk job through real Redis, a real worker process and S3 over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys

import boto3
import pytest

from producer import Client, JobHandle
from producer.jobs import JobState
from producer.settings import ProducerSettings
from tests.worker.conftest import BUCKET, REPO, make_lines, worker_env

pytestmark = pytest.mark.slow


def _client(redis_server, s3_endpoint, chunk_size: int = 16) -> Client:
    settings = ProducerSettings(
        broker_url=redis_server.url,
        storage_url=f"s3://{BUCKET}/jobs",
        s3_endpoint_url=s3_endpoint,
        chunk_size=chunk_size,
    )
    return Client(settings=settings)


def _tidal(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "producer.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _custom_id(raw: str) -> str | None:
    try:
        return json.loads(raw)["custom_id"]
    except json.JSONDecodeError:
        return None


def _strip(line: dict) -> dict:
    """An output line without ids and timestamps (they differ between runs)."""
    line = json.loads(json.dumps(line))
    line.pop("id")
    if line["response"]:
        line["response"].pop("request_id")
        body = line["response"]["body"]
        body.pop("id")
        body.pop("created")
    return line


def test_bulk_job_end_to_end(redis_server, s3_endpoint, tiny_model_dir, start_worker, tmp_path):
    lines = make_lines(104, num_bad=5)
    input_path = tmp_path / "input.jsonl"
    input_path.write_text("\n".join(lines) + "\n")
    client = _client(redis_server, s3_endpoint)
    env = worker_env(redis_server.url, s3_endpoint, tiny_model_dir, TIDAL_CHUNK_SIZE="16")
    job_id = _tidal(env, "submit", str(input_path)).strip()
    handle = JobHandle(client, job_id)
    status = handle.status()
    # 4 lines are malformed (known at once); the 5th is too long for the model (known later).
    assert status.num_lines == 104 and status.num_invalid == 4 and status.num_chunks == 7

    worker = start_worker(env)
    worker.wait_ready()
    results = handle.result(timeout_s=300)
    status = handle.status()
    assert status.state == JobState.COMPLETED, status
    assert status.num_succeeded == 99 and status.num_failed == 5 and status.num_duplicates == 0

    # Every line answered once, in input order, bad lines as error lines.
    assert [r["custom_id"] for r in results] == [_custom_id(ln) for ln in lines]
    errors = [r for r in results if r["error"] is not None]
    assert len(errors) == 5
    assert {e["error"]["code"] for e in errors} == {"invalid_request", "prompt_too_long"}
    ok = [r for r in results if r["error"] is None]
    assert all(r["response"]["body"]["usage"]["completion_tokens"] == 8 for r in ok)

    # Exactly one result object per chunk under the deterministic keys.
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    keys = sorted(
        o["Key"]
        for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"jobs/{handle.job_id}/")["Contents"]
    )
    result_keys = [k for k in keys if "/results/" in k]
    assert result_keys == [f"jobs/{handle.job_id}/results/part-{i:05d}.jsonl" for i in range(7)]
    assert f"jobs/{handle.job_id}/manifest.json" in keys
    manifest = json.loads(
        s3.get_object(Bucket=BUCKET, Key=f"jobs/{handle.job_id}/manifest.json")["Body"].read()
    )
    assert manifest["state"] == "completed" and manifest["num_succeeded"] == 99

    # One request through the client API: a job handle with result().
    single = client.submit(messages=[{"role": "user", "content": "Hi"}], priority="high",
                           custom_id="one", max_tokens=4, temperature=0)  # fmt: skip
    (answer,) = single.result(timeout_s=120)
    assert answer["custom_id"] == "one" and answer["error"] is None
    assert answer["response"]["body"]["usage"]["completion_tokens"] == 4
    prompt = client.submit(prompt=[1, 2, 3], max_tokens=2, logprobs=1).result(timeout_s=120)
    choice = prompt[0]["response"]["body"]["choices"][0]
    assert (
        len(choice["logprobs"]["tokens"]) == 2 and len(choice["logprobs"]["top_logprobs"][0]) == 1
    )

    # The CLI reads the same state and results.
    assert json.loads(_tidal(env, "status", job_id))["state"] == "completed"
    cli_out = tmp_path / "cli.out.jsonl"
    _tidal(env, "results", job_id, "-o", str(cli_out))
    assert [json.loads(ln) for ln in cli_out.read_text().splitlines()] == results

    # The same input through `tidal run` gives the same lines (except ids and timestamps).
    out_path = tmp_path / "local.out.jsonl"
    subprocess.run(
        [sys.executable, "-m", "producer.cli", "run", str(input_path), "-o", str(out_path),
         "--model", str(tiny_model_dir), "--device", "cpu", "--dtype", "float32",
         "--max-model-len", "512", "--no-progress"],
        cwd=REPO, check=True, env=worker_env(redis_server.url, s3_endpoint, tiny_model_dir),
    )  # fmt: skip
    local = [json.loads(ln) for ln in out_path.read_text().splitlines()]
    assert [_strip(r) for r in results] == [_strip(r) for r in local]
