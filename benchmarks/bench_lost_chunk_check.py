"""The lost-chunk check over a large backlog: chunk messages read by their header against
decoded bodies, in one run.

A check (worker/recovery.py) reads every queue list in pages and works out which chunk
each message carries. A batch fleet's backlog is 10^5-10^6 messages; the check runs in a
thread of a worker process, so its Python time is also time the engine loop's thread waits
for the GIL. This fills a private redis-server (started here on a free port, no
persistence) with ``--messages`` chunk messages in Celery's own format (one real
``send_task`` message as the template, its job, chunk index, ids and body changed per
message) across ``--jobs`` jobs, then times ``LostChunkSweeper._missing_chunks`` over all of
them twice: each message's chunk read from its ``tidal_chunk`` header (one regular
expression on the raw bytes; what the producer sends now) and read by decoding the message
and its base64 body (what a check did before the header, and still does for messages
without it). Prints seconds, messages/s and the ratio.

    python benchmarks/bench_lost_chunk_check.py [--messages 1000000] [--jobs 100]
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import redis
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import worker.recovery as recovery  # noqa: E402
from producer.jobs import RUN_CHUNK_TASK, chunk_headers  # noqa: E402
from producer.queues import queue_name  # noqa: E402
from worker.metrics import WorkerMetrics  # noqa: E402

# (name, how a message's chunk is read)
MODES = [
    ("the tidal_chunk header (now)", recovery.chunk_of),
    ("the decoded body (before the header)", recovery.chunk_of_body),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def template_message(url: str, queue: str) -> dict:
    """One chunk message as Celery and kombu put it in the queue list."""
    from celery import Celery

    app = Celery(broker=url)
    kwargs = {"job_id": "job-0", "chunk_index": 0, "lane": "normal",
              "storage_url": "s3://bucket/jobs", "first_line": 0, "num_lines": 64,
              "byte_start": 0, "byte_end": 40000, "enqueued_at": time.time()}  # fmt: skip
    app.send_task(RUN_CHUNK_TASK, kwargs=kwargs, queue=queue, headers=chunk_headers("job-0", 0))
    r = redis.Redis.from_url(url)
    raw = r.rpop(queue)
    return json.loads(raw)


def fill(r: redis.Redis, queue: str, template: dict, num_messages: int, num_jobs: int) -> dict:
    """LPUSH the backlog; returns the jobs as the check sees them (id -> num_chunks)."""
    per_job = -(-num_messages // num_jobs)
    body = json.loads(base64.b64decode(template["body"]))
    pipe = r.pipeline(transaction=False)
    jobs: dict[str, dict[str, str]] = {}
    for i in tqdm(range(num_messages), desc="fill", unit="msg", unit_scale=True):
        job_id, chunk_index = f"job-20261130-{i // per_job:012x}", i % per_job
        jobs[job_id] = {"num_chunks": str(chunk_index + 1)}
        message = copy.deepcopy(template)
        headers = message["headers"]
        headers.update(chunk_headers(job_id, chunk_index))
        headers["id"] = headers["root_id"] = f"{job_id}-{chunk_index}"
        kwargs = dict(body[1], job_id=job_id, chunk_index=chunk_index)
        headers["kwargsrepr"] = repr(kwargs)
        message["body"] = base64.b64encode(json.dumps([[], kwargs, body[2]]).encode()).decode()
        pipe.lpush(queue, json.dumps(message))
        if i % 10_000 == 9_999:
            pipe.execute()
    pipe.execute()
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=100)
    args = parser.parse_args()
    server = shutil.which("redis-server") or "/usr/bin/redis-server"
    port, workdir = free_port(), tempfile.mkdtemp(prefix="bench-redis-")
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no", "--dir", workdir],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"redis://127.0.0.1:{port}/0"
        r = redis.Redis.from_url(url)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        queue = queue_name("normal", "tidal")
        template = template_message(url, queue)
        jobs = fill(r, queue, template, args.messages, args.jobs)
        size = len(json.dumps(template))
        print(f"{args.messages} messages of ~{size} bytes in {len(jobs)} jobs; redis "
              f"{r.info('memory')['used_memory_human']}", flush=True)  # fmt: skip
        settings = SimpleNamespace(queue_prefix="tidal", lost_chunk_full_check_interval_s=3600)
        rt = SimpleNamespace(redis=r, settings=settings, storage=None, metrics=WorkerMetrics())
        sweeper = recovery.LostChunkSweeper(rt, lambda *a, **k: None, interval_s=3600.0)
        sweeper._lock_ms, sweeper._locked_at, sweeper._token = 3_600_000, time.monotonic(), ""
        header_reader = recovery.chunk_of
        seconds = {}
        for name, reader in MODES:
            recovery.chunk_of = reader  # what _missing_chunks calls for every message
            start = time.perf_counter()
            missing = sweeper._missing_chunks(jobs)
            seconds[name] = time.perf_counter() - start
            recovery.chunk_of = header_reader
            assert not missing, f"{name}: {len(missing)} chunks reported missing"
            print(f"{name}: {seconds[name]:.2f} s, {args.messages / seconds[name]:,.0f} msg/s",
                  flush=True)  # fmt: skip
        print("| chunk read from | check s | messages/s | vs the decoded body |")
        print("|---|---|---|---|")
        base = seconds[MODES[-1][0]]
        for name, s in seconds.items():
            print(f"| {name} | {s:.2f} | {args.messages / s:,.0f} | {base / s:.2f}x |")
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
