"""Faults while a job runs: kill -9, SIGTERM, an engine crash, a Redis restart, S3 500s, a
missing bucket / 403.

Each test checks the delivery guarantee: every accepted line ends with exactly one output
line and every chunk with exactly one result object; duplicates are counted, nothing lost.
"""

from __future__ import annotations

import json
import signal
import time

import boto3
import pytest
import redis

from producer.jobs import RUN_CHUNK_TASK, JobState
from producer.queues import dead_letter_key, inflight_key, inflight_owners_key, job_chunks_key
from producer.storage import PermanentStorageError
from tests.worker.conftest import free_port, wait_for, worker_env
from tests.worker.faulty_engine_worker import FAULT_MESSAGE
from tests.worker.jobcheck import (
    check_exactly_once,
    make_client,
    queued_chunks,
    submit,
    unacked_messages,
    where_chunks_are,
)
from tests.worker.s3_fault_proxy import S3FaultProxy
from worker.inflight import InflightLeases
from worker.tasks import EXIT_ENGINE_DEAD

pytestmark = pytest.mark.slow

FAST_RECOVERY = {
    "TIDAL_VISIBILITY_TIMEOUT_S": "6",
    "TIDAL_UNACKED_RESTORE_INTERVAL_S": "1",
    "TIDAL_UNACKED_RESTORE_THROTTLE": "1",
    "TIDAL_LOST_CHUNK_SWEEP_INTERVAL_S": "1",
    "TIDAL_INFLIGHT_LEASE_S": "2",
}


def wait_explained(client, job_id: str, timeout_s: float, **workers) -> None:
    """``client.wait``; on a timeout, where each chunk is and every named worker's log tail."""
    try:
        client.wait(job_id, timeout_s=timeout_s)
    except TimeoutError as exc:
        logs = "\n".join(f"{name} worker:\n{w.tail(20000)}" for name, w in workers.items())
        raise TimeoutError(f"{exc}\n{where_chunks_are(client, job_id)}\n{logs}") from exc


def _mid_job(client, job_id: str, min_chunks: int = 1):
    """Wait until some chunks are done and others are running; return that status."""

    def progress():
        status = client.status(job_id)
        num_running = client.redis.hlen(inflight_key())
        return status.num_chunks_done >= min_chunks and num_running >= 1 and status

    status = wait_for(progress, 240, "progress with chunks in flight", interval_s=0.05)
    assert status.num_chunks_done < status.num_chunks, "the job finished before the fault"
    return status


def test_kill_9_then_new_worker(redis_server, s3_endpoint, tiny_model_dir, start_worker, tmp_path):
    client = make_client(redis_server.url, s3_endpoint)
    handle, lines = submit(client, tmp_path, num_lines=96, max_tokens=48)
    env = worker_env(redis_server.url, s3_endpoint, tiny_model_dir, **FAST_RECOVERY)
    first = start_worker(env)
    first.wait_ready()
    _mid_job(client, handle.job_id)
    first.stop(signal.SIGKILL)
    assert client.status(handle.job_id).state != JobState.COMPLETED
    second = start_worker({**env, "TIDAL_METRICS_PORT": str(free_port())})
    second.wait_ready()
    wait_explained(client, handle.job_id, 300, first=first, second=second)
    # A kill may or may not cause a counted duplicate; either way one result per line.
    check_exactly_once(client, handle.job_id, lines, s3_endpoint)
    wait_for(lambda: client.redis.hlen(inflight_key()) == 0, 10, "no chunk left in flight")


