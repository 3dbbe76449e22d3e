"""The sampler's cost per call on the GPU, by sampling mode: one ``launch(...).result()``,
timed back to back (so each call's host launches, its GPU work and its read-back are in
series: what a synchronous step pays, and what an asynchronous one must hide behind the
forward). Llama-3's vocabulary (128,256), 1 and 32 rows, logits flat (scale 0.02, as a
random-weight model's) or peaked (scale 4). Top-p runs both ways: thresholds searched
without a sort (``kernels.sampling_filters``, the default) and in PyTorch
(``Sampler.sort_free`` False: whole rows sorted); top-k 50 takes ``torch.topk`` either way
(the sampler searches only top-k above 1024), so it runs once. Also times the draw alone
(``kernels.sampling``: the Triton kernel against its PyTorch reference; the loop waits for
the GPU only at its end, so a one-launch call shows its GPU time), the threshold search alone
against its PyTorch reference (top-p 0.9 with top-k 50 on half the rows), and a row sort and
``topk`` alone.

    python3 benchmarks/bench_sampler.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.request import Request  # noqa: E402
from engine.sampler import Sampler  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from kernels.sampling import sample_rows, sample_rows_ref  # noqa: E402
from kernels.sampling_filters import filter_thresholds, filter_thresholds_ref  # noqa: E402

VOCAB = 128256
MODES = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature": SamplingParams(temperature=0.8),
    "top-k 50": SamplingParams(temperature=0.8, top_k=50),
    "top-p 0.9": SamplingParams(temperature=0.8, top_p=0.9),
}


def per_call_us(fn, calls: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e6 / calls


def main() -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), torch.__version__)
    print("| rows | logits | mode | us per call |")
    print("|---|---|---|---|")
    for rows in (1, 32):
        for kind, scale in (("flat", 0.02), ("peaked", 4.0)):
            logits = torch.randn(rows, VOCAB, device=device) * scale
            for name, params in MODES.items():
                requests = [Request(f"r{i}", [1], params, 10) for i in range(rows)]
                filtered = "top-p" in name  # top-k 50 runs the same code either way
                for sort_free in (True, False) if filtered else (True,):
                    sampler = Sampler(device, seed=0)
                    sampler.sort_free = sort_free
                    us = per_call_us(
                        lambda s=sampler, x=logits, r=requests: s.launch(x, r).result()
                    )
                    label = name + ((", sort-free" if sort_free else ", PyTorch") * filtered)
                    print(f"| {rows} | {kind} | {label} | {us:.0f} |")
            inv_t = torch.full((rows,), 1 / 0.8, device=device)
            threshold = torch.full((rows,), float("-inf"), device=device)
            uniform = torch.rand(rows, device=device, dtype=torch.float64)
            draw = (logits, inv_t, threshold, uniform)
            kernel = per_call_us(lambda a=draw: sample_rows(*a))
            reference = per_call_us(lambda a=draw: sample_rows_ref(*a))
            print(f"| {rows} | {kind} | the draw alone: sample_rows {kernel:.0f}, "
                  f"sample_rows_ref (PyTorch) {reference:.0f} | |")  # fmt: skip
            top_k = torch.tensor([50, 0] * (rows // 2) or [50], device=device, dtype=torch.int32)
            top_p = torch.full((rows,), 0.9, device=device)
            log_min_p = torch.full((rows,), float("-inf"), device=device)
            search = (logits, 1 / inv_t, top_k, top_p, log_min_p)
            kernel = per_call_us(lambda a=search: filter_thresholds(*a))
            reference = per_call_us(lambda a=search: filter_thresholds_ref(*a))
            print(f"| {rows} | {kind} | the thresholds alone: filter_thresholds {kernel:.0f}, "
                  f"filter_thresholds_ref (PyTorch) {reference:.0f} | |")  # fmt: skip
            scaled = logits / 0.8
            sort = per_call_us(lambda x=scaled: x.sort(dim=-1, descending=True))
            top1024 = per_call_us(lambda x=scaled: x.topk(1024, dim=-1))
            top64 = per_call_us(lambda x=scaled: x.topk(64, dim=-1))
            print(f"| {rows} | {kind} | alone: sort {sort:.0f}, topk 1024 {top1024:.0f}, "
                  f"topk 64 {top64:.0f} | |")  # fmt: skip


if __name__ == "__main__":
    main()
