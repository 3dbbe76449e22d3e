"""Helpers for the worker tests: submit a job, and check "what goes in comes out, once"."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import boto3

from producer import Client
from producer.jobs import JobState, JobStatus
from producer.queues import LANES, inflight_key, job_chunks_key, queue_name, redis_list_keys
from producer.settings import ProducerSettings
from tests.worker.conftest import BUCKET, make_lines


def make_client(redis_url: str, s3_url: str, chunk_size: int = 8, bucket: str = BUCKET) -> Client:
    settings = ProducerSettings(
        broker_url=redis_url,
        storage_url=f"s3://{bucket}/jobs",
        s3_endpoint_url=s3_url,
        chunk_size=chunk_size,
    )
    return Client(settings=settings)


def submit(client: Client, tmp_path, num_lines: int, max_tokens: int, priority: str = "normal",
           tag: str = "doc", ignore_eos: bool = False):  # fmt: skip
    lines = make_lines(num_lines, max_tokens=max_tokens, tag=tag, ignore_eos=ignore_eos)
    path = tmp_path / f"{tag}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return client.submit_batch(path, priority=priority), lines


def check_exactly_once(client: Client, job_id: str, lines: list[str], s3_url: str) -> JobStatus:
    """Every input line has exactly one output line, in order, one result object per chunk."""
    status = client.status(job_id)
    assert status.state == JobState.COMPLETED, status
    assert status.num_succeeded + status.num_failed == len(lines), status
    assert status.num_chunks_done == status.num_chunks, status
    results = list(client.results(job_id))
    assert [r["custom_id"] for r in results] == [json.loads(ln)["custom_id"] for ln in lines]
    assert all(r["error"] is None for r in results), [r for r in results if r["error"]][:3]
    s3 = boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1")
    listing = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"jobs/{job_id}/results/")
    keys = sorted(o["Key"] for o in listing["Contents"])
    assert keys == [f"jobs/{job_id}/results/part-{i:05d}.jsonl" for i in range(status.num_chunks)]
    return status


# kombu's Redis transport keeps a delivered, not yet acked message in this hash (delivery tag
# -> [message, exchange, routing key]) until the ack; a crashed worker's messages stay there.
KOMBU_UNACKED_KEY = "unacked"


@dataclass(frozen=True)
class Unacked:
    """One message a worker took and has not acked: its queue, task name and kwargs."""

    queue: str
    task: str
    kwargs: dict[str, Any]


def unacked_messages(redis_client) -> list[Unacked]:
    """Every message in kombu's unacked hash, decoded (Celery protocol 2, JSON body)."""
    out = []
    for raw in redis_client.hvals(KOMBU_UNACKED_KEY):
        message, _exchange, routing_key = json.loads(raw)
        body = message["body"]
        if message["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        _args, kwargs, _embed = json.loads(body)
        out.append(Unacked(routing_key, message["headers"]["task"], kwargs))
    return out


def queued_chunks(redis_client, job_id: str) -> set[int]:
    """Chunk indices of ``job_id`` waiting in a queue (either lane, every priority list)."""
    from worker.recovery import chunk_of

    keys = [k for lane in LANES for k in redis_list_keys(queue_name(lane))]
    found = {chunk_of(raw) for key in keys for raw in redis_client.lrange(key, 0, -1)}
    return {c for j, c in filter(None, found) if j == job_id}


def where_chunks_are(client: Client, job_id: str) -> str:
    """The job record and where each chunk's message is, for a failure message."""
    r = client.redis
    status = client.status(job_id)
    done = sorted(int(c) for c in r.smembers(job_chunks_key(job_id)))
    unacked = sorted(m.kwargs["chunk_index"] for m in unacked_messages(r)
                     if m.kwargs.get("job_id") == job_id)  # fmt: skip
    queued = sorted(queued_chunks(r, job_id))
    nowhere = sorted(set(range(status.num_chunks)) - set(done) - set(unacked) - set(queued))
    return (f"{status!r}\ndone {done}, queued {queued}, unacked {unacked}, nowhere {nowhere}; "
            f"in flight {r.hgetall(inflight_key())}")  # fmt: skip