def test_kill_9_in_flight_entries_expire_with_the_lease_live_ones_stay(
    redis_server, s3_endpoint, tiny_model_dir, start_worker, tmp_path
):
    # KEDA counts tidal.inflight; a worker killed outright never removes its entries. Both
    # workers here hold their chunks (started, recorded in flight) until a file appears, so
    # the live one's entries are older than many leases when the killed one's expire. The
    # visibility timeout is hours: only the lease can bring the killed worker's chunks back.
    client = make_client(redis_server.url, s3_endpoint)
    handle, lines = submit(client, tmp_path, num_lines=48, max_tokens=4)  # 6 chunks
    env = worker_env(redis_server.url, s3_endpoint, tiny_model_dir, TIDAL_INFLIGHT_LEASE_S="2")
    never, release = tmp_path / "never", tmp_path / "release"
    entries = lambda: {t.decode() for t in client.redis.hkeys(inflight_key())}  # noqa: E731

    killed = start_worker(env, launcher=["-m", "tests.worker.held_chunk_worker", str(never)])
    killed.wait_ready()
    killed_chunks = wait_for(lambda: len(entries()) == 2 and entries(), 60, "2 chunks held")
    live = start_worker(
        {**env, "TIDAL_METRICS_PORT": str(free_port())},
        launcher=["-m", "tests.worker.held_chunk_worker", str(release)],
    )
    live.wait_ready()
    wait_for(lambda: len(entries()) == 4, 60, "2 more chunks held")
    live_chunks = entries() - killed_chunks
    killed.stop(signal.SIGKILL)
    assert entries() == killed_chunks | live_chunks  # what KEDA counted after the kill

    def killed_entries_gone() -> bool:
        now = entries()
        assert live_chunks <= now, f"a live worker's entry was removed:\n{live.tail()}"
        return not now & killed_chunks

    try:
        wait_for(killed_entries_gone, 20, "the killed worker's entries to expire", 0.05)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}: in flight {client.redis.hgetall(inflight_key())}\n"
                           f"{where_chunks_are(client, handle.job_id)}") from exc  # fmt: skip
    # Three more leases while the live worker holds on. A worker never sweeps its own entries,
    # so sweep from here too (the product's sweep, as any other worker would run it; it takes
    # the lock before the live worker's next turn): the live worker's heartbeats must keep it.
    other = InflightLeases(client.redis, "tidal", 2.0)
    num_other_sweeps, end = 0, time.monotonic() + 3 * 2
    while time.monotonic() < end:
        was_locked = client.redis.exists(other.sweep_lock_key)
        other.sweep()
        took_lock = client.redis.get(other.sweep_lock_key) == other.worker_id.encode()
        num_other_sweeps += not was_locked and took_lock
        killed_entries_gone()
        time.sleep(0.05)
    assert num_other_sweeps >= 2
    assert "handed 2 chunk message(s) back to their queues" in live.tail(50000)

    release.touch()
    client.wait(handle.job_id, timeout_s=120)
    status = check_exactly_once(client, handle.job_id, lines, s3_endpoint)
    assert status.num_duplicates == 0, status  # the killed worker's chunks never ran
    wait_for(lambda: not entries(), 10, "no chunk left in flight")
    assert client.redis.hlen(inflight_owners_key()) == 0


def test_kill_9_while_fetching_a_chunk(
    redis_server, s3_endpoint, tiny_model_dir, start_worker, tmp_path
):
    # kombu pops a message (BRPOP) before it records it in `unacked`; a worker killed in
    # between leaves that chunk nowhere, and the visibility timeout cannot bring it back. The
    # kill -9 test above hit this by chance (1 run in about 30 under load). Here the worker
    # SIGKILLs itself while fetching its third chunk message, after the first two started.
    client = make_client(redis_server.url, s3_endpoint)
    handle, lines = submit(client, tmp_path, num_lines=48, max_tokens=16)
    # The safety-net full check ran just now and is not due for an hour: only the death of
    # the first worker (its lease expires) can start the checks that find the lost chunk.
    client.redis.set("tidal.lost_chunk_check.last_full", repr(time.time()))
    env = worker_env(redis_server.url, s3_endpoint, tiny_model_dir, **FAST_RECOVERY,
                     TIDAL_LOST_CHUNK_FULL_CHECK_INTERVAL_S="3600")  # fmt: skip
    first = start_worker(env, launcher=["-m", "tests.worker.lossy_fetch_worker", "3"])
    wait_for(lambda: first.proc.poll() is not None, 180, "the worker to die fetching a chunk")
    assert first.proc.returncode == -signal.SIGKILL, first.tail()

    held = {m.kwargs["chunk_index"] for m in unacked_messages(client.redis)}
    held |= queued_chunks(client.redis, handle.job_id)
    done = {int(c) for c in client.redis.smembers(job_chunks_key(handle.job_id))}
    status = client.status(handle.job_id)
    lost = set(range(status.num_chunks)) - held - done
    assert len(lost) == 1, where_chunks_are(client, handle.job_id)

    second = start_worker({**env, "TIDAL_METRICS_PORT": str(free_port())})
    second.wait_ready()
    wait_explained(client, handle.job_id, 120, second=second)
    status = check_exactly_once(client, handle.job_id, lines, s3_endpoint)
    assert status.num_duplicates == 0, status  # the lost chunk had never run
    log = second.tail(50000)
    assert "died (lease expired): checking for lost chunks" in log, log
    assert "was in no queue and held by no worker" in log
    assert 'tidal_lost_chunk_checks_total{reason="safety_net"} 0.0' in second.metrics_text()


