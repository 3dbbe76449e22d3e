"""Re-enqueue chunks whose message was lost between Redis and a worker that died.

kombu's Redis transport takes a message with BRPOP, and only afterwards, on the worker's
event loop, records it in the ``unacked`` hash (FIELD_NOTES §1: not atomic). A worker
SIGKILLed (OOM, node loss, ``kill -9``) after Redis popped the message and before that
record is written leaves the message nowhere: not in a queue, not in ``unacked``, so the
visibility timeout never brings it back, and the job stays ``running`` for ever. A worker
keeps a BRPOP outstanding whenever it has a free slot, so the window opens at every fetch
(the kill -9 test hit it: a chunk popped a millisecond before the kill was never seen again).

The job record is the source of truth for what must exist. Every ``sweep_interval_s`` one
worker (a Redis lock) compares each unfinished job's chunks with a snapshot (MULTI/EXEC) of
the queues, ``unacked`` and the job's done-chunk set. A chunk that is in none of them in two
sweeps in a row is sent again, rebuilt from the job record and ``input.jsonl`` exactly as the
producer built it. A message is in none of them only while a BRPOP reply is on its way to a
live worker (milliseconds); should a live worker still be that slow, the second copy is a
counted duplicate, never a second result (deterministic keys, once-per-chunk accounting).
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import uuid
from typing import Any

from producer.jobs import RUN_CHUNK_TASK, ChunkTask, JobState, input_key
from producer.queues import LANES, job_chunks_key, queue_name, redis_list_keys

logger = logging.getLogger(__name__)

KOMBU_UNACKED_KEY = "unacked"  # kombu's Redis Channel.unacked_key (not prefixed)
_JOB_FIELDS = ("state", "num_chunks", "chunk_size", "num_lines", "lane", "storage_url",
               "created_at")  # fmt: skip


def chunk_of(raw: bytes | str) -> tuple[str, int] | None:
    """(job id, chunk index) of a Celery message, None for anything else; ``raw`` is a
    queue entry or an ``unacked`` value (``[message, exchange, routing key]``)."""
    try:
        message = json.loads(raw)
        if isinstance(message, list):
            message = message[0]
        if message.get("headers", {}).get("task") != RUN_CHUNK_TASK:
            return None
        body = message["body"]
        if message["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        _args, kwargs, _embed = json.loads(body)
        return str(kwargs["job_id"]), int(kwargs["chunk_index"])
    except (ValueError, KeyError, TypeError, IndexError):
        return None


class LostChunkSweeper:
    """Finds chunks of unfinished jobs that no queue and no worker holds, and sends them again."""

    def __init__(self, rt: Any, send_task: Any, interval_s: float) -> None:
        self.rt = rt
        self.send_task = send_task  # Celery app.send_task
        self.interval_s = interval_s
        self.prefix = rt.settings.queue_prefix
        self.lock_key = f"{self.prefix}.lost_chunk_sweep"
        # Chunks the last sweep (by any worker) found missing, "job_id chunk_index".
        self.suspects_key = f"{self.prefix}.lost_chunk_suspects"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="tidal-lost-chunks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sweep()
            except Exception as exc:  # Redis or S3 away: try again next time
                logger.warning("lost-chunk sweep failed: %s: %s", type(exc).__name__, exc)

    def sweep(self) -> list[tuple[str, int]]:
        """One pass; returns the chunks sent again. At most one worker per interval runs it
        (the lock is left to expire), the others skip; the suspects of the last pass are kept
        in Redis, so whichever worker runs the next one can confirm them."""
        lock_ms = max(1, int(self.interval_s * 900))
        if not self.rt.redis.set(self.lock_key, uuid.uuid4().hex, nx=True, px=lock_ms):
            return []
        r = self.rt.redis
        jobs = self._unfinished_jobs()
        missing = {f"{job_id} {chunk_index}" for job_id, chunk_index in self._missing_chunks(jobs)}
        suspects = {s.decode() for s in r.smembers(self.suspects_key)}
        pipe = r.pipeline()
        pipe.delete(self.suspects_key)
        if missing - suspects:
            pipe.sadd(self.suspects_key, *(missing - suspects))
            pipe.expire(self.suspects_key, max(1, int(10 * self.interval_s)))
        pipe.execute()
        lost = sorted((job_id, int(index)) for job_id, index in
                      (s.split(" ") for s in missing & suspects))  # fmt: skip
        for job_id, chunk_index in lost:
            self._resend(job_id, chunk_index, jobs[job_id])
        return lost

    def _unfinished_jobs(self) -> dict[str, dict[str, str]]:
        """Queued or running jobs old enough that the producer has sent all their chunks."""
        r = self.rt.redis
        head = f"{self.prefix}.job."
        keys = [k.decode() for k in r.scan_iter(match=f"{head}*", count=1000, _type="hash")]
        pipe = r.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, _JOB_FIELDS)
        jobs = {}
        too_young = time.time() - 2 * self.interval_s
        for key, values in zip(keys, pipe.execute(), strict=True):
            if None in values:
                continue
            fields = dict(zip(_JOB_FIELDS, (v.decode() for v in values), strict=True))
            if fields["state"] in (JobState.QUEUED, JobState.RUNNING) and (
                float(fields["created_at"]) < too_young
            ):
                jobs[key.removeprefix(head)] = fields
        return jobs

    def _missing_chunks(self, jobs: dict[str, dict[str, str]]) -> set[tuple[str, int]]:
        """Chunks of ``jobs`` that are neither done, queued nor delivered-unacked, read in
        one transaction (a restore moves a message from ``unacked`` to a queue atomically;
        two separate reads could miss it between them)."""
        if not jobs:
            return set()
        lists = [k for lane in LANES for k in redis_list_keys(queue_name(lane, self.prefix))]
        job_ids = list(jobs)
        pipe = self.rt.redis.pipeline(transaction=True)
        for key in lists:
            pipe.lrange(key, 0, -1)
        pipe.hvals(KOMBU_UNACKED_KEY)
        for job_id in job_ids:
            pipe.smembers(job_chunks_key(job_id, self.prefix))
        replies = pipe.execute()
        held = {chunk_of(raw) for reply in replies[: len(lists) + 1] for raw in reply}
        missing = set()
        for job_id, done in zip(job_ids, replies[len(lists) + 1 :], strict=True):
            done_chunks = {int(c) for c in done}
            for chunk_index in range(int(jobs[job_id]["num_chunks"])):
                if chunk_index not in done_chunks and (job_id, chunk_index) not in held:
                    missing.add((job_id, chunk_index))
        return missing

    def _resend(self, job_id: str, chunk_index: int, job: dict[str, str]) -> None:
        """Send the chunk's message again, the same kwargs as the producer's (its byte range
        from ``input.jsonl``, which the producer wrote as its lines joined by newlines)."""
        data = self.rt.storage(job["storage_url"]).get(input_key(job_id))
        if data is None:
            logger.error("lost chunk %s/%d: input.jsonl is gone", job_id, chunk_index)
            return
        chunk_size, num_lines = int(job["chunk_size"]), int(job["num_lines"])
        first, last = chunk_index * chunk_size, min((chunk_index + 1) * chunk_size, num_lines)
        offsets = [0]
        for line in data.split(b"\n")[:last]:
            offsets.append(offsets[-1] + len(line) + 1)
        if len(offsets) <= last:
            logger.error("lost chunk %s/%d: input.jsonl is truncated", job_id, chunk_index)
            return
        task = ChunkTask(
            job_id=job_id,
            chunk_index=chunk_index,
            lane=job["lane"],
            storage_url=job["storage_url"],
            first_line=first,
            num_lines=last - first,
            byte_start=offsets[first],
            byte_end=offsets[last],
            enqueued_at=float(job["created_at"]),
        )
        queue = queue_name(job["lane"], self.prefix)
        self.send_task(RUN_CHUNK_TASK, kwargs=task.model_dump(), queue=queue)
        self.rt.metrics.chunks_resent.inc()
        logger.warning("chunk %s/%d was in no queue and held by no worker (a worker died "
                       "while fetching it): sent again", job_id, chunk_index)  # fmt: skip
