"""The INT4 table's configs with their registers per thread capped (``Int4GemmConfig.maxnreg``),
in the harness of bench_int4_gemm.py (CUDA-graph replays over weight copies that exceed L2,
median time per call), beside bf16 cuBLAS.

    python3 benchmarks/bench_int4_maxnreg.py [--rows 1,16,64,256] [--caps 0,168,128,104]
        [--shapes 4096x4096,...]

For every shape and M whose table config runs a Gluon kernel (the register mma kernel, or
the swapped wgmma kernel), it times that config with each cap (0: none, the compiler's own
allocation; "-" where ptxas cannot fit a wgmma's operands under it, or the cap
times the program's threads exceeds the register file) and checks each output
against the reference. ptxas schedules differently under
a cap even where it needs fewer registers than the cap; on the H200 a cap made the mma
kernel 8-17% faster at M <= 8 (BENCHMARKS.md, "INT4 GEMM", fourteenth session).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import SHAPES, Peers, graph_time_us  # noqa: E402
from tqdm import tqdm  # noqa: E402
from triton.runtime.errors import OutOfResources, PTXASError  # noqa: E402

from kernels.int4_gemm import _launch, choose_config, int4_gemm_ref  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    parser.add_argument("--rows", default="1,16,64,256")
    parser.add_argument("--caps", default="0,168,128,104")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    caps = [int(c) for c in args.caps.split(",")]
    lines = []
    for k, n in tqdm(shapes, desc="shapes"):
        peers = Peers(k, n, with_torch=False)
        w0 = peers.int4[0]
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            cfg = choose_config(m, n, k, w0.group_size, x.device, frag=w0.frag)
            if not (cfg.strategy == "mma" or (cfg.strategy == "wgmma" and cfg.swap)):
                continue
            ref = int4_gemm_ref(x, w0).float()
            t_bf16 = peers.time_bf16(x)
            times, worst = {}, 0.0
            for cap in [None] + caps:  # None: the table's own config
                c = cfg if cap is None else dataclasses.replace(cfg, maxnreg=cap or None)
                try:
                    out = _launch(x, w0, c).float()
                except (PTXASError, OutOfResources):  # a wgmma's operands need more
                    times[cap] = float("inf")  # registers, or the program's threads fewer
                    continue
                worst = max(worst, ((out - ref).norm() / ref.norm()).item())
                times[cap] = graph_time_us(
                    lambda i, c=c, x=x, w=peers.int4: _launch(x, w[i], c), peers.num_int4
                )
            best = min(caps, key=lambda c: times[c])
            kind = "mma" if cfg.strategy == "mma" else "swapped wgmma"
            lines.append(
                f"| {k} x {n} | {m} | {kind} | {t_bf16:.1f} | {times[None]:.1f} "
                f"(cap {cfg.maxnreg or 'none'}) | "
                + " | ".join(f"{times[c]:.1f}" if times[c] < float("inf") else "-" for c in caps)
                + f" | {best or 'none'}: {t_bf16 / times[best]:.2f}x | {worst:.1e} |"
            )
        torch.cuda.empty_cache()
    cap_names = " | ".join(f"cap {c}" if c else "no cap" for c in caps)
    print(f"\n| K x N | M | kernel | bf16 us | table us | {cap_names} | best (vs bf16) | "
          "worst rel. error |")  # fmt: skip
    print("|---|---|---|---|---|" + "---|" * len(caps) + "---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
