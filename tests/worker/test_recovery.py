"""The lost-chunk sweep (worker/recovery.py) against a real Redis and moto S3, no worker
process: the "workers" here are ``InflightLeases`` whose heartbeats the test drives itself
(tests/worker/test_failures.py kills real workers)."""

from __future__ import annotations

import base64
import json
import time
from types import SimpleNamespace

import pytest
import redis

from producer.jobs import JobState, JobStatus, JobStore
from producer.queues import job_chunks_key, job_key, open_jobs_key, worker_registry_key
from tests.worker.jobcheck import make_client, submit
from worker.inflight import InflightLeases
from worker.metrics import WorkerMetrics
from worker.recovery import KOMBU_UNACKED_KEY, LostChunkSweeper, chunk_of, chunk_of_body

LAST_FULL_KEY = "tidal.lost_chunk_check.last_full"
CHECK_KEY = "tidal.lost_chunk_check"


@pytest.fixture(autouse=True)
def no_threads(monkeypatch):
    """The test beats for the workers (a worker that stops beating is one killed with -9)."""
    monkeypatch.setattr(InflightLeases, "start", lambda self: None)


def _runtime(r, storage=None, full_check_interval_s: float = 6 * 3600):
    settings = SimpleNamespace(
        queue_prefix="tidal", lost_chunk_full_check_interval_s=full_check_interval_s
    )
    return SimpleNamespace(redis=r, settings=settings, storage=storage, metrics=WorkerMetrics())


def _checks(rt) -> dict[str, float]:
    return {
        reason: rt.metrics.value("tidal_lost_chunk_checks_total", {"reason": reason})
        for reason in ("worker_death", "confirmation", "safety_net")
    }


def _sweep_again(sweeper, interval_s: float):
    time.sleep(interval_s * 1.2)  # the sweep lock (0.9 interval) has expired
    return sweeper.sweep()


def test_chunk_of_reads_the_chunk_header_and_agrees_with_the_body(
    redis_server, s3_endpoint, tmp_path
):
    """Chunk messages carry ``tidal_chunk``, read without decoding the message: it must name
    the chunk the body names, in a queue entry and in an ``unacked`` value alike; a message
    without it (an older producer) is read from its body."""
    client = make_client(redis_server.url, s3_endpoint, chunk_size=8)
    handle, _ = submit(client, tmp_path, num_lines=37, max_tokens=4)  # 5 chunks
    raws = client.redis.lrange("tidal.normal", 0, -1)
    assert sorted(chunk_of_body(raw) for raw in raws) == [(handle.job_id, i) for i in range(5)]
    for raw in raws:
        message = json.loads(raw)
        assert message["headers"]["tidal_chunk"] == "{} {}".format(*chunk_of_body(raw))
        assert chunk_of(raw) == chunk_of_body(raw)
        assert chunk_of(json.dumps([message, "", "tidal.normal"])) == chunk_of_body(raw)
        del message["headers"]["tidal_chunk"]
        assert chunk_of(json.dumps(message)) == chunk_of_body(raw)
    assert chunk_of(b'{"headers": {"task": "tidal.warmup"}}') is None


def test_sweep_resends_only_chunks_nobody_holds_as_the_producer_sent_them(
    redis_server, s3_endpoint, tmp_path
):
    client = make_client(redis_server.url, s3_endpoint, chunk_size=8)
    handle, _ = submit(client, tmp_path, num_lines=37, max_tokens=4)  # 5 chunks, last short
    r = client.redis
    raws = r.lrange("tidal.normal", 0, -1)
    sent = {chunk_of(raw)[1]: json.loads(raw) for raw in raws}
    assert sorted(sent) == [0, 1, 2, 3, 4]
    r.delete("tidal.normal")
    # chunk 0 is done, chunk 1 delivered to a live worker, chunk 2 still queued; 3 and 4 lost
    r.sadd(job_chunks_key(handle.job_id), 0)
    r.hset(KOMBU_UNACKED_KEY, "tag-1", json.dumps([sent[1], "tidal.normal", "tidal.normal"]))
    r.lpush("tidal.normal", json.dumps(sent[2]))

    resent = []
    rt = SimpleNamespace(
        redis=r,
        settings=SimpleNamespace(queue_prefix="tidal"),
        storage=client.storage,
        metrics=WorkerMetrics(),
    )
    # an interval long enough that two calls in a row fall inside one sweep lock (0.9 of it)
    # on a loaded machine: at 10 ms the lock expired between them in a CI run
    interval = 0.2
    sweeper, other_worker = (
        LostChunkSweeper(rt, lambda name, **kw: resent.append((name, kw)), interval) for _ in "ab"
    )
    time.sleep(5 * interval)  # older than two intervals: the producer has sent all its chunks
    assert sweeper.sweep() == []  # missing once: could be a BRPOP reply on its way
    assert other_worker.sweep() == []  # the lock: one sweep per interval
    time.sleep(2 * interval)  # the lock expires; any worker confirms the suspects
    assert other_worker.sweep() == [(handle.job_id, 3), (handle.job_id, 4)]
    assert [name for name, _ in resent] == ["tidal.run_chunk"] * 2
    assert all(kw["queue"] == "tidal.normal" for _, kw in resent)
    for (_, kw), index in zip(resent, (3, 4), strict=True):
        _args, original, _embed = json.loads(_body(sent[index]))
        assert kw["kwargs"] == original
    assert rt.metrics.chunks_resent._value.get() == 2

    # Once done or held again, nothing more is sent; a finished job is not looked at.
    time.sleep(2 * interval)
    r.sadd(job_chunks_key(handle.job_id), 3, 4)
    assert sweeper.sweep() == [] and len(resent) == 2
    r.hset(f"tidal.job.{handle.job_id}", "state", "completed")
    r.delete(KOMBU_UNACKED_KEY, "tidal.normal")
    for _ in range(2):
        time.sleep(2 * interval)
        assert sweeper.sweep() == []


