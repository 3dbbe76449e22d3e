"""One chunk of a job: read its lines from the input, run them, write its result once.

Results go to deterministic keys with conditional puts; the job record is updated once per
chunk (``JobStore.chunk_done``), so a redelivered chunk adds a duplicate count and nothing
else. Error types tell the Celery task what to do: ``TransientChunkError`` -> retry later,
``PermanentChunkError`` -> fail the job and dead-letter, ``HandBack`` -> requeue untouched.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from engine.outputs import RequestOutput
from producer import schemas
from producer.jobs import (
    ChunkTask,
    JobState,
    errors_key,
    input_key,
    manifest_key,
    results_key,
)
from producer.storage import PermanentStorageError, TransientStorageError
from worker.batch import num_generated_tokens, run_lines
from worker.runtime import HIGH_PRIORITY, NORMAL_PRIORITY, WorkerRuntime

logger = logging.getLogger(__name__)


class TransientChunkError(RuntimeError):
    """Retry the whole chunk later (S3 5xx/throttling after retries, Redis unreachable)."""


class PermanentChunkError(RuntimeError):
    """The chunk can never succeed (missing bucket, access denied, input gone)."""


class HandBack(RuntimeError):
    """Put the message back on its queue untouched (shutdown, or the lane is full)."""


def _redis_retry(fn, attempts: int = 30, delay_s: float = 1.0):
    """Job-record updates ride out a Redis restart; then the chunk is retried as a whole."""
    import redis

    for attempt in range(attempts):
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if attempt == attempts - 1:
                raise TransientChunkError(f"Redis unreachable: {exc}") from None
            time.sleep(delay_s)
    return None


def run_chunk(rt: WorkerRuntime, task: ChunkTask, task_id: str) -> dict[str, Any]:
    """Run one chunk end to end; returns a small summary for the task result/log."""
    metrics = rt.metrics
    storage = rt.storage(task.storage_url)
    state = _redis_retry(lambda: rt.jobs.state(task.job_id))
    if state in (JobState.CANCELLED, JobState.FAILED):
        _account(rt, task, num_cancelled=task.num_lines)
        return {"job_id": task.job_id, "chunk": task.chunk_index, "skipped": state.value}
    try:
        if storage.exists(results_key(task.job_id, task.chunk_index)):
            return _account_existing(rt, task)
        data = storage.get(input_key(task.job_id), (task.byte_start, task.byte_end))
    except PermanentStorageError as exc:
        raise PermanentChunkError(str(exc)) from None
    except TransientStorageError as exc:
        raise TransientChunkError(str(exc)) from None
    if data is None:
        raise PermanentChunkError(f"input of job {task.job_id} is missing from {storage.url}")
    raw_lines = data.split(b"\n")[: task.num_lines]
    if len(raw_lines) != task.num_lines:
        raise PermanentChunkError(f"input byte range of chunk {task.chunk_index} is truncated")
    metrics.queue_wait.labels(task.lane).observe(max(0.0, time.time() - task.enqueued_at))
    _redis_retry(lambda: rt.jobs.mark_started(task.job_id))

    last_poll = [0.0, False]

    def should_cancel() -> bool:
        if rt.is_abandoning:
            return True
        now = time.monotonic()
        if now - last_poll[0] > 1.0:
            last_poll[0] = now
            try:
                last_poll[1] = rt.jobs.state(task.job_id) == JobState.CANCELLED
            except Exception:  # Redis blinking is not a cancel
                pass
        return bool(last_poll[1])

    def on_done(line: dict[str, Any], output: RequestOutput | None) -> None:
        if output is None:
            metrics.requests_failed.labels(line["error"]["code"]).inc()
            return
        metrics.requests_completed.inc()
        metrics.prompt_tokens.inc(len(output.prompt_token_ids))
        metrics.generation_tokens.inc(num_generated_tokens(output))
        m = output.metrics
        if m is not None and m.finished_time is not None:
            metrics.request_latency.observe(m.finished_time - m.arrival_time)
            if m.first_token_time is not None:
                metrics.time_to_first_token.observe(m.first_token_time - m.arrival_time)

    lines = run_lines(
        raw_lines,
        first_index=task.first_line,
        loop=rt.loop,
        tokenizer=rt.engine.tokenizer,
        max_model_len=rt.engine.max_model_len,
        model_name=_model_name(rt),
        run_id=task.job_id,
        priority=HIGH_PRIORITY if task.lane == "high" else NORMAL_PRIORITY,
        on_done=on_done,
        should_cancel=should_cancel,
    )
    if rt.is_abandoning:
        raise HandBack("soft shutdown timeout reached; chunk handed back")
    ok = [ln for ln in lines if ln["error"] is None]
    errors = [ln for ln in lines if ln["error"] is not None]
    try:
        if errors:
            storage.put(errors_key(task.job_id, task.chunk_index), _jsonl(errors), if_absent=True)
        is_first = storage.put(
            results_key(task.job_id, task.chunk_index), _jsonl(ok), if_absent=True
        )
    except PermanentStorageError as exc:
        raise PermanentChunkError(str(exc)) from None
    except TransientStorageError as exc:
        raise TransientChunkError(str(exc)) from None
    if not is_first:
        metrics.chunk_duplicates.inc()
        return _account_existing(rt, task)
    num_cancelled = sum(1 for ln in errors if ln["error"]["code"] == schemas.CANCELLED)
    usage = [ln["response"]["body"]["usage"] for ln in ok]
    _account(
        rt,
        task,
        num_succeeded=len(ok),
        num_failed=len(errors) - num_cancelled,
        num_cancelled=num_cancelled,
        num_prompt_tokens=sum(u["prompt_tokens"] for u in usage),
        num_generated_tokens=sum(u["completion_tokens"] for u in usage),
    )
    return {"job_id": task.job_id, "chunk": task.chunk_index, "ok": len(ok), "errors": len(errors)}


def _account_existing(rt: WorkerRuntime, task: ChunkTask) -> dict[str, Any]:
    """The chunk's result already exists (a redelivery): count it from the stored objects."""
    storage = rt.storage(task.storage_url)
    ok = _count_lines(storage.get(results_key(task.job_id, task.chunk_index)))
    errors = storage.get(errors_key(task.job_id, task.chunk_index)) or b""
    codes = [json.loads(ln)["error"]["code"] for ln in errors.splitlines() if ln.strip()]
    num_cancelled = codes.count(schemas.CANCELLED)
    is_new = _account(
        rt, task, num_succeeded=ok, num_failed=len(codes) - num_cancelled,
        num_cancelled=num_cancelled,
    )  # fmt: skip
    if not is_new:
        rt.metrics.chunk_duplicates.inc()
    return {"job_id": task.job_id, "chunk": task.chunk_index, "duplicate": not is_new}


