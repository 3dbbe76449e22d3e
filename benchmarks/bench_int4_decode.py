"""End-to-end decode of an 8B-shaped Llama on the GPU: INT4 weights against bf16, in one run.

One engine with random bf16 weights (``load_format="dummy"``, as benchmarks/bench_tp.py) is
timed decoding at each batch size; then every decoder linear layer is swapped for an
``Int4Linear`` holding random INT4 weights of the same shape (group 128, the canonical form;
embeddings and the LM head stay bf16, as in GPTQ checkpoints) and the same decode is timed
again. Decode tokens/s counts the steps after every prompt has its first token; each timed
pass follows an untimed one of the same shape (Triton compiles per shape). Also prints the
weight memory of both forms. Decode steps replay from CUDA graphs, as the engine's default;
``--enforce-eager`` times eager launches instead.

    python3 benchmarks/bench_int4_decode.py [--shape 8b] [--batches 1,32] [--enforce-eager]
        [--prefill 16 --prefill-len 1024 --batched-tokens 2048]

``--prefill N`` also times N prompts' prefill (prompt tokens/s, one output token each), where
the linear layers run at M = ``--batched-tokens`` per step.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import random_int4  # noqa: E402
from bench_tp import SHAPES, decode_rate, throughput, write_model_dir  # noqa: E402


def weight_bytes(model: torch.nn.Module) -> int:
    tensors = itertools.chain(model.parameters(), model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def prefill_rate(engine, num: int, prompt_len: int, vocab: int, seed: int) -> float:
    """Prompt tokens/s of ``num`` prompts run to their first token (one output token each):
    the scheduler packs up to ``max_num_batched_tokens`` prompt tokens per step, so the
    linear layers run at M of that size. Each call needs its own ``seed``: prompts seen
    before (also the decode passes' shorter ones) would come from the prefix cache."""
    result = throughput(engine, num, prompt_len, 1, vocab, seed=f"prefill-{seed}")
    return num * prompt_len / result["throughput_s"]


def swap_to_int4(model: torch.nn.Module) -> int:
    """Replace each decoder Linear by an Int4Linear of random INT4 weights; returns the count."""
    from engine.models.llama import Linear
    from engine.quant.int4_linear import Int4Linear

    swapped = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, Linear) and ".layers." in f".{name}":
            parent_path, _, leaf = name.rpartition(".")
            weight = random_int4(module.out_features, module.in_features)
            setattr(model.get_submodule(parent_path), leaf, Int4Linear([weight]))
            swapped += 1
    torch.cuda.empty_cache()
    return swapped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--num-decode", type=int, default=64)
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    parser.add_argument(
        "--prefill", type=int, default=0, help="also time this many prompts' prefill (0: none)"
    )
    parser.add_argument("--prefill-len", type=int, default=1024)
    parser.add_argument(
        "--batched-tokens", type=int, default=2048, help="max_num_batched_tokens (prefill chunk)"
    )
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]

    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    model_dir = write_model_dir(args.shape, Path(tempfile.mkdtemp(prefix="int4-decode-")))
    config = EngineConfig(
        model=str(model_dir), dtype="bfloat16", device="cuda", load_format="dummy",
        max_model_len=max(2048, args.prefill_len + 1), gpu_memory_utilization=0.6,
        enforce_eager=args.enforce_eager, max_num_batched_tokens=args.batched_tokens,
    )  # fmt: skip
    start = time.perf_counter()
    engine = LLMEngine(config)
    print(f"{args.shape}: engine built in {time.perf_counter() - start:.1f} s", flush=True)
    model = engine.runner.model
    vocab = SHAPES[args.shape]["vocab_size"]
    rates: dict[str, dict[int, float]] = {}
    sizes = {}
    prefills: dict[str, float] = {}
    try:
        for form in ("bf16", "int4"):
            if form == "int4":
                print(f"swapped {swap_to_int4(model)} linear layers to INT4", flush=True)
                engine.runner.reset_cuda_graphs()  # the graphs hold the bf16 layers' launches
            sizes[form] = weight_bytes(model)
            rates[form] = {}
            for batch in batches:
                decode_rate(engine, batch, args.prompt_len, args.num_decode, vocab)  # warm-up
                rates[form][batch] = decode_rate(
                    engine, batch, args.prompt_len, args.num_decode, vocab
                )
                print(f"{form} batch {batch}: {rates[form][batch]:.1f} tok/s", flush=True)
            if args.prefill:
                seed = 2 * len(prefills)
                prefill_rate(engine, args.prefill, args.prefill_len, vocab, seed)  # warm-up
                prefills[form] = prefill_rate(
                    engine, args.prefill, args.prefill_len, vocab, seed + 1
                )
                print(f"{form} prefill: {prefills[form]:.0f} prompt tok/s", flush=True)
    finally:
        engine.shutdown()

    mode = "eager launches" if args.enforce_eager else "CUDA graphs"
    print(f"\n{args.shape}-shaped model, prompt {args.prompt_len}, {args.num_decode} decode steps,")
    print(mode)
    print(f"weights: bf16 {sizes['bf16'] / 1e9:.2f} GB, int4 {sizes['int4'] / 1e9:.2f} GB")
    print("| batch | bf16 tok/s | int4 tok/s | int4 / bf16 |")
    print("|---|---|---|---|")
    for batch in batches:
        bf16, int4 = rates["bf16"][batch], rates["int4"][batch]
        print(f"| {batch} | {bf16:.1f} | {int4:.1f} | {int4 / bf16:.2f}x |")
    if prefills:
        print(
            f"prefill, {args.prefill} prompts of {args.prefill_len} tokens, "
            f"{args.batched_tokens} tokens per step: bf16 {prefills['bf16']:.0f} prompt tok/s, "
            f"int4 {prefills['int4']:.0f}, int4 / bf16 {prefills['int4'] / prefills['bf16']:.2f}x"
        )


if __name__ == "__main__":
    main()
