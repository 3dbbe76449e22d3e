"""The warm-up task (and its expiry), the beat schedule, `tidal beat` sending warm-ups, and
the metrics endpoint after a job."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import datetime

import pytest
from prometheus_client.parser import text_string_to_metric_families

from producer.jobs import WARMUP_TASK, JobState
from producer.queues import queue_name, redis_list_keys
from tests.worker.conftest import wait_for, worker_env
from tests.worker.jobcheck import make_client, submit

METRIC_NAMES = {
    "tidal_queue_depth", "tidal_chunks_in_flight", "tidal_jobs_completed_total",
    "tidal_jobs_failed_total", "tidal_requests_completed_total", "tidal_requests_failed_total",
    "tidal_prompt_tokens_total", "tidal_generation_tokens_total",
    "tidal_time_to_first_token_seconds", "tidal_request_latency_seconds",
    "tidal_queue_wait_seconds", "tidal_engine_requests_running", "tidal_engine_requests_waiting",
    "tidal_kv_cache_usage_ratio", "tidal_preemptions_total", "tidal_prefix_cache_queries_total",
    "tidal_prefix_cache_hits_total", "tidal_chunk_duplicates_total", "tidal_worker_ready",
    "tidal_warmup_duration_seconds", "tidal_chunks_resent_total", "tidal_chunks_reclaimed_total",
    "tidal_lost_chunk_checks_total",
}  # fmt: skip


def test_beat_schedule_from_cron():
    from worker.celery_app import beat_schedule
    from worker.settings import WorkerSettings

    assert beat_schedule(WorkerSettings()) == {}
    entry = beat_schedule(WorkerSettings(warmup_cron="50 7 * * 1-5", warmup_expires_s=300))[
        "tidal-warmup"
    ]
    assert entry["task"] == WARMUP_TASK
    assert entry["options"] == {"queue": "tidal.high", "expires": 300}
    assert entry["schedule"].hour == {7} and entry["schedule"].minute == {50}
    assert entry["schedule"].day_of_week == {1, 2, 3, 4, 5}
    with pytest.raises(ValueError, match="5 fields"):
        beat_schedule(WorkerSettings(warmup_cron="every morning"))
    every = beat_schedule(WorkerSettings(warmup_interval_s=90))["tidal-warmup"]
    assert every["schedule"].run_every.total_seconds() == 90
    assert every["options"] == {"queue": "tidal.high", "expires": 600}
    with pytest.raises(ValueError, match="not both"):
        WorkerSettings(warmup_cron="50 7 * * 1-5", warmup_interval_s=90)


@pytest.mark.slow
def test_tidal_beat_sends_expiring_warmups_that_a_worker_runs(
    redis_server, s3_endpoint, tiny_model_dir, start_worker, tmp_path
):
    expires_s = 60
    schedule = {"TIDAL_WARMUP_INTERVAL_S": "1", "TIDAL_WARMUP_EXPIRES_S": str(expires_s)}
    env = worker_env(redis_server.url, s3_endpoint, tiny_model_dir, **schedule)
    client = make_client(redis_server.url, s3_endpoint)
    high = queue_name("high")
    state_dir = tmp_path / "beat-state"
    state_dir.mkdir()
    args = [sys.executable, "-m", "producer.cli", "beat", "--schedule-file",
            str(state_dir / "schedule")]  # fmt: skip
    started_at = time.time()
    with open(tmp_path / "beat.log", "wb") as log:
        beat = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: client.redis.llen(high) >= 2, 30, "two warm-ups sent by beat")
        finally:
            beat.send_signal(signal.SIGTERM)
            returncode = beat.wait(10)
    stopped_at = time.time()
    beat_log = (tmp_path / "beat.log").read_text(errors="replace")
    assert returncode == 0, beat_log
    assert any(state_dir.iterdir()) and not list(tmp_path.glob("celerybeat-schedule*"))

    # Every message is a warm-up on the high lane (base list: Celery's default priority),
    # expiring expires_s after it was sent; one a second, so none can be older than the run.
    assert not any(client.redis.llen(k) for k in redis_list_keys(queue_name("normal")))
    assert not any(client.redis.llen(k) for k in redis_list_keys(high)[1:])
    messages = [json.loads(m) for m in client.redis.lrange(high, 0, -1)]
    assert 2 <= len(messages) <= stopped_at - started_at + 1, beat_log
    for m in messages:
        assert m["headers"]["task"] == WARMUP_TASK
        expires_at = datetime.fromisoformat(m["headers"]["expires"]).timestamp()
        assert started_at + expires_s <= expires_at <= stopped_at + expires_s, m["headers"]

    # A worker runs each of them once (none has expired) and reports readiness.
    worker = start_worker(env)
    worker.wait_ready()
    report = "warm-up: {'ready': True"
    wait_for(lambda: worker.tail(50000).count(report) >= len(messages), 60, "the warm-ups")
    time.sleep(1)
    assert worker.tail(50000).count(report) == len(messages)
    assert client.redis.llen(high) == 0


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.mark.slow
def test_warmup_task_and_metrics_after_a_job(
    redis_server, s3_endpoint, tiny_model_dir, start_worker, tmp_path
):
    client = make_client(redis_server.url, s3_endpoint)
    high = queue_name("high")
    # A stale warm-up (expired before any worker was up) is dropped, a fresh one runs.
    client.sender.send_task(WARMUP_TASK, queue=high, expires=1.0)
    time.sleep(1.5)
    worker = start_worker(worker_env(redis_server.url, s3_endpoint, tiny_model_dir))
    worker.wait_ready()
    stale = "Discarding revoked task: tidal.warmup"  # how Celery drops an expired message
    wait_for(lambda: stale in worker.tail(50000), 30, "the stale warm-up to be dropped")
    client.sender.send_task(WARMUP_TASK, queue=high, expires=60)
    wait_for(lambda: "warm-up: {'ready': True" in worker.tail(50000), 60, "the warm-up report")
    assert worker.tail(50000).count("warm-up: {'ready': True") == 1

    handle, lines = submit(client, tmp_path, num_lines=24, max_tokens=6)
    bad = '{"custom_id": "bad", "url": "/v1/chat/completions", "body": {"messages": []}}'
    (tmp_path / "mixed.jsonl").write_text("\n".join([*lines[:4], bad]) + "\n")
    mixed = client.submit_batch(tmp_path / "mixed.jsonl")
    for job in (handle, mixed):
        assert client.wait(job.job_id, timeout_s=120).state == JobState.COMPLETED
    # The record turns COMPLETED before the last chunk writes the final manifest to S3 and then
    # counts the job, so the counter may trail the state by that write.
    jobs_completed = ("tidal_jobs_completed_total", ())
    wait_for(lambda: _samples(worker.metrics_text()).get(jobs_completed) == 2, 30, "jobs counted")
    text = worker.metrics_text()
    for probe in ("/healthz", "/ready"):
        with urllib.request.urlopen(f"http://127.0.0.1:{worker.metrics_port}{probe}") as r:
            assert r.status == 200
    names = {f.name for f in text_string_to_metric_families(text)}
    names |= {f"{n}_total" for n in names}  # the parser drops _total from counter families
    assert METRIC_NAMES <= names, METRIC_NAMES - names
    s = _samples(text)
    assert s[("tidal_requests_completed_total", ())] == 28
    assert s[("tidal_requests_failed_total", (("reason", "invalid_request"),))] == 1
    assert s[("tidal_generation_tokens_total", ())] == 28 * 6
    assert s[("tidal_prompt_tokens_total", ())] > 28 * 5
    assert s[jobs_completed] == 2
    assert s[("tidal_request_latency_seconds_count", ())] == 28
    assert s[("tidal_time_to_first_token_seconds_count", ())] == 28
    assert s[("tidal_request_latency_seconds_bucket", (("le", "28800.0"),))] == 28
    assert s[("tidal_queue_wait_seconds_count", (("lane", "normal"),))] == 4  # 3 + 1 chunks
    assert s[("tidal_queue_depth", (("lane", "normal"),))] == 0
    assert s[("tidal_queue_depth", (("lane", "high"),))] == 0
    assert s[("tidal_chunks_in_flight", ())] == 0
    assert s[("tidal_worker_ready", ())] == 1
    assert s[("tidal_warmup_duration_seconds", ())] > 0
    assert 0 <= s[("tidal_kv_cache_usage_ratio", ())] <= 1
    assert s[("tidal_engine_requests_running", ())] == 0
    assert s[("tidal_engine_requests_waiting", ())] == 0
    # The 4 lines of the second job repeat the first job's prompts: prefix cache hits.
    assert (
        0 < s[("tidal_prefix_cache_hits_total", ())] <= s[("tidal_prefix_cache_queries_total", ())]
    )
    assert s[("tidal_chunk_duplicates_total", ())] == 0
    assert s[("tidal_chunks_resent_total", ())] == 0
    assert s[("tidal_chunks_reclaimed_total", ())] == 0

    # Poison messages are dead-lettered, never run or retried: a pickle message (JSON only)
    # and a body that is not JSON at all.
    import base64
    import json as _json

    from producer.queues import dead_letter_key

    def raw_message(body: bytes, content_type: str) -> str:
        return _json.dumps({
            "body": base64.b64encode(body).decode(),
            "content-encoding": "binary" if "pickle" in content_type else "utf-8",
            "content-type": content_type,
            "headers": {"task": "tidal.run_chunk", "id": "poison", "lang": "py"},
            "properties": {
                "body_encoding": "base64",
                "delivery_tag": "poison-tag",
                "delivery_info": {"exchange": "", "routing_key": "tidal.normal"},
                "priority": 0,
            },
        })  # fmt: skip

    client.redis.lpush(
        "tidal.normal", raw_message(b"\x80\x04K\x01.", "application/x-python-serialize")
    )
    client.redis.lpush("tidal.normal", raw_message(b"{not json", "application/json"))

    def dead_letters():
        return [_json.loads(d) for d in client.redis.lrange(dead_letter_key(), 0, -1)]

    wait_for(lambda: len(dead_letters()) == 2, 30, "two dead letters")
    assert {d["reason"] for d in dead_letters()} == {"undecodable"}
    assert client.redis.llen("tidal.normal") == 0
    assert worker.proc.poll() is None
