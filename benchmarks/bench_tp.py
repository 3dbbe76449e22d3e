"""Tensor parallelism: an 8B-shaped model at TP=2 against TP=1, and a 70B-shaped one at TP=2.

Random weights initialized on each rank's GPU (``load_format="dummy"``; nothing is read but
config.json and a tokenizer), bf16. Each configuration runs in a fresh process so GPU memory
and the process group start clean. Per configuration: load time (engine construction,
rank workers included), decode tokens/s at batch 1 and 64 (steps after every prompt is
prefilled; each timed pass follows an untimed one of the same shape), and, for the shapes in
``--throughput-shapes``, a batch of prompts run to completion; last, how long the engine
takes to shut down (rank workers stopped and the process group left).

    python benchmarks/bench_tp.py                       # 8b tp1, 8b tp2, 70b tp2 (GPUs)
    python benchmarks/bench_tp.py --runs 8b:2,8b:2:eager  # CUDA graphs against eager
    python benchmarks/bench_tp.py --runs tiny:1,tiny:2  # CPU smoke (gloo)

A run is ``shape:tp`` (CUDA graphs on GPUs, the engine's default) or ``shape:tp:eager``
(``enforce_eager=True``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {
    "tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=1001,
    ),
    "135m": dict(  # the default model's shape (SmolLM2-135M), its head untied here
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, vocab_size=49152,
    ),
    "1b": dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256,
    ),
    "8b": dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256,
    ),
    "70b": dict(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, vocab_size=128256,
    ),
}  # fmt: skip


def write_model_dir(shape: str, out: Path) -> Path:
    """config.json, a word-level tokenizer and an empty safetensors file (weights are random)."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    cfg = dict(SHAPES[shape], architectures=["LlamaForCausalLM"], model_type="llama")
    cfg |= dict(max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0)
    cfg |= dict(bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="bfloat16")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, cfg["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    save_file({}, str(out / "model.safetensors"))
    return out


def decode_rate(
    engine, batch: int, prompt_len: int, num_decode: int, vocab: int, **sampling
) -> float:
    """Decode tokens/s of ``batch`` sequences, timed after every prompt has its first token;
    greedy unless ``sampling`` gives other ``SamplingParams`` fields."""
    import random

    from engine.sampling_params import SamplingParams

    rng = random.Random(batch)
    params = SamplingParams(
        **({"temperature": 0.0} | sampling), max_tokens=num_decode + 1, ignore_eos=True
    )
    for i in range(batch):
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        engine.add_request(f"d{batch}-{i}", prompt, params)
    scheduler = engine.scheduler
    reqs = [*scheduler.waiting, *scheduler.running]  # the requests just added
    while any(not r.output_token_ids for r in reqs):
        engine.step()
    start_tokens = sum(len(r.output_token_ids) for r in reqs)
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    elapsed = time.perf_counter() - start
    return (batch * (num_decode + 1) - start_tokens) / elapsed


def throughput(
    engine, num_requests: int, prompt_len: int, max_tokens: int, vocab: int, seed: int | str = 0
) -> dict:
    """A batch run to completion: output and total tokens/s. The prompts are random from
    ``seed``; a run on prompts the engine has seen is served by its prefix cache."""
    import random

    from engine.sampling_params import SamplingParams

    rng = random.Random(seed)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i in range(num_requests):
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        engine.add_request(f"t{seed}-{i}", prompt, params)
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    elapsed = time.perf_counter() - start
    out_tokens = num_requests * max_tokens
    return {
        "throughput_s": elapsed,
        "output_tok_per_s": out_tokens / elapsed,
        "total_tok_per_s": (out_tokens + num_requests * prompt_len) / elapsed,
    }


def run_one(shape: str, tp: int, args, eager: bool = False) -> dict:
    """Build the engine for ``shape`` at ``tp`` ranks (``eager``: no CUDA graphs) and
    measure it (in this process)."""
    import torch

    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    model_dir = write_model_dir(shape, Path(tempfile.mkdtemp(prefix=f"tp-{shape}-")))
    on_cpu = not torch.cuda.is_available()
    config = EngineConfig(
        model=str(model_dir),
        dtype="float32" if on_cpu else "bfloat16",
        device="cpu" if on_cpu else "cuda",
        load_format="dummy",
        tensor_parallel_size=tp,
        max_model_len=2048,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_bytes=(64 << 20) if on_cpu else None,
        enforce_eager=eager,
    )
    start = time.perf_counter()
    engine = LLMEngine(config)
    if not on_cpu:
        torch.cuda.synchronize()
    result = {"shape": shape, "tp": tp, "eager": eager, "load_s": time.perf_counter() - start}
    result["num_kv_blocks"] = engine.runtime.num_kv_blocks
    vocab = SHAPES[shape]["vocab_size"]
    try:
        for batch in (1, 64):
            # Untimed pass first: Triton specializes on batch and lengths (JIT compiles).
            decode_rate(engine, batch, args.prompt_len, args.num_decode, vocab)
            rate = decode_rate(engine, batch, args.prompt_len, args.num_decode, vocab)
            result[f"decode_tok_per_s_b{batch}"] = rate
        if args.throughput:
            # Warm-up on other prompts: the timed pass's prompts must not be in the prefix cache.
            throughput(engine, args.num_requests, args.prompt_len, 16, vocab, seed="warm-up")
            result.update(throughput(engine, args.num_requests, args.prompt_len, 128, vocab))
    finally:
        start = time.perf_counter()
        engine.shutdown()
        result["shutdown_s"] = time.perf_counter() - start
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", default="8b:1,8b:2,70b:2", help="shape:tp[:eager],... (each a process)"
    )
    parser.add_argument("--throughput-shapes", default="8b,tiny")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--num-decode", type=int, default=32)
    parser.add_argument("--num-requests", type=int, default=128)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--timeout-s", type=float, default=150.0, help="per run")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # shape:tp, run in this process
    parser.add_argument("--throughput", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        shape, tp, *mode = args.one.split(":")
        if mode not in ([], ["eager"]):
            raise SystemExit(f"a run is shape:tp or shape:tp:eager, got {args.one!r}")
        result = run_one(shape, int(tp), args, eager=mode == ["eager"])
        print("RESULT " + json.dumps(result), flush=True)
        return
    results = []
    for run in args.runs.split(","):
        shape = run.split(":")[0]
        cmd = [sys.executable, __file__, "--one", run, "--prompt-len", str(args.prompt_len)]
        cmd += ["--num-decode", str(args.num_decode), "--num-requests", str(args.num_requests)]
        cmd += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
        if shape in args.throughput_shapes.split(","):
            cmd.append("--throughput")
        # Own session: a run past its time is killed with its rank workers (GPU memory freed).
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip
        try:
            stdout, stderr = proc.communicate(timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(f"{run}: failed (rc {proc.returncode})\n{stderr[-3000:]}", flush=True)
            continue
        result = json.loads(lines[-1].removeprefix("RESULT "))
        results.append(result)
        rounded = {k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()}
        print(json.dumps(rounded), flush=True)
    by_run = {(r["shape"], r["tp"], r["eager"]): r for r in results}
    for shape, tp, eager in sorted(by_run):
        mode = "eager" if eager else "graphs"
        this, one, graphs = (by_run[shape, tp, eager], by_run.get((shape, 1, eager)),
                             by_run.get((shape, tp, False)))  # fmt: skip
        for key in sorted(k for k in this if "tok_per_s" in k):
            if tp == 2 and one:
                print(f"{shape} {mode} {key}: TP=2 / TP=1 = {this[key] / one[key]:.2f}x")
            if eager and graphs:
                print(f"{shape} TP={tp} {key}: graphs / eager = {graphs[key] / this[key]:.2f}x")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_tp.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
