"""Instructions per K tile and registers of the register mma INT4 kernel
(``kernels/int4_mma.py``), compiled for sm_90 on any machine (no GPU): fragment-ordered words
(x in 4-byte pairs) against ``mma_order`` (x in 16-byte loads).

Same method as ``sass_int4_swap.py`` (Triton's bundled ptxas and cuobjdump; the K loop is the
largest backward branch around the HMMAs, ``sass_int4_mm.main_loop``). To compile with the
device's Triton: ``python -m pip install --no-deps --target /tmp/t36 triton==3.6.0``, then
``PYTHONPATH=/tmp/t36:. python benchmarks/sass_int4_mma.py``.

Configs: the table's M = 1 form (8 x rows, 16 warps over K, one tile ahead, one split) and an
M = 16 form (16 x rows, 8 warps over K, two tiles ahead, split-K in slots), each with one and
two row tiles per warp, and the table's forms with x through shared memory
(``_int4_mma_xs_kernel``), and four of them with ``weights_first`` (``PDL`` 2); bf16, groups
of 128.
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

from triton.experimental.gluon._runtime import GluonASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sass_int4_mm import compile_sm90, cuobjdump, main_loop  # noqa: E402

from kernels import int4_mma as K  # noqa: E402
from kernels.int4_wgmma import _frag_words_layout  # noqa: E402

INTS = ["M", "N", "tiles_total", "tiles_per_split", "tiles_per_warp", "num_splits",
        "stride_x_m", "stride_qw_n", "stride_s_g", "stride_out_m"]  # fmt: skip
ALIGNED = {"N", "stride_x_m", "stride_qw_n", "stride_s_g", "stride_out_m"}


def compile_mma(block_m: int, warps: int, depth: int, mode: int, contiguous_x: bool,
                row_tiles: int = 1, pdl: int = 1) -> bytes:  # fmt: skip
    """The sm_90 cubin of ``_int4_mma_kernel`` (warps over K) for one config, with the hints
    Triton's specialization gives the launcher's tensors and strides on the GPU."""
    signature = {"x_ptr": "*bf16", "qw_ptr": "*i32", "s_ptr": "*bf16", "o_ptr": "*bf16",
                 "out_ptr": "*bf16", "ws_ptr": "*fp32", "lock_ptr": "*i32",
                 **dict.fromkeys(INTS, "i32")}  # fmt: skip
    constexprs = {
        "BLOCK_M": block_m, "GROUP_TILES": 1, "APPLY": 1, "DEPTH": depth, "MODE": mode,
        "PDL": pdl, "WSPLIT": True, "ROW_TILES": row_tiles, "X_CONTIG": contiguous_x,
        "q_layout": _frag_words_layout(16 * warps * row_tiles, 16, warps),
        "x_layout": K._x_tile_layout(block_m, warps), "num_warps": warps, "PARTS": 0,
    }  # fmt: skip
    return compile_sm90(K._int4_mma_kernel, signature, constexprs, ALIGNED, warps, 1,
                        GluonASTSource)  # fmt: skip


def compile_xs(block_m: int, warps: int, depth: int, mode: int, row_tiles: int,
               row_warps: int = 1, scaled: bool = False, pdl: int = 1) -> bytes:  # fmt: skip
    """The sm_90 cubin of ``_int4_mma_xs_kernel`` (x through shared memory, two ring stages;
    ``scaled``: the decode applies scales and offsets, no mma on ones)."""
    signature = {"x_ptr": "*bf16", "qw_ptr": "*i32", "s_ptr": "*bf16", "o_ptr": "*bf16",
                 "out_ptr": "*bf16", "ws_ptr": "*fp32", "lock_ptr": "*i32",
                 **dict.fromkeys(INTS, "i32")}  # fmt: skip
    constexprs = {
        "BLOCK_M": block_m, "GROUP_TILES": 1, "APPLY": 1, "DEPTH": depth, "MODE": mode,
        "PDL": pdl, "ROW_TILES": row_tiles, "X_STAGES": 2, "ROW_WARPS": row_warps,
        "SCALED": scaled,
        "q_layout": K._frag_words3(16 * row_tiles * row_warps, warps, row_warps),
        "x_layout": K._x_copy_layout(warps, row_warps), "num_warps": warps,
    }  # fmt: skip
    return compile_sm90(K._int4_mma_xs_kernel, signature, constexprs, ALIGNED, warps, 1,
                        GluonASTSource)  # fmt: skip


def report(name: str, cubin: bytes, row_tiles: int) -> None:
    ops = main_loop(cubin, op="HMMA", largest=True)
    usage = cuobjdump(cubin, "-res-usage")
    regs = re.search(r"REG:(\d+)", usage).group(1)
    stack = re.search(r"STACK:(\d+)", usage).group(1)
    top = ", ".join(f"{op} {n}" for op, n in collections.Counter(ops).most_common(8))
    print(f"{name}: {len(ops)} instructions per K tile ({len(ops) / row_tiles:.0f} per 16 "
          f"rows), {regs} registers, {stack} bytes of stack ({top})")  # fmt: skip


def main() -> None:
    for name, (block_m, warps, depth, mode) in {"M = 1": (8, 16, 1, 0),
                                                 "M = 16": (16, 8, 2, 3)}.items():  # fmt: skip
        for contiguous_x in (False, True):
            for row_tiles in (1, 2):
                cubin = compile_mma(block_m, warps, depth, mode, contiguous_x, row_tiles)
                order = "mma_order" if contiguous_x else "fragment order"
                report(f"{name}, {order}, {row_tiles} row tile(s)", cubin, row_tiles)
    # the table's x_smem forms (``int4_gemm_config._mma_config``)
    for name, cfg in {"qkv, M <= 8": (8, 8, 1, 0, 1), "o_proj, M = 3-8": (8, 8, 2, 0, 2),
                      "down_proj, M = 3-8": (8, 8, 2, 3, 2),
                      "o_proj, M = 9-16": (16, 8, 1, 0, 1)}.items():  # fmt: skip
        report(f"x through shared memory, {name}", compile_xs(*cfg), cfg[4])
        report("  the same, scaled decode", compile_xs(*cfg, scaled=True), cfg[4])
    # K groups of 2 and 4 warps over rows that share one copy of x's tiles
    for name, cfg in {"M = 16, 2 row warps": (16, 8, 1, 0, 1, 2),
                      "M = 16, 4 row warps": (16, 8, 1, 0, 1, 4),
                      "M = 32, 4 row warps": (32, 8, 1, 0, 1, 4)}.items():  # fmt: skip
        report(f"x through shared memory, {name}", compile_xs(*cfg), cfg[4])
        report("  the same, scaled decode", compile_xs(*cfg, scaled=True), cfg[4])
    # ``weights_first`` (PDL 2): the first tiles' words issued before the wait on the
    # previous kernel
    report("weights first, M = 1, fragment order", compile_mma(8, 16, 1, 0, False, pdl=2), 1)
    report("weights first, M = 1, 2 tiles ahead", compile_mma(8, 16, 2, 0, False, pdl=2), 1)
    report("weights first, x through shared memory, qkv, M <= 8",
           compile_xs(8, 8, 1, 0, 1, pdl=2), 1)  # fmt: skip
    report("weights first, x through shared memory, M = 16, 2 row warps, scaled",
           compile_xs(16, 8, 1, 0, 1, 2, scaled=True, pdl=2), 1)  # fmt: skip


if __name__ == "__main__":
    main()
