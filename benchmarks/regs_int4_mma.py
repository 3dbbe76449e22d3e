"""Registers, spills and shared memory of the register mma INT4 kernels as the GPU's own
compile builds them (``kernels/int4_mma.py``), per launch config, with and without register
caps (``maxnreg``): the count ptxas settles on under a cap can be below the cap, and the
offline compile of ``sass_int4_mma.py`` may differ from the device's.

    python3 benchmarks/regs_int4_mma.py

Configs (8 warps over K, x through shared memory, bf16 x, fp16 scales, 4096 x 4096): the
qkv/o_proj form at M <= 8 (8 x rows, 16 weight rows, one tile ahead), two row tiles two
ahead (unsplit and split-K 2, the down_proj form), 16 x rows with one and two row warps;
each uncapped and capped at 128, 96, 80 and 72; then the in-place form at M = 1 (16 warps).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "kernels"))

from test_int4_gemm import random_weight  # noqa: E402

from kernels.int4_mma import _MMA_LAUNCH, _MMA_XS_LAUNCH, int4_mma, to_mma  # noqa: E402


def main() -> None:
    weight = random_weight(4096, 4096, 128, seed=1).to("cuda").to_frag()
    view = to_mma(weight, contiguous_x=False)
    xs = dict(wsplit=True, x_smem=True, pdl=True)
    # (M, x rows, row tiles, tiles ahead, split-K, row warps)
    for m, bm, rt, depth, split, rw in [(8, 8, 1, 1, 1, 1), (8, 8, 2, 2, 1, 1),
                                        (8, 8, 2, 2, 2, 1), (16, 16, 1, 1, 1, 1),
                                        (16, 16, 1, 1, 1, 2)]:  # fmt: skip
        for cap in (None, 128, 96, 80, 72):
            x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
            int4_mma(x, view, bm, 8, split, depth, row_tiles=rt, row_warps=rw, maxnreg=cap, **xs)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    int4_mma(x, view, 8, 16, 1, 1, wsplit=True, pdl=True)
    torch.cuda.synchronize()
    for launch in (_MMA_XS_LAUNCH, _MMA_LAUNCH):
        for key, kernel in launch.kernels.items():  # key: (device, launcher key, specialization)
            print(f"{key[1]}: {kernel.n_regs} registers, {kernel.n_spills} spills, "
                  f"{kernel.metadata.shared} bytes of shared memory")  # fmt: skip


if __name__ == "__main__":
    main()
