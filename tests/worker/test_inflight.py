"""In-flight entries under leases (worker/inflight.py) against a real Redis, no worker process:
each "worker" here is an ``InflightLeases`` whose heartbeats the test drives itself.
(tests/worker/test_failures.py kills real workers.)"""

from __future__ import annotations

import json
import time

import pytest
import redis

from producer.queues import inflight_key, inflight_owners_key
from worker.inflight import InflightLeases
from worker.metrics import WorkerMetrics
from worker.recovery import KOMBU_UNACKED_KEY

LEASE_S = 0.5


@pytest.fixture()
def r(redis_server):
    return redis.Redis.from_url(redis_server.url)


@pytest.fixture(autouse=True)
def no_threads(monkeypatch):
    """The test beats for the workers (a worker that stops beating is one killed with -9)."""
    monkeypatch.setattr(InflightLeases, "start", lambda self: None)


def _unacked(r, tag: str, task_id: str) -> None:
    message = {"headers": {"id": task_id, "task": "tidal.run_chunk"}, "body": "..."}
    r.hset(KOMBU_UNACKED_KEY, tag, json.dumps([message, "tidal.normal", "tidal.normal"]))


def test_sweep_removes_only_entries_of_workers_whose_lease_expired(r):
    restored: list[str] = []
    metrics = WorkerMetrics()
    killed = InflightLeases(r, "tidal", LEASE_S)
    live = InflightLeases(r, "tidal", LEASE_S)
    new = InflightLeases(r, "tidal", LEASE_S, metrics, restore=restored.extend)
    killed.started("t-a1", "normal")
    killed.started("t-a2", "high")
    live.started("t-b", "normal")
    _unacked(r, "tag-a1", "t-a1")
    _unacked(r, "tag-b", "t-b")
    r.hset(inflight_key(), "t-old", "normal")  # written by a worker from before leases
    assert r.hgetall(inflight_key()) == {
        b"t-a1": b"normal", b"t-a2": b"high", b"t-b": b"normal", b"t-old": b"normal"
    }  # fmt: skip
    assert r.hget(inflight_owners_key(), "t-a1").decode() == killed.worker_id

    # Every lease is valid: only the entry without an owner goes.
    assert new.sweep() == ["t-old"]
    assert restored == []

    # The killed worker beats no more; the live one does, and meanwhile took over a
    # redelivered copy of t-a2 (same task id), so that entry is now its own.
    live.started("t-a2", "high")
    deadline = time.monotonic() + 1.5 * LEASE_S
    while time.monotonic() < deadline:
        assert live.heartbeat()
        time.sleep(LEASE_S / 5)
    assert new.sweep() == ["t-a1"]
    assert restored == ["tag-a1"]  # its message goes back to the queue at once
    assert metrics.value("tidal_chunks_reclaimed_total") == 1
    assert r.hgetall(inflight_key()) == {b"t-b": b"normal", b"t-a2": b"high"}
    owner = live.worker_id.encode()
    assert r.hgetall(inflight_owners_key()) == {b"t-b": owner, b"t-a2": owner}

    # One sweep per lease (the lock), then nothing left to remove while the live one beats.
    assert live.sweep() == []
    live.heartbeat()
    time.sleep(LEASE_S)
    live.heartbeat()
    assert new.sweep() == []
    assert set(r.hkeys(inflight_key())) == {b"t-b", b"t-a2"}

    # A worker that stops cleanly drops its lease: leftovers go at the next sweep; its
    # finished chunks are gone already.
    live.finished("t-b")
    live.stop()
    time.sleep(LEASE_S)
    assert new.sweep() == ["t-a2"]
    assert r.hlen(inflight_key()) == 0 and r.hlen(inflight_owners_key()) == 0


def test_heartbeat_writes_back_running_entries_never_finished_ones(r):
    worker = InflightLeases(r, "tidal", LEASE_S)
    worker.started("t1", "normal")
    worker.started("t2", "high")
    r.delete(inflight_key(), inflight_owners_key())  # a sweep while it was cut off, a restart
    worker.finished("t2")
    assert worker.heartbeat()
    assert r.hgetall(inflight_key()) == {b"t1": b"normal"}
    assert r.hgetall(inflight_owners_key()) == {b"t1": worker.worker_id.encode()}

    # A chunk another worker has taken over (same task id) keeps that worker's entry.
    r.hset(inflight_owners_key(), "t1", "other")
    worker.finished("t1")
    assert r.hgetall(inflight_key()) == {b"t1": b"normal"}
    assert worker.heartbeat()
    assert r.hget(inflight_owners_key(), "t1") == b"other"


def test_sweep_never_removes_its_own_entries(r):
    worker = InflightLeases(r, "tidal", LEASE_S)
    worker.started("t1", "normal")
    time.sleep(1.5 * LEASE_S)  # its own lease ran out (no heartbeat: Redis was away)
    assert worker.sweep() == []
    assert r.hkeys(inflight_key()) == [b"t1"]
