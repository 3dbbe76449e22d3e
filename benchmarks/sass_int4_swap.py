"""Instructions per K tile and registers of the swapped Gluon INT4 kernel, compiled for sm_90
on any machine (no GPU): canonical words against fragment-ordered ones (``Int4Weight.frag``).

Same method as ``sass_int4_mm.py`` (Triton's bundled ptxas and cuobjdump; the K loop is the
smallest backward branch around the HGMMAs). Indicative only; to compile with the device's
Triton: ``python -m pip install --no-deps --target /tmp/t36 triton==3.6.0``, then
``PYTHONPATH=/tmp/t36:. python benchmarks/sass_int4_swap.py [ROWS ...]``.

Tiles: wgmma N = ROWS (default 8 and 16), 128 weight rows, K tiles of 128, 4 warps, 4 stages,
bf16, no split (the table's tiling for wide weights at M = 1 and 16).
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import mangle_type

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sass_int4_mm import cuobjdump, main_loop  # noqa: E402

from kernels import int4_wgmma as W  # noqa: E402

BLOCK_N, BLOCK_K, WARPS, STAGES = 128, 128, 4, 4


def compile_swap(rows: int, frag: bool) -> bytes:
    """The sm_90 cubin of ``_int4_wgmma_swap_kernel`` for one tiling (CPU tensors stand in for
    the arguments: only their types and the descriptors' blocks matter)."""
    dtype = torch.bfloat16
    x = torch.empty(64, 4096, dtype=dtype)
    q = torch.empty(28672, 512, dtype=torch.int32)
    s = torch.empty(32, 28672, dtype=dtype)
    x_layout, q_layout, _ = W._shared_layouts(dtype, rows, BLOCK_N, BLOCK_K)
    row = W._row_layout(dtype)
    args = {
        "x_desc": TensorDescriptor.from_tensor(x, [rows, BLOCK_K], x_layout),
        "qw_desc": TensorDescriptor.from_tensor(q, [BLOCK_N, BLOCK_K // 8], q_layout),
        "s_desc": TensorDescriptor.from_tensor(s, [1, BLOCK_N], row),
        "o_desc": TensorDescriptor.from_tensor(s, [1, BLOCK_N], row),
        "out_ptr": torch.empty(1, dtype=dtype),
        "ws_ptr": torch.empty(1, dtype=torch.float32),
        "lock_ptr": torch.empty(1, dtype=torch.int32),
        **dict.fromkeys(["M", "N", "K", "k_per_split", "num_splits", "stride_out_m"], 4096),
    }
    words = W._frag_words_layout if frag else W._fragment_words_layout
    constexprs = {
        "L3": words(BLOCK_N, BLOCK_K // 8, WARPS),
        "S_LAYOUT": W._fragment_words_layout(BLOCK_N, 1, WARPS, row=True),
        "GROUP_TILES": 1,
        "MODE": 0,
        "NUM_STAGES": STAGES,
        "SPECIALIZED": False,
        "FRAG": frag,
        "PARTS": 0,
        "num_warps": WARPS,
    }
    kernel = W._int4_wgmma_swap_kernel
    signature, values = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            values[(i,)] = constexprs[name]
        else:
            signature[name] = mangle_type(args[name])
    source = GluonASTSource(kernel, signature, values, {})
    target = GPUTarget("cuda", 90, 32)
    return triton.compile(source, target=target, options={"num_warps": WARPS}).asm["cubin"]


def main() -> None:
    for rows in [int(r) for r in sys.argv[1:]] or [8, 16]:
        for frag in (False, True):
            cubin = compile_swap(rows, frag)
            ops = main_loop(cubin)
            regs = re.search(r"REG:(\d+)", cuobjdump(cubin, "-res-usage")).group(1)
            top = ", ".join(f"{op} {n}" for op, n in collections.Counter(ops).most_common(8))
            order = "fragment order" if frag else "canonical"
            print(f"rows {rows}, {order}: {len(ops)} instructions per K tile, {regs} registers"
                  f" ({top})")  # fmt: skip


if __name__ == "__main__":
    main()
