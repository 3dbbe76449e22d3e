"""Real components for worker tests: a private redis-server, moto's S3 server over HTTP, a
tiny random Llama with the default tokenizer, and `tidal worker` as a real subprocess."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

logging.getLogger("werkzeug").setLevel(logging.WARNING)

REPO = Path(__file__).resolve().parents[2]
BUCKET = "tidal-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")


class RedisServer:
    """A private redis-server on a free port, in a temp dir; AOF optional; restartable."""

    def __init__(self, directory: Path, aof: bool = False) -> None:
        self.dir = directory
        self.port = free_port()
        self.aof = aof
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["/usr/bin/redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.dir), "--save", "",
                "--maxmemory-policy", "noeviction"]  # fmt: skip
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        log = open(self.dir / "redis.log", "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        import redis

        client = redis.Redis(port=self.port)
        wait_for(lambda: _pings(client), 10, "redis-server to start")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def _pings(client) -> bool:
    try:
        return bool(client.ping())
    except Exception:
        return False


@pytest.fixture()
def redis_server(tmp_path):
    server = RedisServer(tmp_path, aof=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def aws_env():
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def s3_endpoint(aws_env):
    """moto's S3 server on a free port; returns its endpoint URL (bucket BUCKET exists)."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    import boto3

    boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    yield url
    server.stop()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama (2 layers, hidden 64) with the default model's tokenizer."""
    import torch
    import transformers

    from engine.default_model import default_model_path
    from engine.tokenizer import Tokenizer

    out = tmp_path_factory.mktemp("tiny-llama")
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
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(out, safe_serialization=True)
    return out


def worker_env(redis_url: str, s3_url: str, model_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "TIDAL_BROKER_URL": redis_url,
            "TIDAL_STORAGE_URL": f"s3://{BUCKET}/jobs",
            "TIDAL_S3_ENDPOINT_URL": s3_url,
            "TIDAL_MODEL": str(model_dir),
            "TIDAL_DEVICE": "cpu",
            "TIDAL_DTYPE": "float32",
            "TIDAL_MAX_MODEL_LEN": "512",
            "TIDAL_KV_CACHE_MEMORY_BYTES": str(16 << 20),
            "TIDAL_MAX_NUM_SEQS": "16",
            "TIDAL_CONCURRENCY": "3",
            "TIDAL_METRICS_PORT": str(free_port()),
            "TIDAL_SOFT_SHUTDOWN_TIMEOUT_S": "4",
            "TIDAL_CHUNK_RETRY_BACKOFF_S": "0.5",
            "OMP_NUM_THREADS": "1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


class WorkerProcess:
    """`python -m producer.cli worker` as a subprocess, with its log in a file.

    ``launcher`` replaces ``-m producer.cli``: a test's own script that sets up a fault and
    then hands the ``worker ...`` arguments to the real CLI.
    """

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        queues: str | None = None,
        launcher: list[str] | None = None,
    ) -> None:
        self.env = env
        self.log_path = log_path
        self.metrics_port = int(env["TIDAL_METRICS_PORT"])
        args = [sys.executable, *(launcher or ["-m", "producer.cli"]), "worker",
                "--loglevel", "INFO", "--hostname", f"w{free_port()}@test"]  # fmt: skip
        if queues:
            args += ["--queues", queues]
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)  # fmt: skip

    def metrics_text(self) -> str | None:
        try:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.read().decode()
        except OSError:
            return None

    def wait_ready(self, timeout_s: float = 180) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited {self.proc.returncode}:\n{self.tail()}")
            text = self.metrics_text()
            return bool(text) and "tidal_worker_ready 1.0" in text

        wait_for(ready, timeout_s, "the worker to be ready", interval_s=0.5)

    def tail(self, num_chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        return self.proc.returncode


@pytest.fixture()
def start_worker(tmp_path):
    workers: list[WorkerProcess] = []

    def start(
        env: dict[str, str], queues: str | None = None, launcher: list[str] | None = None
    ) -> WorkerProcess:
        worker = WorkerProcess(env, tmp_path / f"worker-{len(workers)}.log", queues, launcher)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop(signal.SIGKILL)


def make_lines(num_lines: int, num_bad: int = 0, max_tokens: int = 8, tag: str = "doc",
               ignore_eos: bool = False):  # fmt: skip
    """Chat lines (greedy) with ``num_bad`` malformed ones spread through them; with
    ``ignore_eos`` every line generates exactly ``max_tokens`` tokens."""
    lines = []
    for i in range(num_lines):
        body = {"messages": [{"role": "user", "content": f"Summarize document {tag} {i}."}],
                "max_tokens": max_tokens, "temperature": 0}  # fmt: skip
        if ignore_eos:
            body["ignore_eos"] = True
        line = {"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
                "body": body}  # fmt: skip
        lines.append(json.dumps(line))
    if num_bad:
        step = num_lines // num_bad
        for k in range(num_bad):
            i = k * step + step // 2
            lines[i] = _bad_line(k % 5, f"{tag}-{i}")
    return lines


def _bad_line(kind: int, custom_id: str) -> str:
    """Five ways to be wrong: broken JSON, bad url, empty messages, bad value, too long."""
    chat = "/v1/chat/completions"
    user = [{"role": "user", "content": "x"}]
    if kind == 0:
        return '{"custom_id": "broken'
    body = [
        None,
        {},
        {"messages": [], "max_tokens": 4},
        {"messages": user, "temperature": 9},
        {"prompt": "word " * 600, "max_tokens": 4},
    ][kind]
    url = ["", "/v1/x", chat, chat, "/v1/completions"][kind]
    return json.dumps({"custom_id": custom_id, "url": url, "body": body})
