"""Where another revision's INT4 table (``choose_config``) differs from this checkout's: every
(shape, M, group, word order) case of a fixed grid, on the CPU (no GPU needed). A review
check that a change moved only the configs it meant to, and a count to record with it.

    git show REV:kernels/int4_gemm_config.py > /tmp/old_config.py
    python3 benchmarks/diff_int4_table.py /tmp/old_config.py

Prints the number of cases, then one line per (K x N, word order, new config's tiling) that
changed, with its M range and count; no lines: the two tables agree on the whole grid.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.with_int4_table import as_current, load_table  # noqa: E402

# (N, K): Llama-3-8B's projections, the GPU tests' odd shapes, and edges of the table's rules
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (16400, 512), (1040, 8192),
          (4240, 1024), (2048, 1024), (5120, 4096), (2048, 2048), (32768, 4096), (8192, 4096),
          (8200, 4096)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="an int4_gemm_config.py of another revision")
    parser.add_argument("--max-m", type=int, default=1099)
    args = parser.parse_args()
    new, old = load_table("current"), load_table(args.old)
    cpu = torch.device("cpu")
    changed: dict[tuple, list[int]] = {}
    cases = 0
    for n, k in SHAPES:
        for m in range(1, args.max_m + 1):
            for group in sorted({128, 256, k}):
                for frag in (True, False):
                    cases += 1
                    a = new.choose_config(m, n, k, group, cpu, frag)
                    if a != as_current(old.choose_config(m, n, k, group, cpu, frag)):
                        tiling = (a.strategy, a.block_m, a.block_n, a.specialized, a.pipe)
                        changed.setdefault((k, n, frag, tiling), []).append(m)
    print(f"{cases} cases, {sum(map(len, changed.values()))} differ")
    for (k, n, frag, tiling), ms in changed.items():
        order = "frag" if frag else "canonical"
        print(f"{k} x {n} {order}: now {tiling} at M = {min(ms)}-{max(ms)} ({len(ms)} cases)")


if __name__ == "__main__":
    main()
