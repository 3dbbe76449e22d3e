"""The Celery tasks: ``tidal.run_chunk`` and ``tidal.warmup``, bound to one WorkerRuntime.

What happens to the message after a chunk:
- success, or a permanent failure (recorded, dead-lettered): acked;
- transient failure: retried with exponential backoff (a new message), up to
  ``chunk_max_retries``, then dead-lettered and the job failed;
- soft shutdown ran out, or the normal lane was full: rejected with requeue (kombu puts it
  back at the front of its queue), nothing written;
- engine dead: the process exits at once without acking; the message is redelivered.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from celery.exceptions import Reject
from pydantic import ValidationError

from producer.jobs import RUN_CHUNK_TASK, WARMUP_TASK, ChunkTask, JobState
from worker.chunk import (
    HandBack,
    PermanentChunkError,
    TransientChunkError,
    _account,
    run_chunk,
)
from worker.dead_letters import dead_letter
from worker.runtime import WorkerRuntime

logger = logging.getLogger(__name__)

EXIT_ENGINE_DEAD = 70  # EX_SOFTWARE


def register_tasks(app: Any, rt: WorkerRuntime) -> None:
    """Define the tasks on ``app``, closing over the process's runtime."""
    settings = rt.settings

    @app.task(
        name=RUN_CHUNK_TASK,
        bind=True,
        acks_late=True,
        reject_on_worker_lost=True,
        max_retries=settings.chunk_max_retries,
    )
    def run_chunk_task(self, **kwargs: Any) -> dict[str, Any]:
        task_id = self.request.id
        try:
            task = ChunkTask.model_validate(kwargs)
        except ValidationError as exc:
            dead_letter(rt.redis, settings.queue_prefix, "bad_message", str(exc), kwargs, task_id)
            return {"dead_letter": task_id}
        if rt.lanes.should_hand_back(task.lane) or rt.is_abandoning:
            time.sleep(0.2)  # the pause is on its way; do not spin on this message
            raise Reject("normal lane full or shutting down", requeue=True)
        rt.chunk_started(task_id, task.lane)
        try:
            return run_chunk(rt, task, task_id)
        except HandBack as exc:
            raise Reject(str(exc), requeue=True) from None
        except PermanentChunkError as exc:
            _fail_job(rt, task, task_id, "permanent", str(exc))
            return {"failed": str(exc)}
        except TransientChunkError as exc:
            countdown = min(
                settings.chunk_retry_backoff_max_s,
                settings.chunk_retry_backoff_s * 2**self.request.retries,
            )
            logger.warning("chunk %s/%d: %s; retry in %.1f s", task.job_id, task.chunk_index,
                           exc, countdown)  # fmt: skip
            if self.request.retries >= settings.chunk_max_retries:
                _fail_job(rt, task, task_id, "retries_exhausted", str(exc))
                return {"failed": str(exc)}
            raise self.retry(countdown=countdown, exc=exc) from None
        except Exception as exc:
            from engine.engine_loop import EngineDeadError

            if isinstance(exc, EngineDeadError):
                logger.critical("engine died (%s); exiting without acking", exc)
                sys.stderr.flush()
                os._exit(EXIT_ENGINE_DEAD)
            raise
        finally:
            rt.chunk_finished(task_id)

    @app.task(name=WARMUP_TASK, acks_late=False, ignore_result=True)
    def warmup_task() -> dict[str, Any]:
        """Load the engine if needed, run one short generation, report readiness and time."""
        load_s = rt.start()
        generate_s = rt.generate_once()
        rt.metrics.worker_ready.set(1)
        report = {"ready": True, "load_s": round(load_s, 3), "generate_s": round(generate_s, 3)}
        logger.info("warm-up: %s", report)
        return report


def _fail_job(rt: WorkerRuntime, task: ChunkTask, task_id: str, reason: str, detail: str) -> None:
    """A chunk can never finish: fail the job, dead-letter the chunk, account it as failed."""
    settings = rt.settings
    storage = None
    try:
        storage = rt.storage(task.storage_url)
    except ValueError:
        pass
    dead_letter(rt.redis, settings.queue_prefix, reason, detail, task.model_dump(), task_id,
                storage)  # fmt: skip
    try:
        rt.jobs.set_terminal(task.job_id, JobState.FAILED, error=f"{reason}: {detail}")
        _account(rt, task, num_failed=task.num_lines)
    except Exception as exc:
        logger.error("could not record the failure of job %s: %s", task.job_id, exc)
