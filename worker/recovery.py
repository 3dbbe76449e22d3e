"""Re-enqueue chunks whose message was lost between Redis and a worker that died.

kombu's Redis transport takes a message with BRPOP, and only afterwards, on the worker's
event loop, records it in the ``unacked`` hash (FIELD_NOTES §1: not atomic). A worker
SIGKILLed (OOM, node loss, ``kill -9``) after Redis popped the message and before that
record is written leaves the message nowhere: not in a queue, not in ``unacked``, so the
visibility timeout never brings it back, and the job stays ``running`` for ever. A worker
keeps a BRPOP outstanding whenever it has a free slot, so the window opens at every fetch
(the kill -9 test hit it: a chunk popped a millisecond before the kill was never seen again).

The job record is the source of truth for what must exist. A *check* compares each open
job's chunks with the queues, ``unacked`` and the job's done-chunk set; a chunk that is in
none of them in two checks in a row is sent again, rebuilt from the job record and
``input.jsonl`` exactly as the producer built it.

When to check. A check reads every queue list, and a batch fleet's normal state is a large
backlog (10^5-10^6 messages of ~1 KB): far too much to read every minute when nothing was
lost. A chunk is lost in that window only when a worker dies, so every ``sweep_interval_s``
one worker (a Redis lock) runs a cheap sweep that looks for deaths, and checks only when:

- a worker died: every worker registers in ``{prefix}.workers`` in the transaction that
  sets its lease (``worker/inflight.py``; before it consumes anything, so a worker killed
  while fetching its very first message is registered). A registered worker whose lease is
  gone died (a clean stop deregisters): one script removes it from the registry and records
  ``{prefix}.lost_chunk_check`` = {since: now, checks: 0}. The in-flight sweep records the
  same when it finds entries of a dead owner (workers from before the registry). The record
  stays until two checks have looked at every job created before ``since``: a check skips
  jobs younger than two intervals (the producer may still be sending their chunks), so the
  checks of the first two intervals after a death do not count. Then it is removed (in a
  script, and only if no newer death replaced it);
- the last check left suspects (chunks missing once): the next sweep checks again, so the
  two-check confirmation always gets its second check;
- the last full check is older than ``full_check_interval_s`` (6 h; missing after a deploy or
  a Redis restart: at once): a safety net for losses no death explains (a Redis failover can
  drop a BRPOP reply), and for jobs outside the open-jobs set (below).

Which jobs. The producer adds each job id to ``{prefix}.jobs.open`` in the transaction that
writes the record; the transaction that makes it terminal removes it (``producer/jobs.py``),
and each chunk start adds it again while it runs (jobs of producers that predate the set). A
check reads that set, not every job record (kept 7 days). The full check also SCANs the job
records, adds unfinished ones the set lacks (the migration: the first sweep after the deploy
is a full check), and each check drops ids whose record is terminal or gone.

How to read the queues without blocking Redis. The lists are read in pages (LRANGE of
``page_size``, default 1000, outside any transaction), so no command holds Redis for more
than a page. Pages are indexed from the left (head): new messages are LPUSHed there, which
only shifts unread entries to the right (read twice, never skipped); BRPOP pops and kombu's
restore RPUSHes at the right, which shifts nothing. A message can move while the pages are
read, so ``unacked`` is read before (U1) and after (U2) the pages, and the done sets after
U2; a chunk seen in any of them is held. Take a message that is alive throughout:

- in ``unacked`` at U1: held;
- else in a queue at U1 (or in a BRPOP reply on its way). Left there until its page is read:
  held. Popped before its page is read: it is then in ``unacked`` at U2 (held), or already
  acked, and a chunk is accounted done before its ack, so its done set (read after U2)
  has it;
- a restore (``unacked`` -> queue, one WATCH transaction) after U1 is covered by U1, one
  before U1 leaves it in a queue at U1, as above.

What slips through is a message that moves twice during one check (popped and restored
again before U2, or in a BRPOP reply exactly at U2, or a retry message pushed on to an
already-read page while its predecessor is acked); it is missing in that check only, and the
two-check rule needs it missing in the next one too. Should a live message still be missed
twice, the second copy is a counted duplicate, never a second result (deterministic result
keys, once-per-chunk accounting).
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from producer.jobs import (
    CHUNK_HEADER,
    RUN_CHUNK_TASK,
    ChunkTask,
    JobState,
    chunk_headers,
    input_key,
)
from producer.queues import (
    LANES,
    job_chunks_key,
    job_key,
    open_jobs_key,
    queue_name,
    redis_list_keys,
    worker_lease_key,
    worker_registry_key,
)

logger = logging.getLogger(__name__)

KOMBU_UNACKED_KEY = "unacked"  # kombu's Redis Channel.unacked_key (not prefixed)
_JOB_FIELDS = ("state", "num_chunks", "chunk_size", "num_lines", "lane", "storage_url",
               "created_at")  # fmt: skip
CHECKS_AFTER_DEATH = 2  # checks that must look at every job created before a death

# KEYS: worker registry, check-needed hash. ARGV: lease key prefix, now. Registered workers
# whose lease is gone died: deregister them and record that a check is needed, atomically
# (a worker that comes back re-registers with its next heartbeat).
_DEATHS = """
local dead = {}
for _, wid in ipairs(redis.call('HKEYS', KEYS[1])) do
  if redis.call('EXISTS', ARGV[1] .. wid) == 0 then
    redis.call('HDEL', KEYS[1], wid)
    table.insert(dead, wid)
  end
