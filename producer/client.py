"""``producer.Client``: submit jobs, follow them, cancel them, read their results.

A job is split into chunk tasks of ``chunk_size`` input lines; each message names its byte
range of ``JOB_ID/input.jsonl`` (the input is uploaded once, never carried in Redis). Lines
are validated at submission so the status shows bad lines at once; the worker writes their
error lines with the rest of the chunk, so results keep input order.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from producer import schemas
from producer.jobs import (
    RUN_CHUNK_TASK,
    ChunkTask,
    JobState,
    JobStatus,
    JobStore,
    chunk_headers,
    errors_key,
    input_key,
    manifest_key,
    results_key,
)
from producer.queues import LANES, queue_name
from producer.settings import ProducerSettings
from producer.storage import Storage, open_storage


class JobHandle:
    """A submitted job: ``status()`` and ``result(timeout_s)``."""

    def __init__(self, client: Client, job_id: str) -> None:
        self.client = client
        self.job_id = job_id

    def status(self) -> JobStatus:
        return self.client.status(self.job_id)

    def result(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Wait for the job to end; return its output lines in input order."""
        self.client.wait(self.job_id, timeout_s)
        return list(self.client.results(self.job_id))

    def __repr__(self) -> str:
        return f"JobHandle({self.job_id!r})"


class Client:
    """Talks to the broker (Redis) and the result store; needs neither torch nor a GPU."""

    def __init__(
        self,
        broker_url: str | None = None,
        storage_url: str | None = None,
        settings: ProducerSettings | None = None,
    ) -> None:
        import redis

        from producer.broker import make_sender

        overrides = {
            k: v for k, v in (("broker_url", broker_url), ("storage_url", storage_url)) if v
        }
        base = settings or ProducerSettings()
        self.settings = base.model_copy(update=overrides)
        self.redis = redis.Redis.from_url(self.settings.broker_url)
        self.jobs = JobStore(self.redis, self.settings.queue_prefix, self.settings.job_ttl_s)
        self.sender = make_sender(self.settings)
        self._storages: dict[str, Storage] = {}

    def storage(self, url: str | None = None) -> Storage:
        url = url or self.settings.storage_url
        if url not in self._storages:
            self._storages[url] = open_storage(self.settings, url)
        return self._storages[url]

    def submit(
        self,
        messages: list[dict[str, Any]] | None = None,
        prompt: str | list[int] | None = None,
        priority: str = "normal",
        custom_id: str = "request-0",
        **sampling: Any,
    ) -> JobHandle:
        """One request (chat ``messages`` or completion ``prompt``) as a one-line job."""
        if (messages is None) == (prompt is None):
            raise ValueError("pass exactly one of messages= (chat) or prompt= (completion)")
        if messages is not None:
            url, body = schemas.CHAT_URL, {"messages": messages, **sampling}
        else:
            url, body = schemas.COMPLETIONS_URL, {"prompt": prompt, **sampling}
        line = {"custom_id": custom_id, "method": "POST", "url": url, "body": body}
        schemas.parse_input_line(json.dumps(line))  # a bad single request is the caller's bug
        return self.submit_lines([json.dumps(line).encode()], priority)

    def submit_batch(self, path_or_s3_uri: str | Path, priority: str = "normal") -> JobHandle:
        """A JSONL file (local path or ``s3://bucket/key``) of OpenAI Batch input lines."""
        source = str(path_or_s3_uri)
        if source.startswith("s3://"):
            bucket_and_key = source.removeprefix("s3://")
            bucket, _, key = bucket_and_key.partition("/")
            data = open_storage(self.settings, f"s3://{bucket}").get(key)
            if data is None:
                raise FileNotFoundError(f"input {source} does not exist")
        else:
            data = Path(source).read_bytes()
        return self.submit_lines([ln for ln in data.splitlines() if ln.strip()], priority)

    def submit_lines(self, lines: list[bytes], priority: str = "normal") -> JobHandle:
        """Validate, upload and enqueue lines; bad lines count as invalid at once."""
        if priority not in LANES:
            raise ValueError(f"priority must be one of {', '.join(LANES)}; got {priority!r}")
        if not lines:
            raise ValueError("the input has no lines")
        storage = self.storage()
        storage.check()  # a missing bucket or a 403 fails here, before anything is queued
        job_id = f"job-{time.strftime('%Y%m%d')}-{uuid.uuid4().hex[:12]}"
        num_invalid = 0
        for raw in lines:
            try:
                schemas.parse_input_line(raw)
            except schemas.InvalidLine:
                num_invalid += 1
        data, offsets = _join_lines(lines)
        chunk_size = self.settings.chunk_size
        num_chunks = (len(lines) + chunk_size - 1) // chunk_size
        now = time.time()
        status = JobStatus(
            job_id=job_id,
            state=JobState.QUEUED,
            lane=priority,
            storage_url=storage.url,
            num_lines=len(lines),
            num_invalid=num_invalid,
            num_chunks=num_chunks,
            chunk_size=chunk_size,
            created_at=now,
        )
        storage.put(input_key(job_id), data, if_absent=True)
        storage.put(manifest_key(job_id), status.model_dump_json(indent=2).encode())
        self.jobs.create(status)
        queue = queue_name(priority, self.settings.queue_prefix)
        for chunk_index in range(num_chunks):
            first = chunk_index * chunk_size
            last = min(first + chunk_size, len(lines))
            task = ChunkTask(
                job_id=job_id,
                chunk_index=chunk_index,
                lane=priority,
                storage_url=storage.url,
                first_line=first,
                num_lines=last - first,
                byte_start=offsets[first],
                byte_end=offsets[last],
                enqueued_at=now,
            )
            self.sender.send_task(
                RUN_CHUNK_TASK, kwargs=task.model_dump(), queue=queue,
                headers=chunk_headers(job_id, chunk_index),
            )  # fmt: skip
        return JobHandle(self, job_id)

    def status(self, job_id: str) -> JobStatus:
        """The job record; ``KeyError`` when no such job is known (or it expired)."""
        status = self.jobs.get(job_id)
        if status is None:
            raise KeyError(f"no job {job_id!r} (unknown, or its record expired)")
        return status

    def wait(self, job_id: str, timeout_s: float | None = None, poll_s: float = 0.2) -> JobStatus:
        """Block until the job is terminal; ``TimeoutError`` after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            status = self.status(job_id)
            if status.state.is_terminal and status.finished_at is not None:
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {status.state} after {timeout_s} s")
            time.sleep(poll_s)

    def cancel(self, job_id: str) -> JobStatus:
        """Queued chunks are skipped, running requests aborted; finished results are kept."""
        self.status(job_id)
        self.jobs.set_terminal(job_id, JobState.CANCELLED, error="cancelled by the client")
        return self.status(job_id)

    def results(self, job_id: str) -> Iterator[dict[str, Any]]:
        """Output lines (results and error lines) in input order, chunk by chunk."""
        status = self.status(job_id)
        storage = self.storage(status.storage_url)
        for chunk_index in range(status.num_chunks):
            lines: list[dict[str, Any]] = []
            for key in (results_key(job_id, chunk_index), errors_key(job_id, chunk_index)):
                data = storage.get(key)
                if data:
                    lines.extend(json.loads(ln) for ln in data.splitlines() if ln.strip())
            lines.sort(key=lambda line: schemas.line_index_of(line["id"]))
            yield from lines


def _join_lines(lines: list[bytes]) -> tuple[bytes, list[int]]:
    """The input as one JSONL blob, and each line's starting byte (plus the end)."""
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    return b"\n".join(lines) + b"\n", offsets
