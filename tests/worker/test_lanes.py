"""The priority lane overtakes a saturated normal lane; cancel keeps what finished.

Without lane flow control the worker's threads would all hold normal chunks and a high job
would wait for one of them to end. So the test checks the mechanism, not only the outcome:
while saturated the worker holds no more normal messages than its limit (it has stopped
consuming the normal queue), and the high chunk starts on the thread kept free for it before
any running normal chunk ends.
"""

from __future__ import annotations

import time

import pytest

from producer.jobs import JobState
from producer.queues import inflight_key, queue_name
from tests.worker.conftest import wait_for, worker_env
from tests.worker.jobcheck import check_exactly_once, make_client, submit, unacked_messages

pytestmark = pytest.mark.slow

# Two big normal chunks on two threads: without flow control both threads take one and the
# high job can only start once the first ends, i.e. after half the backlog (the engine runs
# same-priority requests in arrival order, so normal chunks end one after the other).
CONCURRENCY = 2
MAX_NORMAL_CHUNKS = 1  # the other thread stays free for the high lane
NUM_NORMAL_LINES = 512
CHUNK_SIZE = 256  # each normal chunk is seconds of engine time


def _num_normal_held(client, job_id: str) -> int | None:
    """Normal messages the worker has taken and not acked (running, or about to be handed
    back); None once a chunk of the normal job has ended (the lane may then resume)."""
    if client.status(job_id).num_chunks_done > 0:
        return None
    normal = queue_name("normal")
    return sum(1 for m in unacked_messages(client.redis) if m.queue == normal)


def _check_normal_lane_paused(client, job_id: str, limit: int) -> None:
    """While no normal chunk ends, the worker settles at ``limit`` normal messages at most (one
    taken in the instant before the pause lands is handed back) and takes no more for a
    second: it has stopped consuming the normal queue. Samples are 20 ms apart."""
    recent: list[int] = []
    deadline = time.monotonic() + 10
    while len(recent) < 10 or max(recent) > limit:  # settled: 10 samples in a row
        held = _num_normal_held(client, job_id)
        assert held is not None and time.monotonic() < deadline, (
            f"held more than {limit} normal chunk(s) {recent} until a chunk ended or 10 s passed"
        )
        recent = [*recent[-9:], held]
        time.sleep(0.02)
    window: list[int] = []
    window_end = time.monotonic() + 1.0
    while time.monotonic() < window_end:
        held = _num_normal_held(client, job_id)
        if held is None:
            break
        window.append(held)
        time.sleep(0.02)
    assert len(window) >= 10 and max(window) <= limit, window


def test_high_lane_overtakes_saturated_normal_lane_then_cancel(
    redis_server, s3_endpoint, tiny_model_dir, start_worker, tmp_path
):
    client = make_client(redis_server.url, s3_endpoint, chunk_size=CHUNK_SIZE)
    normal, _ = submit(client, tmp_path, num_lines=NUM_NORMAL_LINES, max_tokens=128, tag="bulk")
    env = worker_env(redis_server.url, s3_endpoint, tiny_model_dir,
                     TIDAL_CONCURRENCY=str(CONCURRENCY),
                     TIDAL_MAX_NORMAL_CHUNKS=str(MAX_NORMAL_CHUNKS))  # fmt: skip
    worker = start_worker(env)
    worker.wait_ready()

    # Saturated: normal chunks running, more queued behind them; the normal lane is paused.
    wait_for(lambda: client.redis.hlen(inflight_key()) >= 1, 120, "normal chunks in flight")
    _check_normal_lane_paused(client, normal.job_id, MAX_NORMAL_CHUNKS)

    normal_at_submit = client.status(normal.job_id)
    high, high_lines = submit(client, tmp_path, num_lines=16, max_tokens=24, priority="high",
                              tag="urgent")  # fmt: skip
    wait_for(lambda: b"high" in client.redis.hvals(inflight_key()), 60, "the high chunk to run",
             interval_s=0.02)  # fmt: skip
    normal_at_high_start = client.status(normal.job_id)
    assert normal_at_high_start.num_chunks_done == normal_at_submit.num_chunks_done, (
        "the high chunk waited for a normal chunk to end",
        normal_at_submit,
        normal_at_high_start,
    )
    client.wait(high.job_id, timeout_s=240)
    normal_at_high_done = client.status(normal.job_id)
    assert normal_at_high_done.num_done < NUM_NORMAL_LINES // 2, normal_at_high_done
    check_exactly_once(client, high.job_id, high_lines, s3_endpoint)

    # Cancel the bulk job mid-way: queued chunks skipped, running requests aborted.
    status = client.cancel(normal.job_id)
    assert status.state == JobState.CANCELLED
    final = client.wait(normal.job_id, timeout_s=120)
    assert final.state == JobState.CANCELLED
    assert final.num_succeeded >= normal_at_high_done.num_succeeded  # what finished is kept
    assert final.num_succeeded + final.num_failed + final.num_cancelled == NUM_NORMAL_LINES
    assert final.num_cancelled > 0 and final.num_failed == 0
    results = list(client.results(normal.job_id))
    ok = [r for r in results if r["error"] is None]
    assert len(ok) == final.num_succeeded
    assert all(r["error"]["code"] == "cancelled" for r in results if r["error"] is not None)
    # Output lines that exist are still in input order.
    indices = [int(r["custom_id"].split("-")[1]) for r in results]
    assert indices == sorted(indices) and len(set(indices)) == len(indices)
