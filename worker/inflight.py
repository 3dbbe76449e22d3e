"""In-flight accounting for KEDA that survives workers killed outright.

A worker records each chunk it runs in the Redis hash ``tidal.inflight`` (task id -> lane),
which KEDA counts (HLEN) so that running work keeps the fleet up. A worker SIGKILLed (OOM,
node loss, spot reclaim) never removes its entries: without more, they stay until the
visibility timeout (hours) brings its messages back and another worker re-runs them, and
while they stay KEDA cannot scale to zero.

So every entry has an owner and every owner a lease:

- ``tidal.inflight.owners`` (task id -> worker id) is written in the same transaction as
  ``tidal.inflight``; a worker id is unique to one process (host, pid, random suffix);
- ``tidal.lease.<worker id>`` exists while the worker lives: it is set with a TTL of
  ``lease_s`` and refreshed every ``lease_s / 4`` by a background thread. Each refresh also
  writes the worker's own entries again (under the same local lock as start and finish, so
  a finished chunk is never written back), so entries a sweep removed while the worker was
  cut off from Redis, or that a Redis restart lost, come back at its next heartbeat;
- ``tidal.workers`` (worker id -> registration time) lists the workers that hold a lease,
  written in the lease's transaction (the worker starts its heartbeat before it consumes) and
  removed at a clean stop: a registered worker without a lease died, whether or not it had
  entries, which is what the lost-chunk sweep looks for (``worker/recovery.py``);
- every ``lease_s`` one worker (a Redis lock, as in ``worker/recovery.py``) looks for entries
  whose owner's lease is gone. It first hands the dead worker's messages back to the front of
  their queues, as kombu's own restore does (they wait in ``unacked`` otherwise, invisible to
  KEDA, until the visibility timeout, and a fleet scaled to zero would never restore them),
  then removes the entries in one script that checks again that the owner is still that
  worker and its lease still missing (a worker that took the chunk over keeps its entry).
  Entries with no owner (written by a worker that predates leases) are removed too. A dead
  owner is also a worker death for the lost-chunk sweep (it may predate the registry).

A worker whose heartbeat stalls longer than ``lease_s`` while it lives (a Redis partition)
loses its entries until its next heartbeat and has its chunks run a second time elsewhere: a
counted duplicate, never a second result, as after a visibility timeout.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from producer.queues import (
    inflight_key,
    inflight_owners_key,
    worker_lease_key,
    worker_registry_key,
)
from worker.recovery import KOMBU_UNACKED_KEY, note_worker_deaths

logger = logging.getLogger(__name__)

# Remove the entry only if this worker still owns it (a redelivered copy of the same task,
# same task id, may have been taken over by another worker).
_FINISH = """
if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  return 1
end
return 0
"""

# ARGV[1]: the lease key prefix; then pairs (task id, worker id), worker id '' for an entry
# seen without an owner. Each pair is checked again here, atomically.
_EXPIRE = """
local removed = {}
for i = 2, #ARGV, 2 do
  local tid, wid = ARGV[i], ARGV[i + 1]
  local owner = redis.call('HGET', KEYS[2], tid)
  if wid == '' then
    if not owner and redis.call('HDEL', KEYS[1], tid) == 1 then
      table.insert(removed, tid)
    end
  elseif owner == wid and redis.call('EXISTS', ARGV[1] .. wid) == 0 then
    redis.call('HDEL', KEYS[1], tid)
    redis.call('HDEL', KEYS[2], tid)
    table.insert(removed, tid)
  end
