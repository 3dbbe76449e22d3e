"""The job record in Redis: state, counts and timings, updated once per chunk.

A chunk is accounted for exactly once (a Redis set of chunk indices, updated in the same Lua
script as the counters), so a redelivered chunk counts as a duplicate, never twice.

Every job that is not yet terminal is a member of the set ``{prefix}.jobs.open``: added in the
transaction that writes the record (and again by each chunk start, for jobs of producers that
predate the set), removed in the one that makes it terminal. The worker's lost-chunk check
reads it instead of scanning every job record (worker/recovery.py).
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from producer.queues import job_chunks_key, job_key, open_jobs_key


class JobState(StrEnum):
    """A job's life: queued -> running -> completed | failed | cancelled."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


class JobStatus(BaseModel):
    """What ``Client.status`` returns: the job record with its counts and timings."""

    job_id: str
    state: JobState
    lane: str
    storage_url: str
    num_lines: int
    num_invalid: int = 0
    num_chunks: int
    chunk_size: int
    num_chunks_done: int = 0
    num_succeeded: int = 0
    num_failed: int = 0
    num_cancelled: int = 0
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    # redeliveries of chunks already done; may still grow after the job completes (a chunk
    # finished but not acked by a crashed worker runs again whenever it is redelivered)
    num_duplicates: int = 0
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None

    @property
    def num_done(self) -> int:
        """Lines with an output line (success, error or cancelled)."""
        return self.num_succeeded + self.num_failed + self.num_cancelled


_INT_FIELDS = {n for n, f in JobStatus.model_fields.items() if f.annotation is int}

# KEYS: job hash, chunk set, open-jobs set. ARGV: chunk index, succeeded, failed, cancelled,
# prompt tokens, generated tokens, now, ttl, job id. Returns {is_new (0/1), chunks done,
# chunks total, state}.
_CHUNK_DONE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('SREM', KEYS[3], ARGV[9])
  return {-1, 0, 0, ''}
end
local is_new = redis.call('SADD', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[8])
if is_new == 0 then
  redis.call('HINCRBY', KEYS[1], 'num_duplicates', 1)
else
  redis.call('HINCRBY', KEYS[1], 'num_succeeded', ARGV[2])
  redis.call('HINCRBY', KEYS[1], 'num_failed', ARGV[3])
  redis.call('HINCRBY', KEYS[1], 'num_cancelled', ARGV[4])
  redis.call('HINCRBY', KEYS[1], 'num_prompt_tokens', ARGV[5])
  redis.call('HINCRBY', KEYS[1], 'num_generated_tokens', ARGV[6])
  redis.call('HINCRBY', KEYS[1], 'num_chunks_done', 1)
end
local done = tonumber(redis.call('SCARD', KEYS[2]))
local total = tonumber(redis.call('HGET', KEYS[1], 'num_chunks'))
local state = redis.call('HGET', KEYS[1], 'state')
if done >= total and (state == 'queued' or state == 'running') then
  state = 'completed'
  redis.call('HSET', KEYS[1], 'state', state)
end
if done >= total and redis.call('HEXISTS', KEYS[1], 'finished_at') == 0 then
  redis.call('HSET', KEYS[1], 'finished_at', ARGV[7])
end
if state ~= 'queued' and state ~= 'running' then
  redis.call('SREM', KEYS[3], ARGV[9])
end
return {is_new, done, total, state}
"""

# KEYS: job hash, open-jobs set. ARGV: now, job id. Moves queued -> running once; an unfinished
# job is (again) an open one: a job submitted by a producer that predates the set joins it here.
_STARTED_LUA = """
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'queued' then
  redis.call('HSET', KEYS[1], 'state', 'running', 'started_at', ARGV[1])
  state = 'running'
end
if state == 'running' then
  redis.call('SADD', KEYS[2], ARGV[2])