def _body(message: dict) -> bytes:
    import base64

    body = message["body"]
    return base64.b64decode(body) if message["properties"]["body_encoding"] == "base64" else body


def _chunk_message(job_id: str, chunk_index: int, pad: int = 700) -> bytes:
    """A Celery message of one chunk as kombu stores it in a queue list (~1 KB)."""
    kwargs = {"job_id": job_id, "chunk_index": chunk_index, "lane": "normal",
              "storage_url": "s3://nowhere/jobs", "first_line": chunk_index, "num_lines": 1,
              "byte_start": 0, "byte_end": 1, "enqueued_at": 0.0}  # fmt: skip
    body = base64.b64encode(json.dumps([[], kwargs, {}]).encode()).decode()
    message = {"body": body, "content-encoding": "utf-8", "content-type": "application/json",
               "headers": {"task": "tidal.run_chunk", "id": f"{job_id}-{chunk_index}",
                           "pad": "x" * pad},
               "properties": {"body_encoding": "base64", "delivery_tag": f"tag-{chunk_index}",
                              "delivery_info": {"exchange": "", "routing_key": "tidal.normal"},
                              "priority": 0}}  # fmt: skip
    return json.dumps(message).encode()


def test_live_workers_and_a_large_backlog_cost_no_queue_reads(redis_server):
    # The steady state of a batch fleet: thousands of queued chunk messages, every worker
    # alive. The old sweep read every queue list in full (one MULTI) each interval; now a
    # sweep only looks for deaths and checks nothing (no LRANGE at all).
    r = redis.Redis.from_url(redis_server.url)
    num_chunks = 3000
    JobStore(r, "tidal", 3600).create(JobStatus(
        job_id="job-backlog", state=JobState.QUEUED, lane="normal",
        storage_url="s3://nowhere/jobs", num_lines=num_chunks, num_chunks=num_chunks,
        chunk_size=1, created_at=time.time() - 3600))  # fmt: skip
    pipe = r.pipeline(transaction=False)
    for chunk_index in range(num_chunks):
        pipe.lpush("tidal.normal", _chunk_message("job-backlog", chunk_index))
    pipe.execute()
    workers = [InflightLeases(r, "tidal", 30) for _ in range(3)]
    for worker in workers:
        assert worker.heartbeat()
    resent = []
    rt = _runtime(r, full_check_interval_s=3600)
    sweeper = LostChunkSweeper(rt, lambda name, **kw: resent.append(kw), 0.02)

    # The first sweep ever is the safety-net full check (none recorded yet): it reads the
    # lists in pages of 1000, not in one command.
    r.config_resetstat()
    assert sweeper.sweep() == []
    lrange = r.info("commandstats")["cmdstat_lrange"]
    assert lrange["calls"] >= num_chunks // 1000 + 1, lrange

    r.config_resetstat()
    for _ in range(6):
        assert _sweep_again(sweeper, 0.02) == []
    stats = r.info("commandstats")
    assert "cmdstat_lrange" not in stats and "cmdstat_hvals" not in stats, stats
    assert "cmdstat_scan" not in stats, stats  # nor any scan of the job records
    assert resent == []
    assert _checks(rt) == {"worker_death": 0, "confirmation": 0, "safety_net": 1}
    assert {w.decode() for w in r.hkeys(worker_registry_key())} == {w.worker_id for w in workers}


