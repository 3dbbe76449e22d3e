"""Dense linear on the CPU: ``F.linear`` (the BLAS on the plain weight) against oneDNN on a
weight packed once (``kernels/cpu_linear.py``, what the engine uses on CPU), side by side.

Shapes are the default model's (SmolLM2-135M: hidden 576, 9 + 2 * 3 heads of 64, MLP 1536,
vocabulary 49152) at the row counts of decode steps and prefill chunks. Prints GFLOP/s of
each and the ratio, at 1 thread and at all of this machine's threads.

    python benchmarks/bench_cpu_linear.py
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

from kernels.cpu_linear import pack_linear_weight, packed_linear

SHAPES = {  # name: (in_features, out_features)
    "qkv_proj": (576, 960),
    "o_proj": (576, 576),
    "gate_up_proj": (576, 3072),
    "down_proj": (1536, 576),
    "lm_head": (576, 49152),
}


def median_seconds(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 64, 512, 2048])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    all_threads = torch.get_num_threads()
    thread_counts = sorted({1, all_threads})
    cases = [(t, n, m) for t in thread_counts for n in SHAPES for m in args.rows]
    rows = []
    for threads, name, m in tqdm(cases, desc="linear shapes", unit="case"):
        torch.set_num_threads(threads)
        k, n = SHAPES[name]
        gen = torch.Generator().manual_seed(0)
        weight = torch.randn(n, k, generator=gen)
        x = torch.randn(m, k, generator=gen)
        packed = pack_linear_weight(weight)
        if packed is None:
            raise SystemExit("oneDNN linear is not available in this PyTorch build")
        err = (packed_linear(x, packed) - F.linear(x, weight)).abs().max().item()
        flops = 2 * m * k * n
        t_blas = median_seconds(lambda x=x, w=weight: F.linear(x, w), args.reps)
        t_dnnl = median_seconds(lambda x=x, p=packed: packed_linear(x, p), args.reps)
        rows.append((threads, name, m, flops / t_blas / 1e9, flops / t_dnnl / 1e9, err))
    torch.set_num_threads(all_threads)
    print(f"\n{'threads':>7} {'layer':<13} {'rows':>5} {'F.linear GF/s':>14} "
          f"{'oneDNN GF/s':>12} {'ratio':>6} {'max |diff|':>10}")  # fmt: skip
    for threads, name, m, blas, dnnl, err in rows:
        print(f"{threads:>7} {name:<13} {m:>5} {blas:>14.1f} {dnnl:>12.1f} {dnnl / blas:>6.2f} "
              f"{err:>10.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