end
return state
"""


class JobStore:
    """Job records in Redis under ``{prefix}.job.{job_id}``."""

    def __init__(self, redis_client: Any, prefix: str, ttl_s: int) -> None:
        self.redis = redis_client
        self.prefix = prefix
        self.ttl_s = ttl_s
        self._chunk_done = redis_client.register_script(_CHUNK_DONE_LUA)
        self._started = redis_client.register_script(_STARTED_LUA)

    def create(self, status: JobStatus) -> None:
        key = job_key(status.job_id, self.prefix)
        fields = {k: str(v) for k, v in status.model_dump(mode="json").items() if v is not None}
        pipe = self.redis.pipeline()  # MULTI: no record without its open-set entry
        pipe.hset(key, mapping=fields)
        pipe.expire(key, self.ttl_s)
        if not status.state.is_terminal:
            pipe.sadd(open_jobs_key(self.prefix), status.job_id)
        pipe.execute()

    def get(self, job_id: str) -> JobStatus | None:
        raw = self.redis.hgetall(job_key(job_id, self.prefix))
        if not raw:
            return None
        fields: dict[str, Any] = {k.decode(): v.decode() for k, v in raw.items()}
        for name in _INT_FIELDS & fields.keys():
            fields[name] = int(fields[name])
        return JobStatus.model_validate(fields)

    def mark_started(self, job_id: str) -> str | None:
        keys = [job_key(job_id, self.prefix), open_jobs_key(self.prefix)]
        state = self._started(keys=keys, args=[time.time(), job_id])
        return state.decode() if state else None

    def chunk_done(
        self,
        job_id: str,
        chunk_index: int,
        *,
        num_succeeded: int = 0,
        num_failed: int = 0,
        num_cancelled: int = 0,
        num_prompt_tokens: int = 0,
        num_generated_tokens: int = 0,
    ) -> tuple[bool, bool, str]:
        """Account for one chunk; returns (first time for this chunk, job finished, state)."""
        is_new, done, total, state = self._chunk_done(
            keys=[job_key(job_id, self.prefix), job_chunks_key(job_id, self.prefix),
                  open_jobs_key(self.prefix)],
            args=[
                chunk_index, num_succeeded, num_failed, num_cancelled,
                num_prompt_tokens, num_generated_tokens, time.time(), self.ttl_s, job_id,
            ],
        )  # fmt: skip
        if is_new == -1:
            return True, False, ""  # the record is gone (expired or lost with Redis)
        return bool(is_new), done >= total, state.decode() if isinstance(state, bytes) else state

    def set_terminal(self, job_id: str, state: JobState, error: str | None = None) -> bool:
        """Move a not-yet-terminal job to ``state``; False if it was already terminal."""
        key = job_key(job_id, self.prefix)
        current = self.redis.hget(key, "state")
        if current is None or JobState(current.decode()).is_terminal:
            return False
        fields = {"state": state.value}
        if error:
            fields["error"] = error
        pipe = self.redis.pipeline()
        pipe.hset(key, mapping=fields)
        pipe.srem(open_jobs_key(self.prefix), job_id)
        pipe.execute()
        return True

    def state(self, job_id: str) -> JobState | None:
        raw = self.redis.hget(job_key(job_id, self.prefix), "state")
        return JobState(raw.decode()) if raw else None


RUN_CHUNK_TASK = "tidal.run_chunk"
WARMUP_TASK = "tidal.warmup"
# A chunk message's own header, "{job_id} {chunk_index}": the lost-chunk check reads it from
# the raw message with one regular expression instead of decoding the message and its body.
CHUNK_HEADER = "tidal_chunk"


def chunk_headers(job_id: str, chunk_index: int) -> dict[str, str]:
    """The extra Celery message headers of a chunk's ``tidal.run_chunk`` message."""
    return {CHUNK_HEADER: f"{job_id} {chunk_index}"}


class ChunkTask(BaseModel):
    """The JSON kwargs of one chunk message: which lines of ``JOB_ID/input.jsonl`` to run."""

    job_id: str
    chunk_index: int
    lane: str
    storage_url: str
    first_line: int  # index of the chunk's first line in the whole input
    num_lines: int
    byte_start: int  # [byte_start, byte_end) of input.jsonl
    byte_end: int
    enqueued_at: float  # wall clock (time.time()) at submission


def input_key(job_id: str) -> str:
    return f"{job_id}/input.jsonl"


def manifest_key(job_id: str) -> str:
    return f"{job_id}/manifest.json"


def results_key(job_id: str, chunk_index: int) -> str:
    return f"{job_id}/results/part-{chunk_index:05d}.jsonl"


def errors_key(job_id: str, chunk_index: int) -> str:
    return f"{job_id}/errors/part-{chunk_index:05d}.jsonl"