def test_a_worker_death_starts_checks_that_resend_a_lost_chunk(redis_server, s3_endpoint, tmp_path):
    client = make_client(redis_server.url, s3_endpoint, chunk_size=8)
    handle, _ = submit(client, tmp_path, num_lines=16, max_tokens=4)  # 2 chunks
    r = client.redis
    sent = {chunk_of(raw)[1]: raw for raw in r.lrange("tidal.normal", 0, -1)}
    r.delete("tidal.normal")
    r.lpush("tidal.normal", sent[0])  # chunk 0 queued; chunk 1 popped by a worker that dies
    r.set(LAST_FULL_KEY, repr(time.time()))  # the safety net ran just now, due in an hour
    lease_s, interval_s = 0.4, 0.05
    live, dying = InflightLeases(r, "tidal", lease_s), InflightLeases(r, "tidal", lease_s)
    assert live.heartbeat() and dying.heartbeat()  # dying never had an in-flight entry
    resent = []
    rt = _runtime(r, client.storage, full_check_interval_s=3600)
    sweeper = LostChunkSweeper(rt, lambda name, **kw: resent.append(kw), interval_s)

    # Both alive: no check (the chunk is in fact lost already, but nobody has died yet, and
    # only a death can lose one: the safety net would find it within its interval).
    for _ in range(5):
        assert live.heartbeat() and dying.heartbeat()
        assert _sweep_again(sweeper, interval_s) == []
    assert resent == [] and not r.exists(CHECK_KEY)

    # dying is SIGKILLed: its lease expires. The next sweep sees the death and checks; the
    # chunk, missing in two checks in a row, is sent again as the producer sent it.
    deadline = time.monotonic() + 1.5 * lease_s
    while time.monotonic() < deadline:
        assert live.heartbeat()
        time.sleep(lease_s / 5)
    assert _sweep_again(sweeper, interval_s) == []  # missing once: a suspect
    assert r.hexists(CHECK_KEY, "since")
    assert {w.decode() for w in r.hkeys(worker_registry_key())} == {live.worker_id}
    assert _sweep_again(sweeper, interval_s) == [(handle.job_id, 1)]
    assert len(resent) == 1 and resent[0]["queue"] == "tidal.normal"
    _args, original, _embed = json.loads(_body(json.loads(sent[1])))
    assert resent[0]["kwargs"] == original
    assert rt.metrics.chunks_resent._value.get() == 1

    # The resent message is queued; checks go on until two of them have looked at every job
    # created before the death (two intervals on), then stop.
    r.lpush("tidal.normal", sent[1])
    for _ in range(8):
        live.heartbeat()
        assert _sweep_again(sweeper, interval_s) == []
        if not r.exists(CHECK_KEY):
            break
    assert not r.exists(CHECK_KEY)
    checks = _checks(rt)
    assert checks["worker_death"] >= 4 and checks["safety_net"] == 0, checks
    for _ in range(3):
        live.heartbeat()
        assert _sweep_again(sweeper, interval_s) == []
    assert _checks(rt) == checks and len(resent) == 1


def test_paged_scan_sees_messages_that_move_between_unacked_and_a_queue(
    redis_server, s3_endpoint, tmp_path
):
    # 40 chunks, 40 messages; the check reads the list in pages of 10. After its first page
    # one message goes from unacked back to the head of the list (already read), as a
    # restore does, and another from an unread page to unacked, as a delivery does. Both
    # are held all along: neither may be reported missing.
    client = make_client(redis_server.url, s3_endpoint, chunk_size=1)
    handle, _ = submit(client, tmp_path, num_lines=40, max_tokens=4)
    r = client.redis
    raws = {chunk_of(raw)[1]: raw for raw in r.lrange("tidal.normal", 0, -1)}
    restored, delivered = 5, 3  # delivered sits at index 36: the fourth page
    r.lrem("tidal.normal", 1, raws[restored])
    entry = json.dumps([json.loads(raws[restored]), "", "tidal.normal"])
    r.hset(KOMBU_UNACKED_KEY, "tag-restored", entry)
    rt = _runtime(r, client.storage)
    sweeper = LostChunkSweeper(rt, lambda name, **kw: None, 0.01)
    sweeper.page_size = 10
    pages = []

    def move(key: str, start: int) -> None:
        pages.append((key, start))
        if (key, start) != ("tidal.normal", 0):
            return
        pipe = r.pipeline()  # a restore: one transaction
        pipe.hdel(KOMBU_UNACKED_KEY, "tag-restored")
        pipe.lpush("tidal.normal", raws[restored])
        pipe.execute()
        r.lrem("tidal.normal", 1, raws[delivered])  # a delivery: BRPOP, then unacked
        entry = json.dumps([json.loads(raws[delivered]), "", "tidal.normal"])
        r.hset(KOMBU_UNACKED_KEY, "tag-delivered", entry)

    sweeper.on_page = move
    time.sleep(0.03)  # the job is older than two intervals
    assert sweeper.sweep() == []  # the first sweep: the safety-net full check
    assert [start for key, start in pages if key == "tidal.normal"] == [0, 10, 20, 30]  # 39 entries
    assert r.smembers(sweeper.suspects_key) == set()
    assert _checks(rt)["safety_net"] == 1

    # A chunk truly gone is still found: delivered's message vanishes (a dying worker).
    sweeper.on_page = None
    r.hdel(KOMBU_UNACKED_KEY, "tag-delivered")
    assert _sweep_again(sweeper, 0.01) == []  # no death, no suspects: no check
    r.hset(CHECK_KEY, mapping={"since": repr(time.time()), "checks": 0})
    assert _sweep_again(sweeper, 0.01) == []
    assert r.smembers(sweeper.suspects_key) == {f"{handle.job_id} {delivered}".encode()}