def test_engine_crash_exits_without_ack_then_new_worker(
    redis_server, s3_endpoint, tiny_model_dir, start_worker, tmp_path
):
    client = make_client(redis_server.url, s3_endpoint)
    handle, lines = submit(client, tmp_path, num_lines=64, max_tokens=48)
    env = worker_env(redis_server.url, s3_endpoint, tiny_model_dir, **FAST_RECOVERY)
    # The engine's step raises after 150 steps (a few for the start-up warm-up, then about
    # three chunks' worth), as a CUDA fault would, while chunks are running.
    launcher = ["-m", "tests.worker.faulty_engine_worker", "150"]
    first = start_worker(env, launcher=launcher)
    first.wait_ready()
    wait_for(lambda: first.proc.poll() is not None, 120, "the worker to die with its engine")
    assert first.proc.returncode == EXIT_ENGINE_DEAD, first.tail()
    log = first.tail(50000)
    assert FAULT_MESSAGE in log and "exiting without acking" in log, log

    # The chunks it was running are still delivered-not-acked, and none of them is done.
    status = client.status(handle.job_id)
    assert status.state != JobState.COMPLETED, status
    held = [m.kwargs for m in unacked_messages(client.redis) if m.task == RUN_CHUNK_TASK]
    assert held and all(kw["job_id"] == handle.job_id for kw in held), held
    assert all(m.queue == "tidal.normal" for m in unacked_messages(client.redis))
    held_chunks = {kw["chunk_index"] for kw in held}
    done_chunks = {int(c) for c in client.redis.smembers(job_chunks_key(handle.job_id))}
    # A chunk may have written its result just before the exit, without its ack: it is
    # redelivered too, and then counted as a duplicate (never a second result).
    finished_unacked = held_chunks & done_chunks
    assert len(finished_unacked) < len(held_chunks), (held_chunks, done_chunks)

    second = start_worker({**env, "TIDAL_METRICS_PORT": str(free_port())})
    second.wait_ready()
    client.wait(handle.job_id, timeout_s=120)
    # The job completes as soon as its last new chunk is counted; a redelivered chunk that
    # was already done may run after that, so wait for its duplicate count (a redelivery
    # that never comes times out here) and for every message to be acked.
    wait_for(
        lambda: client.status(handle.job_id).num_duplicates >= len(finished_unacked),
        60, "the redelivered finished chunk to be counted as a duplicate",
    )  # fmt: skip
    wait_for(lambda: not unacked_messages(client.redis), 10, "every message to be acked")
    status = check_exactly_once(client, handle.job_id, lines, s3_endpoint)
    assert status.num_duplicates == len(finished_unacked), status


def test_sigterm_hands_back_within_soft_timeout(
    redis_server, s3_endpoint, tiny_model_dir, start_worker, tmp_path
):
    # Chunks much longer than the soft timeout, so running ones must be handed back: 64
    # lines of 400 tokens each (no early EOS) run for several seconds even on a fast machine
    # (chunks of 32 lines of up to 240 tokens once all finished within the 2 s).
    client = make_client(redis_server.url, s3_endpoint, chunk_size=64)
    handle, lines = submit(client, tmp_path, num_lines=320, max_tokens=400, ignore_eos=True)
    # A visibility timeout of hours: only the hand-back at shutdown can bring chunks back.
    env = worker_env(
        redis_server.url, s3_endpoint, tiny_model_dir, TIDAL_SOFT_SHUTDOWN_TIMEOUT_S="2"
    )
    first = start_worker(env)
    first.wait_ready()
    done = _mid_job(client, handle.job_id).num_chunks_done

    # Stop while at least two chunks run and none has ended since we last looked (each runs
    # for seconds). When one ends meanwhile, wait for the chunks that follow it instead.
    seen = {"done": done}

    def fresh_chunks() -> bool:
        num_done = client.status(handle.job_id).num_chunks_done
        if num_done != seen["done"]:
            seen["done"] = num_done
            return False
        return client.redis.hlen(inflight_key()) >= 2

    wait_for(fresh_chunks, 60, "fresh chunks", interval_s=0.05)
    time.sleep(0.5)
    start = time.monotonic()
    first.stop(signal.SIGTERM, timeout_s=30)
    stop_s = time.monotonic() - start
    assert stop_s < 15, f"worker took {stop_s:.1f} s to stop after SIGTERM:\n{first.tail()}"
    log = first.tail(50000)
    assert "Initiating Soft Shutdown" in log and "handing back" in log, log
    assert "reject requeue=True: soft shutdown timeout reached" in log, log
    assert client.status(handle.job_id).state == JobState.RUNNING
    second = start_worker({**env, "TIDAL_METRICS_PORT": str(free_port())})
    second.wait_ready()
    client.wait(handle.job_id, timeout_s=300)
    status = check_exactly_once(client, handle.job_id, lines, s3_endpoint)
    assert status.num_duplicates == 0  # handed back untouched: nothing was written twice


