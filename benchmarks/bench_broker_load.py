"""Redis commands and S3 requests per chunk, counted on a real worker (for docs/scaling.md).

    python benchmarks/bench_broker_load.py [--num-lines 64] [--chunk-size 8]

Starts a private redis-server, moto's S3 server behind a counting HTTP proxy, and one real
`tidal worker` process on a tiny random Llama (CPU). Measures the worker's idle Redis load,
then submits one bulk job through producer.Client and counts, until every chunk's result is
in S3: Redis commands by name (INFO commandstats, idle load subtracted) and S3 requests.
The totals include the producer's side (submission), not status polling: completion is
watched directly on the S3 server, never through Redis or the proxy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402
import redis  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

from producer import Client  # noqa: E402
from producer.settings import ProducerSettings  # noqa: E402
from tests.worker.conftest import (  # noqa: E402
    BUCKET,
    RedisServer,
    WorkerProcess,
    free_port,
    make_lines,
    wait_for,
    worker_env,
)
from tests.worker.s3_fault_proxy import S3FaultProxy  # noqa: E402

IDLE_S = 20.0


def tiny_model(out: Path) -> Path:
    """A 2-layer random Llama with the default model's tokenizer (as the worker tests use)."""
    import torch
    import transformers

    from engine.default_model import default_model_path
    from engine.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(default_model_path())
    tok.backend.save(str(out / "tokenizer.json"))
    config = {"bos_token": tok.bos_token, "eos_token": tok.eos_token,
              "chat_template": tok.chat_template, "add_bos_token": False}  # fmt: skip
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    cfg = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    return out


def command_counts(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-lines", type=int, default=64)
    parser.add_argument("--chunk-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=4)
    args = parser.parse_args()
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      AWS_DEFAULT_REGION="us-east-1")  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="tidal-broker-load-"))
    redis_server = RedisServer(work, aof=True)
    redis_server.start()
    moto_port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=moto_port, verbose=False)
    moto.start()
    moto_url = f"http://127.0.0.1:{moto_port}"
    creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1", **creds)
    s3.create_bucket(Bucket=BUCKET)
    proxy = S3FaultProxy(moto_url)
    r = redis.Redis(port=redis_server.port)
    (work / "model").mkdir()
    model_dir = tiny_model(work / "model")
    env = worker_env(redis_server.url, proxy.url, model_dir)
    worker = WorkerProcess(env, work / "worker.log")
    try:
        worker.wait_ready()
        r.config_resetstat()
        time.sleep(IDLE_S)
        idle = command_counts(r)
        idle_rate = {k: v / IDLE_S for k, v in idle.items()}

        lines = make_lines(args.num_lines, max_tokens=args.max_tokens)
        (work / "input.jsonl").write_text("\n".join(lines) + "\n")
        settings = ProducerSettings(
            broker_url=redis_server.url,
            storage_url=f"s3://{BUCKET}/jobs",
            s3_endpoint_url=proxy.url,
            chunk_size=args.chunk_size,
        )
        r.config_resetstat()
        num_s3_before = proxy.num_forwarded
        start = time.monotonic()
        handle = Client(settings=settings).submit_batch(work / "input.jsonl")
        num_chunks = -(-args.num_lines // args.chunk_size)
        prefix = f"jobs/{handle.job_id}/results/"

        def all_results() -> bool:
            listing = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
            return listing.get("KeyCount", 0) >= num_chunks

        wait_for(all_results, 600, "all chunk results", interval_s=0.5)
        time.sleep(2.0)  # the acks follow the uploads
        elapsed_s = time.monotonic() - start
        busy = command_counts(r)
        num_s3 = proxy.num_forwarded - num_s3_before
    finally:
        worker.stop()
        proxy.close()
        moto.stop()
        redis_server.stop()

    net = {k: v - idle_rate.get(k, 0.0) * elapsed_s for k, v in busy.items()}
    total = sum(net.values())
    idle_detail = ", ".join(f"{k} {v:.2f}" for k, v in sorted(idle_rate.items()))
    print(
        f"{args.num_lines} lines, {num_chunks} chunks, {elapsed_s:.1f} s; worker idle load "
        f"{sum(idle_rate.values()):.1f} Redis commands/s ({idle_detail})"
    )
    print(f"Redis commands per chunk (idle subtracted): {total / num_chunks:.1f}")
    for name, count in sorted(net.items(), key=lambda kv: -kv[1]):
        if count / num_chunks >= 0.05:
            print(f"  {name:<16} {count / num_chunks:6.2f}")
    print(f"S3 requests per chunk (submission included): {num_s3 / num_chunks:.2f}")


if __name__ == "__main__":
    main()