def test_open_jobs_set_follows_job_state_and_the_full_check_adds_older_jobs(
    redis_server, s3_endpoint, tmp_path
):
    client = make_client(redis_server.url, s3_endpoint, chunk_size=8)
    done, _ = submit(client, tmp_path, num_lines=8, max_tokens=4, tag="done")
    cancelled, _ = submit(client, tmp_path, num_lines=8, max_tokens=4, tag="cancelled")
    older, _ = submit(client, tmp_path, num_lines=8, max_tokens=4, tag="older")
    r = client.redis
    r.delete("tidal.normal")
    open_jobs = lambda: {m.decode() for m in r.smembers(open_jobs_key())}  # noqa: E731
    assert open_jobs() == {done.job_id, cancelled.job_id, older.job_id}
    store = JobStore(r, "tidal", 3600)
    assert store.mark_started(done.job_id) == "running"
    store.chunk_done(done.job_id, 0, num_succeeded=8)  # the last chunk: completed
    client.cancel(cancelled.job_id)
    assert open_jobs() == {older.job_id}

    # A job submitted before the set existed (or by an older producer) is not in it: the
    # full check finds its record, adds it, and finds its lost chunk.
    r.srem(open_jobs_key(), older.job_id)
    r.hset(job_key(done.job_id), "state", "running")  # a stale record the set dropped
    rt = _runtime(r, client.storage)
    resent = []
    sweeper = LostChunkSweeper(rt, lambda name, **kw: resent.append(kw), 0.01)
    time.sleep(0.03)
    sweeper.sweep()
    assert older.job_id in open_jobs()
    assert r.smembers(sweeper.suspects_key) == {f"{older.job_id} 0".encode()}
    assert _sweep_again(sweeper, 0.01) == [(older.job_id, 0)]  # confirmation check
    # A job record that is gone leaves the set at the next check.
    r.delete(job_key(older.job_id))
    r.hset(CHECK_KEY, mapping={"since": repr(time.time()), "checks": 0})
    _sweep_again(sweeper, 0.01)
    assert older.job_id not in open_jobs()


def test_a_chunk_of_a_job_too_young_at_the_death_is_still_found(
    redis_server, s3_endpoint, tmp_path
):
    # A check skips jobs younger than two intervals (their producer may still be sending).
    # A worker that dies right after a new job's chunk reached it: the checks of the next
    # two intervals cannot see that job, so the death is only settled by two checks after.
    lease_s, interval_s = 0.1, 0.3
    client = make_client(redis_server.url, s3_endpoint, chunk_size=8)
    r = client.redis
    r.set(LAST_FULL_KEY, repr(time.time()))
    dying = InflightLeases(r, "tidal", lease_s)
    assert dying.heartbeat()
    handle, _ = submit(client, tmp_path, num_lines=8, max_tokens=4)  # 1 chunk: popped, lost
    r.delete("tidal.normal")
    rt = _runtime(r, client.storage, full_check_interval_s=3600)

    def send(name, kwargs, queue, headers):  # the resent message is queued
        r.lpush(queue, _chunk_message(kwargs["job_id"], kwargs["chunk_index"]))

    sweeper = LostChunkSweeper(rt, send, interval_s)
    time.sleep(lease_s * 1.2)  # the lease expires
    lost = sweeper.sweep()  # the death is seen; the job is too young for this check
    assert r.exists(CHECK_KEY) and lost == []
    for _ in range(10):
        lost += _sweep_again(sweeper, interval_s)
        if not r.exists(CHECK_KEY):
            break
    assert lost == [(handle.job_id, 0)], _checks(rt)
