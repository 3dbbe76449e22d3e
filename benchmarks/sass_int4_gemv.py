"""Instructions and registers of the INT4 ``gemv`` kernel's decode variants, compiled for sm_90
on any machine.

No GPU needed: Triton compiles the kernel for an H100/H200 target with its bundled ptxas, and
``cuobjdump`` (shipped with Triton) disassembles it and reports its register use. Whole-kernel
instruction counts (the kernel is one loop step plus the split-K epilogue at the launch shapes
of the table); indicative only: the device may run another Triton version.
To compile with the device's Triton (3.6.0 on the H200 machine), keeping this environment's:
``python -m pip install --no-deps --target /tmp/t36 triton==3.6.0``, then run the script with
``PYTHONPATH=/tmp/t36:.``.

Variants (bf16 x, one warp, 256 K per step, 2 stages): ``plain`` (``_nibble_dot``: AND-OR,
subtract, FMA per weight), ``fold`` (``_nibble_dot_fold`` in Triton), ``fold-asm`` (the same in
inline PTX), each with 16 and 32 outputs per program.

    PYTHONPATH=. python benchmarks/sass_int4_gemv.py
"""

from __future__ import annotations

import collections
import re

from benchmarks.sass_int4_mm import compile_sm90, cuobjdump
from kernels.int4_gemm import _int4_gemv_kernel

INTS = ["N", "K", "group_size", "subs_per_split", "num_splits", "stride_x_m", "stride_x32_m",
        "stride_qw_n", "stride_s_g", "stride_out_m"]  # fmt: skip
ALIGNED = set(INTS) - {"subs_per_split", "num_splits"}


def compile_variant(fold: int, block_n: int) -> bytes:
    """The sm_90 cubin of one variant, with the launcher's 16-divisibility hints."""
    constexprs = {"BLOCK_N": block_n, "SUB_W": 16, "NUM_SUB": 2, "NUM_STAGES": 2, "MODE": 2,
                  "X16": True, "IS_BF16": True, "EVEN_N": True, "EVEN_K": True, "FOLD": fold,
                  "PREFETCH": False, "PDL": True}  # fmt: skip
    signature = {"x_ptr": "*bf16", "x32_ptr": "*i32", "qw_ptr": "*i32", "s_ptr": "*bf16",
                 "o_ptr": "*bf16", "out_ptr": "*bf16", "ws_ptr": "*fp32",
                 "lock_ptr": "*i32", **dict.fromkeys(INTS, "i32")}  # fmt: skip
    return compile_sm90(_int4_gemv_kernel, signature, constexprs, ALIGNED, 1, 2)


def inspect(cubin: bytes) -> tuple[collections.Counter, int]:
    """(opcode counts, registers per thread) of a cubin."""
    ops = collections.Counter(
        re.sub(r"^@!?U?P\w+\s+", "", m.group(1).strip()).split()[0].split(".")[0]
        for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(.*?);", cuobjdump(cubin, "-sass"))
    )
    return ops, int(re.search(r"REG:(\d+)", cuobjdump(cubin, "-res-usage")).group(1))


def main() -> None:
    print("| variant | outputs per program | instructions | registers | top opcodes |")
    print("|---|---|---|---|---|")
    for name, fold in (("plain", 0), ("fold", 1), ("fold-asm", 2)):
        for block_n in (16, 32):
            ops, regs = inspect(compile_variant(fold, block_n))
            top = ", ".join(f"{op} {n}" for op, n in ops.most_common(6))
            print(f"| {name} | {block_n} | {sum(ops.values())} | {regs} | {top} |")


if __name__ == "__main__":
    main()