def test_redis_restart_mid_job(redis_server, s3_endpoint, tiny_model_dir, start_worker, tmp_path):
    client = make_client(redis_server.url, s3_endpoint)
    handle, lines = submit(client, tmp_path, num_lines=96, max_tokens=48)
    worker = start_worker(
        worker_env(redis_server.url, s3_endpoint, tiny_model_dir, **FAST_RECOVERY)
    )
    worker.wait_ready()
    _mid_job(client, handle.job_id)
    redis_server.restart()  # same port and dir; AOF (fsync always) brings the data back
    # seen once timing out under a full CI run: keep the worker's side of it
    wait_explained(client, handle.job_id, 300, worker=worker)
    check_exactly_once(client, handle.job_id, lines, s3_endpoint)


def test_s3_errors_for_a_while(redis_server, s3_endpoint, tiny_model_dir, start_worker, tmp_path):
    proxy = S3FaultProxy(s3_endpoint)
    try:
        client = make_client(redis_server.url, s3_endpoint)
        handle, lines = submit(client, tmp_path, num_lines=32, max_tokens=4)
        proxy.fail_next(14)  # more than boto3's 5 attempts: whole chunks must be retried too
        env = worker_env(redis_server.url, proxy.url, tiny_model_dir)
        worker = start_worker(env)
        worker.wait_ready()
        client.wait(handle.job_id, timeout_s=300)
        assert proxy.num_failed == 14
        check_exactly_once(client, handle.job_id, lines, s3_endpoint)
        assert "retry in" in worker.tail(50000)
    finally:
        proxy.close()


def test_missing_bucket_and_403_fail_fast(
    redis_server, s3_endpoint, tiny_model_dir, start_worker, tmp_path
):
    # The producer refuses at once, before anything is queued.
    start = time.monotonic()
    with pytest.raises(PermanentStorageError, match="no-such-bucket"):
        submit(make_client(redis_server.url, s3_endpoint, bucket="no-such-bucket"), tmp_path, 4, 4)
    proxy = S3FaultProxy(s3_endpoint)
    proxy.forbid()
    try:
        with pytest.raises(PermanentStorageError, match="403|AccessDenied"):
            submit(make_client(redis_server.url, proxy.url), tmp_path, 4, 4)
        assert time.monotonic() - start < 10
        r = redis.Redis.from_url(redis_server.url)
        assert r.llen("tidal.normal") == 0

        # A worker that is refused by S3 fails the job (no retry loop) and dead-letters it.
        client = make_client(redis_server.url, s3_endpoint)
        handle, _ = submit(client, tmp_path, num_lines=16, max_tokens=4)
        worker = start_worker(worker_env(redis_server.url, proxy.url, tiny_model_dir))
        worker.wait_ready()
        status = client.wait(handle.job_id, timeout_s=60)
        assert status.state == JobState.FAILED
        assert "403" in status.error and "permanent" in status.error
        dead = [json.loads(d) for d in r.lrange(dead_letter_key(), 0, -1)]
        assert dead and all(d["reason"] == "permanent" for d in dead)
        assert "retry in" not in worker.tail(50000)
    finally:
        proxy.close()
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    listing = s3.list_objects_v2(Bucket="tidal-test", Prefix=f"jobs/{handle.job_id}/results/")
    assert listing.get("KeyCount", 0) == 0