end
if #dead > 0 then
  redis.call('HSET', KEYS[2], 'since', ARGV[2], 'checks', 0)
end
return dead
"""

# KEYS: check-needed hash. ARGV: 'since' as the check read it, the check's job cutoff, the
# checks needed. A check counts if no newer death replaced the record and it looked at every
# job created before the death; the record goes after enough of them.
_CHECKED = """
local since = redis.call('HGET', KEYS[1], 'since')
if not since or since ~= ARGV[1] then return -1 end
if tonumber(ARGV[2]) <= tonumber(since) then return 0 end
local n = redis.call('HINCRBY', KEYS[1], 'checks', 1)
if n >= tonumber(ARGV[3]) then redis.call('DEL', KEYS[1]) end
return n
"""

# KEYS: lock. ARGV: token, ms. Extend the lock only if it is still ours.
_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


def check_needed_key(prefix: str) -> str:
    """Redis hash {since, checks}: a worker died at ``since``; lost-chunk checks are due."""
    return f"{prefix}.lost_chunk_check"


def note_worker_deaths(redis: Any, prefix: str) -> None:
    """Record that a worker died now (the in-flight sweep found a dead owner's entries)."""
    redis.hset(check_needed_key(prefix), mapping={"since": repr(time.time()), "checks": 0})


_CHUNK_HEADER = re.compile(rb'"' + CHUNK_HEADER.encode() + rb'": "([^" ]+) ([0-9]+)"')


def chunk_of(raw: bytes | str) -> tuple[str, int] | None:
    """(job id, chunk index) of a Celery message, None for anything else; ``raw`` is a
    queue entry or an ``unacked`` value (``[message, exchange, routing key]``). Read from
    the chunk header (``producer.jobs.CHUNK_HEADER``) where the message has one, else from
    the decoded message body (messages of producers that predate the header)."""
    found = _CHUNK_HEADER.search(raw.encode() if isinstance(raw, str) else raw)
    if found is not None:
        return found[1].decode(), int(found[2])
    return chunk_of_body(raw)


def chunk_of_body(raw: bytes | str) -> tuple[str, int] | None:
    """``chunk_of`` from the message's task name and body alone (decoded)."""
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
    """Finds chunks of unfinished jobs that no queue and no worker holds, and sends them
    again; checks only after a worker death, to confirm suspects, or as a rare safety net."""

    page_size = 1000  # queue entries read per LRANGE

    def __init__(
        self,
        rt: Any,
        send_task: Any,
        interval_s: float,
        full_check_interval_s: float | None = None,
    ) -> None:
        self.rt = rt
        self.send_task = send_task  # Celery app.send_task
        self.interval_s = interval_s
        self.full_check_interval_s = (
            full_check_interval_s
            if full_check_interval_s is not None
            else getattr(rt.settings, "lost_chunk_full_check_interval_s", 6 * 3600.0)
        )
        self.prefix = rt.settings.queue_prefix
        self.lock_key = f"{self.prefix}.lost_chunk_sweep"
        # Chunks the last check (by any worker) found missing, "job_id chunk_index".
        self.suspects_key = f"{self.prefix}.lost_chunk_suspects"
        self.check_key = check_needed_key(self.prefix)
        self.last_full_key = f"{self.prefix}.lost_chunk_check.last_full"
        self.registry_key = worker_registry_key(self.prefix)
        self.open_key = open_jobs_key(self.prefix)
        self.on_page: Callable[[str, int], None] | None = None  # tests: after each page
        r = rt.redis
        self._deaths = r.register_script(_DEATHS)
        self._checked = r.register_script(_CHECKED)
        self._extend = r.register_script(_EXTEND)
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
        (the lock is left to expire), the others skip; what a check needs next (suspects,
        a pending death) is kept in Redis, so whichever worker runs the next one goes on."""
        token = uuid.uuid4().hex
        self._lock_ms = max(1, int(self.interval_s * 900))
        if not self.rt.redis.set(self.lock_key, token, nx=True, px=self._lock_ms):
            return []
        self._token, self._locked_at = token, time.monotonic()
        r = self.rt.redis
        now = time.time()
        dead = [w.decode() for w in self._deaths(
            keys=[self.registry_key, self.check_key],
            args=[worker_lease_key("", self.prefix), repr(now)])]  # fmt: skip
        if dead:
            logger.warning("worker(s) %s died (lease expired): checking for lost chunks",
                           ", ".join(sorted(dead)))  # fmt: skip
        pipe = r.pipeline(transaction=False)
        pipe.hget(self.check_key, "since")
        pipe.exists(self.suspects_key)
        pipe.get(self.last_full_key)
        since, has_suspects, last_full = pipe.execute()
        is_full = last_full is None or now - float(last_full) >= self.full_check_interval_s
        if is_full:
            reason = "safety_net"
        elif since is not None:
            reason = "worker_death"
        elif has_suspects:
            reason = "confirmation"
        else:
            return []  # the steady state: nobody died, nothing to confirm
        cutoff = now - 2 * self.interval_s
        jobs = self._unfinished_jobs(cutoff, scan_records=is_full)
        missing = {f"{job_id} {chunk_index}" for job_id, chunk_index in self._missing_chunks(jobs)}
        suspects = {s.decode() for s in r.smembers(self.suspects_key)}
        pipe = r.pipeline()
        pipe.delete(self.suspects_key)
        if missing - suspects:
            pipe.sadd(self.suspects_key, *(missing - suspects))
            pipe.expire(self.suspects_key, max(1, int(10 * self.interval_s)))
        if is_full:
            pipe.set(self.last_full_key, repr(now))
        pipe.execute()
        if since is not None:  # counts if it looked at every job created before the death
            self._checked(keys=[self.check_key], args=[since, repr(cutoff), CHECKS_AFTER_DEATH])
        self.rt.metrics.lost_chunk_checks.labels(reason).inc()
        lost = sorted((job_id, int(index)) for job_id, index in
                      (s.split(" ") for s in missing & suspects))  # fmt: skip
        for job_id, chunk_index in lost:
            self._resend(job_id, chunk_index, jobs[job_id])
        return lost

    def _unfinished_jobs(self, cutoff: float, scan_records: bool) -> dict[str, dict[str, str]]:
        """Queued or running jobs created before ``cutoff`` (the producer has sent all their
        chunks): the open-jobs set, and with ``scan_records`` every job record too."""
        r = self.rt.redis
        head = f"{self.prefix}.job."
        members = {m.decode() for m in r.smembers(self.open_key)}
        ids = set(members)
        if scan_records:
            for key in r.scan_iter(match=f"{head}*", count=1000, _type="hash"):
                ids.add(key.decode().removeprefix(head))
        ids_list = sorted(ids)
        pipe = r.pipeline(transaction=False)
        for job_id in ids_list:
            pipe.hmget(job_key(job_id, self.prefix), _JOB_FIELDS)
        jobs, closed, unlisted = {}, [], []
        for job_id, values in zip(ids_list, pipe.execute(), strict=True):
            if None in values:
                closed.append(job_id)  # expired, lost with Redis, or not a job record
                continue
            fields = dict(zip(_JOB_FIELDS, (v.decode() for v in values), strict=True))
            if fields["state"] not in (JobState.QUEUED, JobState.RUNNING):
                closed.append(job_id)
                continue
            if job_id not in members:
                unlisted.append(job_id)
            if float(fields["created_at"]) < cutoff:
                jobs[job_id] = fields
        pipe = r.pipeline(transaction=False)
        if closed := [j for j in closed if j in members]:
            pipe.srem(self.open_key, *closed)
        if unlisted:  # a job from before the open set (or a producer that predates it)
            pipe.sadd(self.open_key, *unlisted)
        pipe.execute()
        return jobs

    def _missing_chunks(self, jobs: dict[str, dict[str, str]]) -> set[tuple[str, int]]:
        """Chunks of ``jobs`` that are neither done, queued nor delivered-unacked: ``unacked``
        read before and after a paged read of the queues, then the done sets (the module
        docstring says why a message that moves meanwhile is still seen)."""
        if not jobs:
            return set()
        r = self.rt.redis
        lists = [k for lane in LANES for k in redis_list_keys(queue_name(lane, self.prefix))]
        held = {chunk_of(raw) for raw in r.hvals(KOMBU_UNACKED_KEY)}
        for key in lists:
            start = 0
            while True:
                page = r.lrange(key, start, start + self.page_size - 1)
                held.update(chunk_of(raw) for raw in page)
                self._keep_lock()
                if self.on_page is not None:
                    self.on_page(key, start)
                if len(page) < self.page_size:
                    break
                start += self.page_size
        held.update(chunk_of(raw) for raw in r.hvals(KOMBU_UNACKED_KEY))
        job_ids = list(jobs)
        pipe = r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.smembers(job_chunks_key(job_id, self.prefix))
        missing = set()
        for job_id, done in zip(job_ids, pipe.execute(), strict=True):
            done_chunks = {int(c) for c in done}
            for chunk_index in range(int(jobs[job_id]["num_chunks"])):
                if chunk_index not in done_chunks and (job_id, chunk_index) not in held:
                    missing.add((job_id, chunk_index))
        return missing

    def _keep_lock(self) -> None:
        """A long paged read keeps the sweep lock (another worker's check at the same time
        would only waste work: its resends are counted duplicates)."""
        if time.monotonic() - self._locked_at > self._lock_ms / 2000:
            self._extend(keys=[self.lock_key], args=[self._token, self._lock_ms])
            self._locked_at = time.monotonic()

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
        self.send_task(
            RUN_CHUNK_TASK, kwargs=task.model_dump(), queue=queue,
            headers=chunk_headers(job_id, chunk_index),
        )  # fmt: skip
        self.rt.metrics.chunks_resent.inc()
        logger.warning("chunk %s/%d was in no queue and held by no worker (a worker died "
                       "while fetching it): sent again", job_id, chunk_index)  # fmt: skip
