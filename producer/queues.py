"""Queue names: the one source of truth for producer, worker and the KEDA manifests."""

from __future__ import annotations

DEFAULT_QUEUE_PREFIX = "tidal"
LANES = ("high", "normal")

# kombu's Redis transport emulates message priorities with one list per priority step;
# the base list holds priority 0 and the others are named f"{queue}\x06\x16{step}".
KOMBU_PRIORITY_SEP = "\x06\x16"
KOMBU_PRIORITY_STEPS = (0, 3, 6, 9)


def queue_name(lane: str, prefix: str = DEFAULT_QUEUE_PREFIX) -> str:
    """The Celery queue of a lane: ``tidal.high`` or ``tidal.normal`` by default."""
    if lane not in LANES:
        raise ValueError(f"unknown lane {lane!r}; allowed: {', '.join(LANES)}")
    return f"{prefix}.{lane}"


def redis_list_keys(queue: str) -> list[str]:
    """Every Redis list that holds messages of ``queue`` (all priority sub-lists)."""
    return [
        queue if step == 0 else f"{queue}{KOMBU_PRIORITY_SEP}{step}"
        for step in KOMBU_PRIORITY_STEPS
    ]


def inflight_key(prefix: str = DEFAULT_QUEUE_PREFIX) -> str:
    """Redis hash of chunks being worked on (Celery task id -> lane); KEDA counts it (HLEN)."""
    return f"{prefix}.inflight"


def inflight_owners_key(prefix: str = DEFAULT_QUEUE_PREFIX) -> str:
    """Redis hash of the worker holding each in-flight entry (Celery task id -> worker id);
    written in the same transaction as ``inflight_key``."""
    return f"{prefix}.inflight.owners"


def worker_lease_key(worker_id: str, prefix: str = DEFAULT_QUEUE_PREFIX) -> str:
    """Redis string that exists (with a TTL its worker keeps refreshing) while it lives."""
    return f"{prefix}.lease.{worker_id}"


def worker_registry_key(prefix: str = DEFAULT_QUEUE_PREFIX) -> str:
    """Redis hash of the workers that hold a lease (worker id -> time it first registered):
    written with the lease, removed at a clean stop or by the sweep that finds the lease gone
    (a worker death, worker/recovery.py)."""
    return f"{prefix}.workers"


def open_jobs_key(prefix: str = DEFAULT_QUEUE_PREFIX) -> str:
    """Redis set of job ids not yet completed, failed or cancelled: added with the job record,
    removed in the transaction that makes the job terminal (the lost-chunk check reads it
    instead of scanning every job record)."""
    return f"{prefix}.jobs.open"


def dead_letter_key(prefix: str = DEFAULT_QUEUE_PREFIX) -> str:
    """Redis list of dead-letter records (JSON): undecodable messages, exhausted chunks."""
    return f"{prefix}.dead_letters"


def job_key(job_id: str, prefix: str = DEFAULT_QUEUE_PREFIX) -> str:
    """Redis hash holding a job's record (state, counts, timings)."""
    return f"{prefix}.job.{job_id}"


def job_chunks_key(job_id: str, prefix: str = DEFAULT_QUEUE_PREFIX) -> str:
    """Redis set of a job's chunk indices that have been accounted for (once each)."""
    return f"{prefix}.job.{job_id}.chunks"
