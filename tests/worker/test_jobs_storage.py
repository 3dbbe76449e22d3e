"""Storage (first writer wins, byte ranges, clear errors), the job record's once-per-chunk
accounting, and the client's sharding, against a real Redis and moto's S3 server."""

from __future__ import annotations

import json

import pytest

from producer.jobs import JobState, JobStatus, JobStore, input_key
from producer.settings import ProducerSettings
from producer.storage import PermanentStorageError, open_storage
from tests.worker.conftest import BUCKET
from tests.worker.jobcheck import make_client


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path, s3_endpoint):
    if request.param == "local":
        return open_storage(ProducerSettings(), f"file://{tmp_path}/store")
    settings = ProducerSettings(s3_endpoint_url=s3_endpoint)
    return open_storage(settings, f"s3://{BUCKET}/unit-{tmp_path.name}")


def test_conditional_put_first_writer_wins(storage):
    storage.check()
    assert storage.get("j/results/part-00000.jsonl") is None
    assert not storage.exists("j/results/part-00000.jsonl")
    assert storage.put("j/results/part-00000.jsonl", b"first\n", if_absent=True) is True
    assert storage.put("j/results/part-00000.jsonl", b"second\n", if_absent=True) is False
    assert storage.get("j/results/part-00000.jsonl") == b"first\n"
    assert storage.put("j/manifest.json", b"{}") and storage.put("j/manifest.json", b"[]")
    assert storage.get("j/manifest.json") == b"[]"
    storage.put("j/input.jsonl", b"0123456789")
    assert storage.get("j/input.jsonl", (2, 5)) == b"234"


def test_missing_bucket_is_permanent_and_names_it(s3_endpoint):
    settings = ProducerSettings(s3_endpoint_url=s3_endpoint)
    with pytest.raises(PermanentStorageError, match="s3://absent-bucket"):
        open_storage(settings, "s3://absent-bucket/x").check()
    with pytest.raises(ValueError, match="3\\+ characters"):
        open_storage(settings, "s3://ab/x")
    with pytest.raises(ValueError, match="scheme must be"):
        open_storage(settings, "gs://bucket/x")


def _status(job_id: str, num_chunks: int) -> JobStatus:
    return JobStatus(job_id=job_id, state=JobState.QUEUED, lane="normal", storage_url="x",
                     num_lines=num_chunks * 2, num_chunks=num_chunks, chunk_size=2,
                     created_at=1.0)  # fmt: skip


def test_job_record_counts_each_chunk_once(redis_server):
    import redis

    jobs = JobStore(redis.Redis.from_url(redis_server.url), "tidal", ttl_s=600)
    jobs.create(_status("j1", num_chunks=2))
    assert jobs.mark_started("j1") == "running"
    assert jobs.chunk_done("j1", 0, num_succeeded=2, num_prompt_tokens=10) == (
        True,
        False,
        "running",
    )
    assert jobs.chunk_done("j1", 0, num_succeeded=2) == (False, False, "running")  # redelivery
    assert jobs.chunk_done("j1", 1, num_succeeded=1, num_failed=1) == (True, True, "completed")
    status = jobs.get("j1")
    assert (status.num_succeeded, status.num_failed, status.num_duplicates) == (3, 1, 1)
    assert status.num_chunks_done == 2 and status.num_prompt_tokens == 10
    assert status.finished_at is not None and status.started_at is not None

    jobs.create(_status("j2", num_chunks=2))
    assert jobs.set_terminal("j2", JobState.CANCELLED, error="by test")
    assert not jobs.set_terminal("j2", JobState.FAILED)  # terminal states stick
    assert jobs.chunk_done("j2", 0, num_cancelled=2) == (True, False, "cancelled")
    assert jobs.chunk_done("j2", 1, num_succeeded=2) == (True, True, "cancelled")
    assert jobs.get("j2").error == "by test"
    assert jobs.get("nope") is None


def test_client_shards_input_into_exact_byte_ranges(redis_server, s3_endpoint, tmp_path):
    client = make_client(redis_server.url, s3_endpoint, chunk_size=3)
    bodies = [{"prompt": "é" * i, "max_tokens": 1} for i in range(8)]  # multi-byte text
    lines = [json.dumps({"custom_id": f"c{i}", "url": "/v1/completions", "body": body})
             for i, body in enumerate(bodies)]  # fmt: skip
    lines[4] = "not json"
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n\n")
    # Declare both lanes' queues and bindings, as a worker does, before sending.
    with client.sender.connection_for_write() as conn:
        for queue in client.sender.amqp.queues.values():
            queue.bind(conn.default_channel).declare()
    handle = client.submit_batch(tmp_path / "in.jsonl", priority="high")
    status = handle.status()
    assert (status.num_lines, status.num_chunks, status.num_invalid) == (8, 3, 1)
    assert status.lane == "high" and status.state == JobState.QUEUED
    data = client.storage().get(input_key(handle.job_id))
    messages = client.redis.lrange("tidal.high", 0, -1)
    assert len(messages) == 3 and client.redis.llen("tidal.normal") == 0
    chunks = []
    for raw in messages:
        envelope = json.loads(raw)
        import base64

        _, kwargs, _ = json.loads(base64.b64decode(envelope["body"]))
        chunks.append(kwargs)
    chunks.sort(key=lambda k: k["chunk_index"])
    for k in chunks:
        got = data[k["byte_start"] : k["byte_end"]].decode().splitlines()
        assert got == lines[k["first_line"] : k["first_line"] + k["num_lines"]]
    with pytest.raises(ValueError, match="priority must be one of high, normal"):
        client.submit_batch(tmp_path / "in.jsonl", priority="urgent")
    with pytest.raises(ValueError, match="exactly one of messages"):
        client.submit(prompt="a", messages=[{"role": "user", "content": "b"}])
    with pytest.raises(ValueError, match="temperature"):
        client.submit(prompt="a", temperature=-1)
    with pytest.raises(KeyError, match="no job"):
        client.status("job-missing")