end
return removed
"""


def new_worker_id() -> str:
    """Unique to this process: a restarted container in the same pod gets a new one."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class InflightLeases:
    """This worker's in-flight entries, its lease, and the sweep of other workers' expired ones.

    ``restore`` hands messages (kombu delivery tags in ``unacked``) back to their queues;
    without it (tests, tools) the sweep only removes entries.
    """

    def __init__(
        self,
        redis: Any,
        prefix: str,
        lease_s: float,
        metrics: Any = None,
        restore: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.lease_s = lease_s
        self.metrics = metrics
        self.restore = restore
        self.worker_id = new_worker_id()
        self.key = inflight_key(prefix)
        self.owners_key = inflight_owners_key(prefix)
        self.lease_key = worker_lease_key(self.worker_id, prefix)
        self.lease_prefix = worker_lease_key("", prefix)
        self.registry_key = worker_registry_key(prefix)
        self.sweep_lock_key = f"{prefix}.inflight_sweep"
        self.mine: dict[str, str] = {}  # task id -> lane, what this worker runs now
        self._lock = threading.Lock()  # orders start, finish and heartbeat writes
        self._finish = redis.register_script(_FINISH)
        self._expire = redis.register_script(_EXPIRE)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()

    @property
    def lease_ms(self) -> int:
        return max(1, int(self.lease_s * 1000))

    def start(self) -> None:
        """Start the heartbeat-and-sweep thread (idempotent)."""
        with self._thread_lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="tidal-inflight", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread, drop the lease and deregister (a clean stop is no death): entries
        still here are now anyone's to sweep."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.lease_key)
        pipe.hdel(self.registry_key, self.worker_id)
        self._safe(pipe.execute)

    def started(self, task_id: str, lane: str) -> None:
        self.start()  # a chunk may come before worker_ready: never an entry without a heartbeat
        with self._lock:
            self.mine[task_id] = lane
            pipe = self.redis.pipeline(transaction=True)
            self._lease(pipe)
            pipe.hset(self.key, task_id, lane)
            pipe.hset(self.owners_key, task_id, self.worker_id)
            self._safe(pipe.execute)

    def finished(self, task_id: str) -> None:
        with self._lock:
            self.mine.pop(task_id, None)
            self._safe(lambda: self._finish(keys=[self.key, self.owners_key],
                                            args=[task_id, self.worker_id]))  # fmt: skip

    def heartbeat(self) -> bool:
        """Refresh the lease and write this worker's entries again; False if Redis failed."""
        with self._lock:
            pipe = self.redis.pipeline(transaction=True)
            self._lease(pipe)
            if self.mine:
                pipe.hset(self.key, mapping=self.mine)
                pipe.hset(self.owners_key, mapping=dict.fromkeys(self.mine, self.worker_id))
            return self._safe(pipe.execute)

    def _lease(self, pipe: Any) -> None:
        """Set the lease and register (in the caller's transaction: registered => leased)."""
        pipe.set(self.lease_key, "1", px=self.lease_ms)
        pipe.hsetnx(self.registry_key, self.worker_id, repr(time.time()))

    def sweep(self) -> list[str]:
        """One pass; returns the task ids whose entries it removed. At most one worker per
        ``lease_s`` runs it (the lock is left to expire), the others skip."""
        r = self.redis
        lock_ms = max(1, self.lease_ms * 9 // 10)
        if not r.set(self.sweep_lock_key, self.worker_id, nx=True, px=lock_ms):
            return []
        owners = {t.decode(): w.decode() for t, w in r.hgetall(self.owners_key).items()}
        entries = [t.decode() for t in r.hkeys(self.key)]
        workers = sorted(set(owners.values()))
        pipe = r.pipeline(transaction=False)
        for worker_id in workers:
            pipe.exists(worker_lease_key(worker_id, self.prefix))
        dead = {w for w, alive in zip(workers, pipe.execute(), strict=True) if not alive}
        dead.discard(self.worker_id)  # never its own: its lease is back at the next heartbeat
        if dead:  # a worker killed while fetching may have lost a chunk (worker/recovery.py)
            note_worker_deaths(r, self.prefix)
        expired = {t: w for t, w in owners.items() if w in dead}
        orphans = [t for t in entries if t not in owners]
        if not expired and not orphans:
            return []
        num_restored = 0
        if expired and self.restore is not None:
            tags = self._unacked_tags(set(expired))
            if tags:
                self.restore(tags)  # raises: the entries stay, the next sweep tries again
                num_restored = len(tags)
                if self.metrics is not None:
                    self.metrics.chunks_reclaimed.inc(num_restored)
        args = [self.lease_prefix]
        for task_id, worker_id in [*expired.items(), *((t, "") for t in orphans)]:
            args += [task_id, worker_id]
        removed = sorted(t.decode() for t in self._expire(keys=[self.key, self.owners_key],
                                                          args=args))  # fmt: skip
        if removed or num_restored:
            logger.warning("in-flight entries of worker(s) whose lease expired (%s): removed %d, "
                           "handed %d chunk message(s) back to their queues",
                           ", ".join(sorted(dead)) or "no owner", len(removed),
                           num_restored)  # fmt: skip
        return removed

    def _unacked_tags(self, task_ids: set[str]) -> list[str]:
        """kombu delivery tags in ``unacked`` whose Celery task id is one of ``task_ids``."""
        tags = []
        for tag, raw in self.redis.hgetall(KOMBU_UNACKED_KEY).items():
            try:
                task_id = json.loads(raw)[0]["headers"]["id"]
            except (ValueError, KeyError, TypeError, IndexError):
                continue
            if task_id in task_ids:
                tags.append(tag.decode())
        return tags

    def _run(self) -> None:
        next_sweep = time.monotonic()  # a new worker cleans up at once (it may be the only one)
        while True:
            is_beating = self.heartbeat()
            if is_beating and time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + self.lease_s
                try:
                    self.sweep()
                except Exception as exc:  # Redis away: try again next time
                    logger.warning("in-flight sweep failed: %s: %s", type(exc).__name__, exc)
            if self._stop.wait(self.lease_s / 4):
                return

    @staticmethod
    def _safe(fn: Callable[[], Any]) -> bool:
        try:
            fn()
        except Exception as exc:  # bookkeeping for KEDA must never fail a chunk
            logger.warning("in-flight bookkeeping failed: %s", exc)
            return False
        return True
