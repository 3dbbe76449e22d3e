"""The priority lane overtakes a saturated normal lane; cancel keeps what finished."""

from __future__ import annotations

import pytest

from producer.jobs import JobState
from producer.queues import inflight_key
from tests.worker.conftest import wait_for, worker_env
from tests.worker.jobcheck import check_exactly_once, make_client, submit

pytestmark = pytest.mark.slow


def test_high_lane_overtakes_saturated_normal_lane_then_cancel(
    redis_server, s3_endpoint, tiny_model_dir, start_worker, tmp_path
):
    client = make_client(redis_server.url, s3_endpoint, chunk_size=16)
    normal, _ = submit(client, tmp_path, num_lines=512, max_tokens=24, tag="bulk")
    worker = start_worker(worker_env(redis_server.url, s3_endpoint, tiny_model_dir))
    worker.wait_ready()
    # Saturated: normal chunks running, more queued behind them.
    wait_for(lambda: client.redis.hlen(inflight_key()) >= 2, 120, "normal chunks in flight")
    high, high_lines = submit(client, tmp_path, num_lines=16, max_tokens=24, priority="high",
                              tag="urgent")  # fmt: skip
    client.wait(high.job_id, timeout_s=240)
    normal_at_high_done = client.status(normal.job_id)
    assert normal_at_high_done.num_done < 256, normal_at_high_done
    check_exactly_once(client, high.job_id, high_lines, s3_endpoint)

    # Cancel the bulk job mid-way: queued chunks skipped, running requests aborted.
    status = client.cancel(normal.job_id)
    assert status.state == JobState.CANCELLED
    final = client.wait(normal.job_id, timeout_s=120)
    assert final.state == JobState.CANCELLED
    assert final.num_succeeded >= normal_at_high_done.num_succeeded  # what finished is kept
    assert final.num_succeeded + final.num_failed + final.num_cancelled == 512
    assert final.num_cancelled > 0 and final.num_failed == 0
    results = list(client.results(normal.job_id))
    ok = [r for r in results if r["error"] is None]
    assert len(ok) == final.num_succeeded
    assert all(r["error"]["code"] == "cancelled" for r in results if r["error"] is not None)
    # Output lines that exist are still in input order.
    indices = [int(r["custom_id"].split("-")[1]) for r in results]
    assert indices == sorted(indices) and len(set(indices)) == len(indices)
