"""Decode throughput with asynchronous scheduling against synchronous steps, in one run.

An 8B-shaped Llama with random weights (``load_format="dummy"``, as ``bench_int4_decode.py``),
bf16 and then with every decoder linear on INT4, decodes ``--batches`` sequences after a
prompt of ``--prompt-len`` tokens under CUDA graphs. At each batch size the same decode is
timed with the engine switched between synchronous steps (the host schedules, launches,
waits for the samples, then schedules the next step) and asynchronous ones (step n + 1 is
launched before step n's samples are read back), alternating ``--repeats`` times after an
untimed pass of each. Prints every timed pass, then the medians and their ratio. With
``--sampling top-p`` a third mode, ``async-sorted``, is asynchronous with top-p's thresholds
from PyTorch's row sorts (``Sampler.sort_free`` False) instead of
``kernels.sampling_filters``. Top-k 50 (``--sampling top-k``) takes ``torch.topk`` either way,
so it has no third mode.

    python3 benchmarks/bench_async_scheduling.py [--shape 8b] [--batches 1,32] [--prompt-len 128]
        [--num-decode 64] [--repeats 3] [--forms bf16,int4] [--sampling greedy|top-p|top-k]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_decode import swap_to_int4  # noqa: E402
from bench_tp import SHAPES, decode_rate, write_model_dir  # noqa: E402
from tqdm import tqdm  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--num-decode", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--forms", default="bf16,int4")
    parser.add_argument(
        "--sampling", choices=("greedy", "top-p", "top-k"), default="greedy",
        help="top-p: temperature 0.8, top_p 0.9; top-k: temperature 0.8, top_k 50",
    )  # fmt: skip
    args = parser.parse_args()
    sampling = {}
    if args.sampling == "top-p":
        sampling = dict(temperature=0.8, top_p=0.9)
    elif args.sampling == "top-k":
        sampling = dict(temperature=0.8, top_k=50)
    batches = [int(b) for b in args.batches.split(",")]
    forms = args.forms.split(",")

    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    model_dir = write_model_dir(args.shape, Path(tempfile.mkdtemp(prefix="async-sched-")))
    config = EngineConfig(
        model=str(model_dir), dtype="bfloat16", device="cuda", load_format="dummy",
        max_model_len=max(2048, args.prompt_len + args.num_decode + 8),
        gpu_memory_utilization=0.6, max_num_batched_tokens=max(2048, args.prompt_len),
    )  # fmt: skip
    start = time.perf_counter()
    engine = LLMEngine(config)
    print(f"{args.shape}: engine built in {time.perf_counter() - start:.1f} s", flush=True)
    vocab = SHAPES[args.shape]["vocab_size"]
    modes = {"sync": False, "async": True}
    if args.sampling == "top-p":  # asynchronous, top-p's thresholds from PyTorch's row sorts
        modes["async-sorted"] = True
    rates: dict[tuple[str, int, str], list[float]] = {}
    passes = len(forms) * len(batches) * len(modes) * (args.repeats + 1)
    bar = tqdm(total=passes, desc="decode passes", unit="pass")
    try:
        for form in forms:
            if form == "int4":
                print(f"swapped {swap_to_int4(engine.runner.model)} linear layers to INT4")
                engine.runner.reset_cuda_graphs()
            for batch in batches:
                for repeat in range(args.repeats + 1):  # the first of each is a warm-up
                    for mode, on in modes.items():
                        engine.async_scheduling = on
                        engine.sampler.sort_free = mode != "async-sorted"
                        rate = decode_rate(
                            engine, batch, args.prompt_len, args.num_decode, vocab, **sampling
                        )
                        bar.update()
                        if repeat:
                            rates.setdefault((form, batch, mode), []).append(rate)
                            bar.write(f"{form} batch {batch} {mode}: {rate:.1f} tok/s")
    finally:
        bar.close()
        engine.shutdown()

    print(
        f"\n{args.shape}-shaped model, prompt {args.prompt_len}, {args.num_decode} decode steps, "
        f"CUDA graphs, {args.sampling} sampling; medians of {args.repeats} alternating passes"
    )
    names = [m for m in modes if m != "sync"]
    print(
        "| form | batch | sync tok/s | "
        + " | ".join(f"{m} tok/s | {m} / sync" for m in names)
        + " |"
    )
    print("|---|---|---|" + "---|---|" * len(names))
    for form in forms:
        for batch in batches:
            sync = statistics.median(rates[(form, batch, "sync")])
            cells = []
            for m in names:
                rate = statistics.median(rates[(form, batch, m)])
                cells.append(f"{rate:.1f} | {rate / sync:.3f}x")
            print(f"| {form} | {batch} | {sync:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