def _account(rt: WorkerRuntime, task: ChunkTask, **counts: int) -> bool:
    """Update the job record once for this chunk; finalize the job if it was the last."""
    is_new, is_finished, state = _redis_retry(
        lambda: rt.jobs.chunk_done(task.job_id, task.chunk_index, **counts)
    )
    if is_finished:
        finalize_job(rt, task.job_id, task.storage_url, count=is_new)
    return is_new


def finalize_job(rt: WorkerRuntime, job_id: str, storage_url: str, count: bool = True) -> None:
    """Write the final manifest (idempotent overwrite) and count the job's outcome."""
    status = _redis_retry(lambda: rt.jobs.get(job_id))
    if status is None:
        return
    try:
        rt.storage(storage_url).put(manifest_key(job_id), status.model_dump_json(indent=2).encode())
    except (TransientStorageError, PermanentStorageError) as exc:
        logger.error("could not write the manifest of %s: %s", job_id, exc)
    if not count:
        return
    if status.state == JobState.COMPLETED:
        rt.metrics.jobs_completed.inc()
    else:
        rt.metrics.jobs_failed.labels(status.state.value).inc()


def _count_lines(data: bytes | None) -> int:
    return sum(1 for ln in (data or b"").splitlines() if ln.strip())


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(ln, ensure_ascii=False) + "\n" for ln in lines).encode()


def _model_name(rt: WorkerRuntime) -> str:
    from worker.local_run import _model_name as name

    return name(rt.engine.config)
