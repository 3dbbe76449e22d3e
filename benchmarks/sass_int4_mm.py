"""Instructions per K step of the INT4 ``mm`` kernels, compiled for sm_90 on any machine.

No GPU needed: Triton compiles the kernel for an H100/H200 target with its bundled ptxas, and
``cuobjdump`` (shipped with Triton) disassembles it. The main loop is the smallest backward
branch around the ``HGMMA`` instructions; the script prints its length and its most frequent
opcodes. Indicative only: the device may run another Triton version.
To compile with the device's Triton (3.6.0 on the H200 machine), keeping this environment's:
``python -m pip install --no-deps --target /tmp/t36 triton==3.6.0``, then run the script with
``PYTHONPATH=/tmp/t36:.``.

Variants (16 x 64 tile, K step 128, bf16, 4 warps, 3 stages, swapped operands, pipelined):
``magic`` (magic-number decode, pointer loads), ``asm`` (inline-PTX decode, pointer loads),
``tma`` (inline-PTX decode, TMA tile loads); and ``tma-large``, the large-M form: 128 x 128
tile, 8 warps, operands not swapped (x straight from the TMA buffer, the weight tile in K
order through shared memory).

    python benchmarks/sass_int4_mm.py [magic asm tma tma-large]
"""

from __future__ import annotations

import collections
import inspect
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.int4_gemm import _int4_mm_kernel, _int4_mm_tma_kernel

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 128
ALIGNED = ["N", "K", "k_per_split", "stride_s_g", "stride_out_m", "group_size", "stride_x_m",
           "stride_qw_n"]  # fmt: skip


def compile_variant(variant: str) -> bytes:
    """The sm_90 cubin of one variant, with the launcher's 16-divisibility hints."""
    large = variant == "tma-large"
    block_m, block_n, num_warps = (128, 128, 8) if large else (BLOCK_M, BLOCK_N, 4)
    common = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": BLOCK_K, "GROUP_M": 8,
              "MODE": 1 if large else 2, "NUM_STAGES": 3, "EVEN_N": True}  # fmt: skip
    signature = {"s_ptr": "*bf16", "o_ptr": "*bf16", "out_ptr": "*bf16", "ws_ptr": "*fp32",
                 "lock_ptr": "*i32"}  # fmt: skip
    if variant.startswith("tma"):
        kernel = _int4_mm_tma_kernel
        signature["x_desc"] = f"tensordesc<bf16[{block_m}, {BLOCK_K}]>"
        signature["qw_desc"] = f"tensordesc<i32[{block_n}, {BLOCK_K // 8}]>"
        ints = ["M", "N", "K", "k_per_split", "num_splits", "stride_s_g", "stride_out_m"]
        constexprs = {**common, "GROUP_TILES": 1, "SWAP": not large}
    else:
        kernel = _int4_mm_kernel
        signature.update({"x_ptr": "*bf16", "qw_ptr": "*i32"})
        ints = ["M", "N", "K", "group_size", "k_per_split", "num_splits", "stride_x_m",
                "stride_qw_n", "stride_s_g", "stride_out_m"]  # fmt: skip
        constexprs = {**common, "IEEE": False, "MAGIC_DQ": variant == "magic", "SWAP": True,
                      "PIPELINED": True, "EVEN_K": True, "ASM": variant == "asm"}  # fmt: skip
    signature.update(dict.fromkeys(ints, "i32"))
    return compile_sm90(kernel, signature, constexprs, ALIGNED, num_warps=num_warps, num_stages=3)


def compile_sm90(
    kernel,
    signature: dict,
    constexprs: dict,
    aligned,
    num_warps: int,
    num_stages: int,
    source_cls=ASTSource,
) -> bytes:
    """The sm_90 cubin of ``kernel`` for the given argument types and constexprs, with the
    launchers' 16-divisibility hints on pointers and on the ``aligned`` integer arguments
    (``source_cls``: Gluon's ``GluonASTSource`` for a Gluon kernel). Constexprs not given
    take their defaults in the kernel's signature, as at a launch that leaves them out."""
    defaults = {p.name: p.default for p in kernel.params
                if p.is_constexpr and p.default is not inspect.Parameter.empty}  # fmt: skip
    constexprs = {**{n: v for n, v in defaults.items() if n not in signature}, **constexprs}
    signature = {**signature, **dict.fromkeys(constexprs, "constexpr")}
    names = list(kernel.arg_names)
    signature = {n: signature[n] for n in names}  # in argument order, as Triton reads it
    attrs = {
        (names.index(n),): [["tt.divisibility", 16]]
        for n in names
        if n in aligned or signature[n].startswith("*")
    }
    source = source_cls(kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["cubin"]


def cuobjdump(cubin: bytes, flag: str) -> str:
    """Output of Triton's bundled ``cuobjdump FLAG`` (``-sass``, ``-res-usage``) on a cubin."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True).stdout


def loop_bodies(cubin: bytes, op: str = "HGMMA") -> list[list[str]]:
    """Instructions (predicates dropped, operands kept) of every loop (backward branch) that
    contains an ``op`` instruction, in the order of their back edges."""
    sass = cuobjdump(cubin, "-sass")
    insts = [
        (int(m.group(1), 16), m.group(2).strip())
        for m in re.finditer(r"/\*([0-9a-f]{4})\*/\s+(.*?);", sass)
    ]
    loops = []
    for addr, text in insts:
        target = re.search(r"BRA\s.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            body = [t for a, t in insts if int(target.group(1), 16) <= a <= addr]
            if any(t.split()[0].startswith(op) or f" {op}" in t for t in body):
                loops.append([re.sub(r"^@!?U?P\w+\s+", "", t) for t in body])
    return loops


def loop_body(cubin: bytes, op: str = "HGMMA", largest: bool = False) -> list[str]:
    """``loop_bodies``' smallest loop (``largest``: the largest)."""
    loops = loop_bodies(cubin, op)
    if not loops:
        raise SystemExit(f"no loop around an {op} found")
    return (max if largest else min)(loops, key=len)


def main_loop(cubin: bytes, op: str = "HGMMA", largest: bool = False) -> list[str]:
    """Opcodes of ``loop_body``'s loop."""
    return [t.split()[0].split(".")[0] for t in loop_body(cubin, op, largest)]


def main() -> None:
    for variant in sys.argv[1:] or ["magic", "asm", "tma", "tma-large"]:
        ops = main_loop(compile_variant(variant))
        top = ", ".join(f"{op} {n}" for op, n in collections.Counter(ops).most_common(12))
        print(f"{variant}: {len(ops)} instructions per K step of {BLOCK_K} ({top})")


if __name__ == "__main__":
    main()
