"""Where a decode step's time goes: the engine's wall time per step against the GPU's kernel
time, and the kernels and host functions that take it (torch.profiler, CUPTI kernel records,
which cover kernels replayed from CUDA graphs).

An 8B-shaped Llama with random weights (as ``bench_int4_decode.py``), bf16 or with every
decoder linear on INT4 (``--int4``), ``--batch`` sequences decoding after a prompt of
``--prompt-len`` tokens; ``--steps`` decode steps are profiled after the same number unprofiled.
Prints wall us per step; the host time of each phase of ``engine.step()`` (unprofiled steps;
the read-back of the samples holds the wait for the GPU); kernel us per step (the sum of kernel
durations, which overcounts once kernels launch as programmatic dependents: their records
include their wait), the time the GPU was busy (the union of kernel and copy intervals) against
the profiled steps' span; the top kernels and the top host functions
by self time; and the GPU time of the step's CUDA graph replayed back to back (no host work
between), which is what kernel-level changes move.

    python3 benchmarks/profile_decode.py [--shape 8b] [--batch 1,32] [--int4] [--steps 16]
    python3 benchmarks/profile_decode.py --device cpu --shape tiny --batch 32 --prompt-len 4000
"""

from __future__ import annotations

import argparse
import bisect
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_decode import swap_to_int4  # noqa: E402
from bench_tp import SHAPES, write_model_dir  # noqa: E402


def start_decoding(engine, batch: int, prompt_len: int, max_tokens: int, vocab: int, tag: str):
    """Add ``batch`` requests and step until every one has its first token (prefill done)."""
    from engine.sampling_params import SamplingParams

    rng = random.Random(f"{tag}-{batch}")
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i in range(batch):
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        engine.add_request(f"{tag}-{batch}-{i}", prompt, params)
    reqs = [*engine.scheduler.waiting, *engine.scheduler.running]
    while any(not r.output_token_ids for r in reqs):
        engine.step()


def kernel_table(prof, steps: int, top: int) -> tuple[float, list[tuple[str, int, float]]]:
    """(kernel us per step, [(name, launches per step, us per step)] of the ``top`` largest)."""
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time_total > 0:
            name = event.name if len(event.name) <= 70 else event.name[:67] + "..."
            totals[name] += event.device_time_total
            counts[name] += 1
    rows = sorted(totals.items(), key=lambda kv: -kv[1])
    table = [(name, round(counts[name] / steps), us / steps) for name, us in rows[:top]]
    return sum(totals.values()) / steps, table


