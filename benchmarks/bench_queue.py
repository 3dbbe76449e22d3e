"""The queue path against `tidal run` on the same input, and the high lane's queue wait.

Starts a private redis-server and moto's S3 server, then:
  A. `tidal run` on N lines (a subprocess; the time is the run's own, model load excluded);
  B. the same N lines through submit -> Redis -> `tidal worker` (a subprocess, warm) -> S3,
     timed from submission to the job's finish (the job record's timestamps);
  C. N normal lines again, and single-request high-lane jobs submitted one per interval while
     the normal lane is saturated: p50/p99 of their queue wait (submission -> chunk start)
     and of their end-to-end time. The normal job is cancelled once they are done.
Prints the wall times, their ratio and the percentiles.

    python benchmarks/bench_queue.py [--num-lines 500] [--max-tokens 16] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from producer.jobs import JobState  # noqa: E402
from tests.worker.conftest import (  # noqa: E402
    BUCKET,
    RedisServer,
    WorkerProcess,
    free_port,
    wait_for,
    worker_env,
)
from tests.worker.jobcheck import make_client  # noqa: E402

DOCS = [
    "The council approved a budget for road repairs and two new fire trucks.",
    "Rail workers plan a one-day strike next Thursday over pay.",
    "A new bakery opens on Main Street on Friday with free coffee.",
    "The museum opens an exhibit on deep sea animals on Saturday.",
    "A software update fixes a bug that drained the battery overnight.",
]


def make_input(path: Path, num_lines: int, max_tokens: int, tag: str) -> None:
    with open(path, "w") as f:
        for i in range(num_lines):
            text = f"Document {i}: {DOCS[i % len(DOCS)]}"
            body = {
                "messages": [{"role": "user", "content": f"Summarize in one sentence. {text}"}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            f.write(json.dumps({"custom_id": f"{tag}-{i}", "method": "POST",
                                "url": "/v1/chat/completions", "body": body}) + "\n")  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-lines", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--model", default=None, help="default: the embedded default model")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--num-high", type=int, default=20)
    parser.add_argument("--high-interval-s", type=float, default=1.0)
    parser.add_argument("--only-priority", action="store_true", help="run part C only")
    args = parser.parse_args()

    from moto.server import ThreadedMotoServer

    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1")  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="bench-queue-"))
    redis_server = RedisServer(tmp)
    redis_server.start()
    s3_port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port, verbose=False)
    moto.start()
    s3_url = f"http://127.0.0.1:{s3_port}"
    import boto3

    boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    input_path = tmp / "input.jsonl"
    make_input(input_path, args.num_lines, args.max_tokens, "doc")
    model_args = ["--model", args.model] if args.model else []
    env = worker_env(redis_server.url, s3_url, Path(args.model or "."),
                     TIDAL_MAX_NUM_SEQS=str(args.max_num_seqs), TIDAL_CONCURRENCY="16",
                     TIDAL_CHUNK_SIZE="64", TIDAL_MAX_MODEL_LEN="2048")  # fmt: skip
    if not args.model:
        env.pop("TIDAL_MODEL")
    env.pop("TIDAL_KV_CACHE_MEMORY_BYTES")
    env.pop("TIDAL_DTYPE")
    env.pop("OMP_NUM_THREADS")

    # A. tidal run
    if not args.only_priority:
        run_s = run_local(input_path, tmp, env, args, model_args)
    worker = WorkerProcess(env, tmp / "worker.log")
    try:
        worker.wait_ready(timeout_s=600)
        client = make_client(redis_server.url, s3_url, chunk_size=64)
        if not args.only_priority:
            queue_path(client, input_path, run_s, args)
        priority_lane(client, tmp, args)
    finally:
        worker.stop()
        redis_server.stop()
        moto.stop()


def run_local(input_path: Path, tmp: Path, env: dict, args, model_args: list[str]) -> float:
    """A: `tidal run` as a subprocess; returns its own time (model load excluded)."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "producer.cli", "run", str(input_path), "-o", str(tmp / "run.out"),
         "--no-progress", "--max-num-seqs", str(args.max_num_seqs), "--max-model-len", "2048",
         *model_args],
        cwd=REPO, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    run_total_s = time.monotonic() - start
    summary = proc.stdout.strip().splitlines()[-1]
    run_s = float(summary.split(" in ")[1].split(" s ")[0])
    print(f"A tidal run: {summary}  (process total {run_total_s:.1f} s)", flush=True)
    return run_s


def queue_path(client, input_path: Path, run_s: float, args) -> None:
    """B: the same lines through submit -> Redis -> worker -> S3, the worker warm."""
    handle = client.submit_batch(input_path)
    status = client.wait(handle.job_id, timeout_s=3600, poll_s=0.1)
    assert status.state == JobState.COMPLETED and status.num_succeeded == args.num_lines
    queue_s = status.finished_at - status.created_at
    print(f"B queue path: {args.num_lines} lines in {queue_s:.1f} s "
          f"(submit -> finished, worker warm); ratio queue/run = {queue_s / run_s:.3f}",
          flush=True)  # fmt: skip


def priority_lane(client, tmp: Path, args) -> None:
    """C: single-request high jobs while a bulk job saturates the normal lane."""
    # Twice the lines, so the normal lane stays saturated while the high jobs come in.
    make_input(tmp / "bulk.jsonl", 2 * args.num_lines, args.max_tokens, "bulk")
    bulk = client.submit_batch(tmp / "bulk.jsonl")
    wait_for(lambda: client.status(bulk.job_id).state == JobState.RUNNING, 600, "bulk start")
    time.sleep(2.0)
    highs = []
    for i in range(args.num_high):
        highs.append(client.submit(
            messages=[{"role": "user", "content": f"Summarize in one sentence. {DOCS[i % 5]}"}],
            priority="high", max_tokens=args.max_tokens, temperature=0, ignore_eos=True,
        ))  # fmt: skip
        time.sleep(args.high_interval_s)
    waits, e2e = [], []
    for h in highs:
        s = client.wait(h.job_id, timeout_s=1800, poll_s=0.1)
        waits.append(s.started_at - s.created_at)
        e2e.append(s.finished_at - s.created_at)
    bulk_status = client.status(bulk.job_id)
    client.cancel(bulk.job_id)
    print(f"C high lane ({len(highs)} jobs, normal lane saturated, bulk still "
          f"{bulk_status.state.value} with {bulk_status.num_done}/{2 * args.num_lines} done): "
          f"queue wait p50 {percentile(waits, 0.5):.2f} s p99 {percentile(waits, 0.99):.2f} s;"
          f" end-to-end p50 {percentile(e2e, 0.5):.2f} s p99 {percentile(e2e, 0.99):.2f} s"
          f" (mean {statistics.mean(e2e):.2f} s)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
