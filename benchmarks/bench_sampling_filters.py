"""Min-p / top-k / top-p thresholds on the GPU: ``kernels.sampling_filters`` (one persistent
launch, or a launch per step) against its PyTorch reference (``topk`` and row sorts), side by
side in one run, on Llama-3's vocabulary (128,256).

Two timings per form: "GPU" is a CUDA-graph replay of 20 back-to-back calls divided by 20 (no
host launch cost), "call" is 20 eager calls back to back then one sync, divided by 20 (host
and GPU in series where the host is slower: what the sampler's launch costs a step). Rows
flat (scale 0.02, as a random-weight model's) or peaked (scale 4), temperature 0.8. Each
form's thresholds are compared with the reference's (rows that differ are counted: they may
only where top-p's target lies within rounding of a token's cumulative weight).

    python3 benchmarks/bench_sampling_filters.py [--rows 1,8,32,128] [--slices 1024,2048,4096]
        [--step-slices 4096]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.sampling_filters import filter_thresholds, filter_thresholds_ref  # noqa: E402

VOCAB = 128256
CALLS = 20


def gpu_us(fn) -> float:
    """GPU time per call: a CUDA graph of CALLS calls, median of 5 replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    times = []
    for _ in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / CALLS)
    return sorted(times[1:])[2]


def call_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e6 / CALLS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,32,128")
    parser.add_argument("--slices", default="4096", help="logits per program, persistent form")
    parser.add_argument("--step-slices", default="4096", help="the same, a launch per step")
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), torch.__version__)
    slices = [int(s) for s in args.slices.split(",")]
    forms = [("default", {})]  # the launcher's own choice
    forms += [(f"persistent {s}", dict(persistent=True, slice_size=s)) for s in slices]
    forms += [
        (f"per step {s}", dict(persistent=False, slice_size=s))
        for s in (int(s) for s in args.step_slices.split(","))
    ]
    print("| rows | logits | filters | form | GPU us | call us | rows unlike the reference |")
    print("|---|---|---|---|---|---|---|")
    for rows in [int(r) for r in args.rows.split(",")]:
        for kind, scale in (("flat", 0.02), ("peaked", 4.0)):
            logits = torch.randn(rows, VOCAB, device=device) * scale
            temperature = torch.full((rows,), 0.8, device=device)
            off_k = torch.zeros(rows, dtype=torch.int32, device=device)
            off_p = torch.ones(rows, device=device)
            log_min_p = torch.full((rows,), float("-inf"), device=device)
            modes = {
                "top-p 0.9": (off_k, torch.full((rows,), 0.9, device=device), False, True),
                "top-k 50": (off_k + 50, off_p, True, False),
                "top-k 50, top-p 0.9": (off_k + 50, off_p * 0.9, True, True),
            }
            for mode, (top_k, top_p, has_k, has_p) in modes.items():
                inputs = (logits, temperature, top_k, top_p, log_min_p, has_k, has_p)
                ref = filter_thresholds_ref(*inputs)
                t_gpu = gpu_us(lambda a=inputs: filter_thresholds_ref(*a))
                t_call = call_us(lambda a=inputs: filter_thresholds_ref(*a))
                print(f"| {rows} | {kind} | {mode} | PyTorch | {t_gpu:.1f} | {t_call:.1f} | |")
                for name, options in forms:
                    got = filter_thresholds(*inputs, **options)
                    unlike = int((got != ref).sum())
                    t_gpu = gpu_us(lambda a=inputs, o=options: filter_thresholds(*a, **o))
                    t_call = call_us(lambda a=inputs, o=options: filter_thresholds(*a, **o))
                    print(
                        f"| {rows} | {kind} | {mode} | {name} | {t_gpu:.1f} | {t_call:.1f} "
                        f"| {unlike} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