def gpu_busy_us(prof) -> tuple[float, float]:
    """(us the GPU was running a kernel or a copy, us from the first one's start to the last
    one's end) over the profiled steps: the union of their intervals, so kernels that overlap
    (programmatic dependent launches) count once."""
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
    )
    if not spans:
        return 0.0, 0.0
    busy, (cur_start, cur_end) = 0.0, spans[0]
    for start, end in spans[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    return busy, max(end for _, end in spans) - spans[0][0]


def host_table(prof, steps: int, top: int) -> list[tuple[str, float]]:
    """[(host function, self us per step)] of the ``top`` largest CPU self times."""
    averages = prof.key_averages()
    rows = sorted(averages, key=lambda a: -a.self_cpu_time_total)[:top]
    return [(a.key[:70], a.self_cpu_time_total / steps) for a in rows]


def graph_replay_us(engine, batch: int, replays: int = 50) -> tuple[float, float, dict]:
    """(GPU us of one replay of the decode graph that steps of ``batch`` sequences use,
    replayed back to back on its last inputs with no host work between (the replays rewrite
    that step's cache slots with the same values); host us that
    ``replay()`` takes to return from an idle queue; {kernel: us per replay}, profiled over
    10 more replays); nans and {} without graphs. The graph is the one the last step of that
    size took (its key's split count from the longest context in the static inputs)."""
    graphs = engine.runner.graphs
    if graphs is None:
        return float("nan"), float("nan"), {}
    size = graphs.sizes[bisect.bisect_left(graphs.sizes, batch)]
    longest = int(graphs.seq_lens[:size].max())
    graph = graphs.graphs[(size, graphs.num_splits(size, longest))][0]
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    gpu_us = start.elapsed_time(end) * 1e3 / replays
    torch.cuda.synchronize()
    host = time.perf_counter()
    graph.replay()  # one launch from an idle queue: the host's cost of a replay alone
    host_us = (time.perf_counter() - host) * 1e6
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
    _, kernels = kernel_table(prof, 10, 1000)
    return gpu_us, host_us, {name: us for name, _, us in kernels}


class PhaseTimer:
    """Host seconds spent in each of the engine's step phases (its scheduler, the runner's
    flatten and graph replay and logits, the sampler, whose result read waits for the GPU,
    and the update), by wrapping those methods on this engine's objects; the rest of
    ``step`` (its per-request loop) is the step's wall time less their sum."""

    PHASES = {
        "schedule": ("scheduler", "schedule"),
        "flatten": ("runner", "flatten"),
        "graph inputs + replay": ("runner", "_decode_graph"),
        "forward without a decode graph": ("runner", "_hidden"),
        "logits": ("runner", "_logits"),
        "update_after_step": ("scheduler", "update_after_step"),
        "sampler (launch)": ("sampler", "launch"),
        "samples read back (waits for the GPU)": (None, "result"),
    }

    def __init__(self, engine) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.engine = engine
        self.saved = []
        from engine.sampler import PendingSample

        for phase, (owner_name, method) in self.PHASES.items():
            owner = PendingSample if owner_name is None else getattr(engine, owner_name)
            self._wrap(owner, method, getattr(owner, method), phase)

    def _wrap(self, obj, name: str, fn, phase: str) -> None:
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[phase] += time.perf_counter() - start

        self.saved.append((obj, name, obj.__dict__.get(name)))
        setattr(obj, name, timed)

    def restore(self) -> None:
        for obj, name, old in reversed(self.saved):
            if old is None:
                delattr(obj, name)
            else:
                setattr(obj, name, old)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    parser.add_argument("--batch", default="1,32")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--int4", action="store_true", help="decoder linears on INT4")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    parser.add_argument(
        "--scheduling", choices=("sync", "async"), default="async",
        help="async: step n + 1 launched before step n's samples are read back (default)",
    )  # fmt: skip
    parser.add_argument(
        "--device", default="cuda", choices=["cuda", "cpu"],
        help="cpu: fp32, the host phases only (no kernel table, no graph)",
    )  # fmt: skip
    args = parser.parse_args()
    cuda = args.device == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    batches = [int(b) for b in args.batch.split(",")]
    budget = max(2048, args.prompt_len)  # max_num_batched_tokens
    # Enough tokens that no request ends before the profiled steps are over: the first
    # prompts decode while the later ones prefill, one budget of tokens per step.
    max_tokens = 4 * args.steps + 8 + -(-max(batches) * args.prompt_len // budget)
    model_dir = write_model_dir(args.shape, Path(tempfile.mkdtemp(prefix="profile-decode-")))
    config = EngineConfig(
        model=str(model_dir), dtype="bfloat16" if cuda else "float32", device=args.device,
        load_format="dummy", max_model_len=max(2048, args.prompt_len + max_tokens + 16),
        max_num_batched_tokens=budget, gpu_memory_utilization=0.6,
        enforce_eager=args.enforce_eager, async_scheduling=args.scheduling == "async",
    )  # fmt: skip
    engine = LLMEngine(config)
    if args.int4:
        print(f"swapped {swap_to_int4(engine.runner.model)} linear layers to INT4")
        engine.runner.reset_cuda_graphs()
    vocab = SHAPES[args.shape]["vocab_size"]
    form = "int4" if args.int4 else ("bf16" if cuda else "fp32")
    mode = "eager" if args.enforce_eager or not cuda else "CUDA graphs"
    mode += f", {args.scheduling} scheduling"
    try:
        for batch in batches:
            start_decoding(engine, batch, args.prompt_len, max_tokens, vocab, "p")
            for _ in range(args.steps):  # warm: compiles, graph captures
                engine.step()
            sync()
            timer = PhaseTimer(engine)
            start = time.perf_counter()
            for _ in range(args.steps):
                engine.step()
            sync()
            wall = (time.perf_counter() - start) / args.steps * 1e6
            timer.restore()
            head = f"\n{args.shape} {form}, batch {batch}, {mode}: wall {wall:.0f} us per step"
            if cuda:
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(args.steps):
                        engine.step()
                    sync()
                # Before any request ends: a smaller batch's step rewrites the shared static
                # inputs (padding rows with length 0), and this size's graph would then replay
                # on less context than its steps had.
                replay, launch, alone = graph_replay_us(engine, batch)
                kernel_us, kernels = kernel_table(prof, args.steps, args.top)
                busy, span = (t / args.steps for t in gpu_busy_us(prof))
                head += (
                    f" (unprofiled), kernels {kernel_us:.0f} us per step (summed); profiled: the "
                    f"GPU busy {busy:.0f} of {span:.0f} us per step ({1 - busy / span:.0%} idle); "
                    f"the step's graph replayed alone: {replay:.0f} us (its replay() call: "
                    f"{launch:.0f} us of host time)"
                )
            while engine.has_unfinished_requests():
                engine.step()
            graphs = engine.runner.graphs
            if graphs is not None:
                head += f"; decode graphs captured so far: {len(graphs.graphs)}"
            print(head)
            phases = {k: v / args.steps * 1e6 for k, v in timer.totals.items()}
            phases["rest of step()"] = wall - sum(phases.values())
            print("| host phase of step() | us per step |")
            print("|---|---|")
            for phase, us in phases.items():
                print(f"| {phase} | {us:.0f} |")
            if not cuda:
                continue
            print("| kernel | launches per step | us per step | share of kernel time | us per "
                  "replay of the graph alone |")  # fmt: skip
            print("|---|---|---|---|---|")
            for name, count, us in kernels:
                solo = f"{alone[name]:.1f}" if name in alone else "-"
                print(f"| `{name}` | {count} | {us:.1f} | {us / kernel_us:.1%} | {solo} |")
            print("| host function (self time) | us per step |")
            print("|---|---|")
            for name, us in host_table(prof, args.steps, args.top):
                print(f"| `{name}` | {us:.1f} |")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
