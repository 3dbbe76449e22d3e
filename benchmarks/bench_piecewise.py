"""Steps with prefill tokens: eager launches against piecewise CUDA graphs, in one run.

One engine with random weights (``load_format="dummy"``, as bench_tp.py) of a Llama shape,
bf16, and then the same model with INT4 decoder linears (bench_int4_decode.py's swap). For
each form and each ``--batched-tokens`` budget (the engine's ``max_num_batched_tokens``, so
the step size), two workloads are timed in three modes, each after an untimed pass of the
same shape (Triton compiles, graphs are captured): eager steps with every kernel launched
through Triton's own call (``FastLaunch.enabled = False``), eager steps through
``kernels.launch.FastLaunch`` (the default for steps no graph holds), and piecewise graphs:

- prefill: ``--prefill`` prompts of ``--prefill-len`` tokens run to their first token
  (prompt tokens/s; every step is a full chunk);
- mixed: ``--requests`` prompts of ``--prompt-len`` tokens, ``--max-tokens`` output tokens
  each, run to completion (output tokens/s; steps mix decodes with prompt chunks, and
  decode-only steps replay the decode graphs in every mode).

Fresh prompts every pass (none is served by the prefix cache). Prints a table with the
ratios.

    python3 benchmarks/bench_piecewise.py [--shape 8b] [--batched-tokens 256,512]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_decode import swap_to_int4  # noqa: E402
from bench_tp import SHAPES, throughput, write_model_dir  # noqa: E402

_seeds = itertools.count()


MODES = ("plain", "eager", "piecewise")


def timed(engine, piecewise, mode: str, workload: str, args, vocab: int) -> float:
    """One untimed and one timed pass of ``workload`` in ``mode``: ``plain`` eager steps
    with every kernel launched through Triton's own call, ``eager`` ones through
    ``FastLaunch``'s cache, or ``piecewise`` graphs."""
    from kernels.launch import FastLaunch

    engine.runner.piecewise = piecewise if mode == "piecewise" else None
    FastLaunch.enabled = mode != "plain"
    rate = 0.0
    for _ in range(2):
        seed = f"{workload}-{next(_seeds)}"
        if workload == "prefill":
            result = throughput(engine, args.prefill, args.prefill_len, 1, vocab, seed=seed)
            rate = args.prefill * args.prefill_len / result["throughput_s"]
        else:
            result = throughput(
                engine, args.requests, args.prompt_len, args.max_tokens, vocab, seed=seed
            )
            rate = result["output_tok_per_s"]
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    parser.add_argument("--batched-tokens", default="256,512", help="step budgets, comma-separated")
    parser.add_argument("--forms", default="bf16,int4")
    parser.add_argument("--prefill", type=int, default=16, help="prompts of the prefill workload")
    parser.add_argument("--prefill-len", type=int, default=1024)
    parser.add_argument("--requests", type=int, default=64, help="requests of the mixed workload")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    import torch

    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    budgets = [int(b) for b in args.batched_tokens.split(",")]
    model_dir = write_model_dir(args.shape, Path(tempfile.mkdtemp(prefix="piecewise-")))
    vocab = SHAPES[args.shape]["vocab_size"]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows = []
    for budget in budgets:
        config = EngineConfig(
            model=str(model_dir), dtype="bfloat16", device="cuda", load_format="dummy",
            max_model_len=max(2048, args.prefill_len + 1), gpu_memory_utilization=0.5,
            max_num_batched_tokens=budget, max_cudagraph_capture_size=budget,
        )  # fmt: skip
        engine = LLMEngine(config)
        piecewise = engine.runner.piecewise
        try:
            for form in args.forms.split(","):
                if form == "int4":
                    swap_to_int4(engine.runner.model)
                    engine.runner.reset_cuda_graphs()
                for workload in ("prefill", "mixed"):
                    start = time.perf_counter()
                    rates = [timed(engine, piecewise, m, workload, args, vocab) for m in MODES]
                    rows.append((form, budget, workload, *rates))
                    print(
                        f"{form} {budget} tokens/step {workload}: "
                        + ", ".join(f"{m} {r:.0f}" for m, r in zip(MODES, rates, strict=True))
                        + f" tok/s ({time.perf_counter() - start:.0f} s)",
                        flush=True,
                    )
        finally:
            engine.shutdown()
            del engine, piecewise
            gc.collect()  # the engine's reference cycles hold its KV cache and graphs
            torch.cuda.empty_cache()

    print(
        f"\n{args.shape}-shaped model, random weights; prefill: {args.prefill} x "
        f"{args.prefill_len}-token prompts (prompt tok/s); mixed: {args.requests} x "
        f"{args.prompt_len}-token prompts, {args.max_tokens} output tokens (output tok/s)"
    )
    print(
        "| weights | tokens per step | workload | eager, Triton's launch | eager, FastLaunch | "
        "piecewise graphs | FastLaunch / Triton's | piecewise / eager FastLaunch |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for form, budget, workload, plain, eager, graphs in rows:
        print(f"| {form} | {budget} | {workload} | {plain:.0f} | {eager:.0f} | {graphs:.0f} | "
              f"{eager / plain:.2f}x | {graphs / eager:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
