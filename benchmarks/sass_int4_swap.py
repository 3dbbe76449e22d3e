"""Instructions per K tile and registers of the swapped Gluon INT4 kernel, compiled for sm_90
on any machine (no GPU): canonical words against fragment-ordered ones (``Int4Weight.frag``),
row-major and in tile order (``Int4Weight.tiled``: the words' TMA box three-dimensional).

Same method as ``sass_int4_mm.py`` (Triton's bundled ptxas and cuobjdump; the K loop is the
smallest backward branch around the HGMMAs). Indicative only; to compile with the device's
Triton: ``python -m pip install --no-deps --target /tmp/t36 triton==3.6.0``, then
``PYTHONPATH=/tmp/t36:. python benchmarks/sass_int4_swap.py [ROWS ...]``.

Tiles: wgmma N = ROWS (default 8 and 16), 128 weight rows, K tiles of 128, 4 warps, 4 stages,
bf16, no split (the table's tiling for wide weights at M = 1 and 16).

``--overlap`` instead counts, for the table's tilings at M <= 128, the decode's instructions
that run while a wgmma is in flight, and the K loop's instructions by opcode.
``--stores`` instead counts the epilogue's stores and loads with and without
``vector_store`` (16-byte accesses through shared memory). ``--race`` instead checks the
table's large-M tilings, with and without two wgmmas in flight (``pipe``), for writes to an
in-flight wgmma's register operand (``inflight_operand_writes``). ``--wsplit`` instead
reports the form with a second warpgroup over the later K half (``check_wsplit``).
"""

from __future__ import annotations

import collections
import itertools
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

from sass_int4_mm import cuobjdump, loop_bodies, loop_body, main_loop  # noqa: E402

from kernels import int4_wgmma as W  # noqa: E402

BLOCK_N, BLOCK_K, WARPS, STAGES = 128, 128, 4, 4


def compile_swap_kernel(
    rows: int,
    frag: bool,
    block_n: int = BLOCK_N,
    stages: int = STAGES,
    warps: int = WARPS,
    specialized: bool = False,
    pipe: bool = False,
    pdl: int = 0,
    tiled: bool = False,
    vector_store: bool = False,
    mode: int = 0,
    wsplit: bool = False,
    wsplit_regs: int = 200,
    thread_release: bool = False,
):
    """``_int4_wgmma_swap_kernel`` compiled for sm_90, one tiling (Triton's compiled kernel:
    its ``asm`` and ``metadata``; CPU tensors stand in for the arguments: only their types and
    the descriptors' blocks matter)."""
    dtype = torch.bfloat16
    x = torch.empty(64, 4096, dtype=dtype)
    q = torch.empty(28672, 512, dtype=torch.int32)
    s = torch.empty(32, 28672, dtype=dtype)
    x_layout, q_layout, _ = W._shared_layouts(dtype, rows, block_n, BLOCK_K)
    row = W._row_layout(dtype)
    args = {
        "x_desc": TensorDescriptor.from_tensor(x, [rows, BLOCK_K], x_layout),
        "qw_desc": (
            W._tiled_words_desc(q, block_n)
            if tiled
            else TensorDescriptor.from_tensor(q, [block_n, BLOCK_K // 8], q_layout)
        ),
        "s_desc": TensorDescriptor.from_tensor(s, [1, block_n], row),
        "o_desc": TensorDescriptor.from_tensor(s, [1, block_n], row),
        "out_ptr": torch.empty(1, dtype=dtype),
        "ws_ptr": torch.empty(1, dtype=torch.float32),
        "lock_ptr": torch.empty(1, dtype=torch.int32),
        **dict.fromkeys(["M", "N", "K", "k_per_split", "num_splits", "stride_out_m"], 4096),
    }
    words = W._frag_words_layout if frag else W._fragment_words_layout
    constexprs = {
        "Q_LAYOUT": q_layout,
        "L3": words(block_n, BLOCK_K // 8, warps),
        "S_LAYOUT": W._fragment_words_layout(block_n, 1, warps, row=True),
        "GROUP_TILES": 1,
        "MODE": mode,
        "NUM_STAGES": stages,
        "SPECIALIZED": specialized,
        "FRAG": frag,
        "PARTS": 0,
        "PIPE": pipe,
        "PDL": pdl,
        "VECTOR_STORE": vector_store,
        "WSPLIT": wsplit,
        "WSPLIT_REGS": wsplit_regs,
        "THREAD_RELEASE": thread_release,
        "num_warps": warps,
    }
    kernel = W._int4_wgmma_swap_kernel
    signature, values = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            values[(i,)] = constexprs[name]
        else:
            signature[name] = mangle_type(args[name])
    # what the launcher's specialization tells the compiler about its arguments: 16-byte
    # aligned pointers, and N, K and the output's row stride multiples of 16
    aligned = {"out_ptr", "ws_ptr", "lock_ptr", "N", "K", "k_per_split", "stride_out_m"}
    attrs = {
        (i,): [["tt.divisibility", 16]] for i, a in enumerate(kernel.arg_names) if a in aligned
    }
    source = GluonASTSource(kernel, signature, values, attrs)
    target = GPUTarget("cuda", 90, 32)
    return triton.compile(source, target=target, options={"num_warps": warps})


def compile_swap(*args, **kwargs) -> bytes:
    """``compile_swap_kernel``'s sm_90 cubin."""
    return compile_swap_kernel(*args, **kwargs).asm["cubin"]


def inflight_operand_writes(body: list[str]) -> list[str]:
    """Instructions of a K loop ``body`` (``loop_body``; walked twice, for the back edge) that
    write a register an HGMMA still in flight reads as its A operand: a wgmma reads its
    register operand asynchronously, so such a write (a loop-carried operand moved into place,
    say) races with it. In flight: issued and not yet retired by a ``WARPGROUP.DEPBAR.LE gsb0,
    n``."""
    groups: list[set[int]] = []  # A registers of each HGMMA group in flight, oldest first
    pending: list[int] = []
    races = []
    for op in body * 2:
        if op.startswith("HGMMA"):
            first = int(re.search(r"HGMMA\S*\s+R\d+,\s*R(\d+)", op).group(1))
            pending += range(first, first + 4)
            if "gsb0" in op:  # the group's last HGMMA
                groups.append(set(pending))
                pending = []
            continue
        wait = re.match(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x(\d+)", op)
        if wait:
            keep = int(wait.group(1))
            groups = groups[len(groups) - keep :] if keep else []
            continue
        dest = re.match(r"[A-Z][\w.]*\s+R(\d+)", op)
        if dest and not op.startswith(("ST", "RED", "ATOM")) and groups:
            reg = int(dest.group(1))
            width = 2 if ".64" in op.split()[0] else 1
            if any(r in set().union(*groups) for r in range(reg, reg + width)):
                races.append(op)
    return races


def decode_overlap(body: list[str]) -> tuple[int, int]:
    """(decode LOP3s issued while a wgmma group is in flight, all decode LOP3s) in the K loop
    ``body`` (``loop_body``), walked twice for the back edge and counted on the second walk:
    a group is in flight from its last HGMMA (``gsb0``) until a ``WARPGROUP.DEPBAR.LE gsb0,
    n`` leaves fewer than it. The decode's LOP3s are those with the codes' mask
    ``0xf000f``."""
    in_flight, overlapped, total = 0, 0, 0
    for walk in (0, 1):
        for op in body:
            if op.startswith("HGMMA") and "gsb0" in op:
                in_flight += 1
            wait = re.match(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x(\d+)", op)
            if wait:
                in_flight = min(in_flight, int(wait.group(1)))
            if walk and op.startswith("LOP3") and "0xf000f" in op:
                total += 1
                overlapped += in_flight > 0
    return overlapped, total


def check_overlap() -> None:
    """``--overlap``: how much of the decode runs beside a wgmma in flight, for the table's
    swapped tilings at M <= 128 (the loop without ``pipe``, plain and warp-specialized), one
    warpgroup over 128 weight rows without it, and the wide form at M = 33-64 with two wgmmas
    in flight: in the loop without ``pipe`` ptxas puts the wait for the wgmma before the next
    tile's decode, whose registers are the in-flight wgmma's operand. Prints each K loop's
    instructions per K tile and its opcodes, most frequent first."""
    tilings = [(16, 128, 4, 4, {"pdl": 3}), (64, 64, 6, 4, {"pdl": 3}),
               (64, 128, 4, 8, {"pdl": 3}), (64, 128, 4, 4, {"pdl": 3}),
               (64, 128, 4, 4, {"pdl": 3, "pipe": True}), (128, 64, 3, 4, {}),
               (128, 64, 4, 4, {"specialized": True})]  # fmt: skip
    for rows, block_n, stages, warps, kwargs in tilings:
        cubin = compile_swap(rows, True, block_n, stages, warps, tiled=True, **kwargs)
        body = loop_body(cubin)
        tiles = 2 if kwargs.get("pipe") else 1  # the two-wgmma loop runs K tiles in pairs
        regs = re.search(r"REG:(\d+)", cuobjdump(cubin, "-res-usage")).group(1)
        overlapped, total = decode_overlap(body)
        ops = collections.Counter(op.split()[0].split(".")[0] for op in body)
        print(f"rows {rows} x {block_n}, {stages} stages, {warps} warps {kwargs}: "
              f"{len(body) // tiles} instructions per K tile, {regs} registers, {overlapped} of "
              f"{total} decode LOP3s beside a wgmma in flight; per loop of {tiles} K tile(s): "
              f"{', '.join(f'{op} {n}' for op, n in ops.most_common())}")  # fmt: skip


def check_races() -> None:
    """``--race``: the two-wgmmas-in-flight loop (``pipe``) on the table's tilings must never
    write an in-flight wgmma's operand registers (the check flags the loop-carried form the
    first version had: 32 moves into the operand of the wgmma still running); the
    warp-specialized tilings also with ``thread_release``."""
    tilings = [(256, 128, 3, 8, True), (256, 128, 3, 8, False), (128, 64, 3, 4, False),
               (128, 64, 4, 4, True), (64, 128, 4, 4, False), (64, 64, 4, 4, False),
               (64, 64, 6, 4, True), (16, 64, 4, 4, False)]  # fmt: skip
    for rows, block_n, stages, warps, specialized in tilings:
        for frag, pipe, release in itertools.product(
            (False, True), (False, True), (False, True) if specialized else (False,)
        ):
            cubin = compile_swap(rows, frag, block_n, stages, warps, specialized, pipe,
                                 thread_release=release)  # fmt: skip
            races = inflight_operand_writes(loop_body(cubin))
            print(f"rows {rows} x {block_n}, {stages} stages, {warps} warps, "
                  f"{'specialized' if specialized else 'plain'}, "
                  f"{'fragment' if frag else 'canonical'}, pipe={pipe}, "
                  f"thread_release={release}: {len(races)} writes to in-flight operands "
                  f"{races[:3]}")  # fmt: skip


def check_wsplit() -> None:
    """``--wsplit``: the second warpgroup over the later K half (``wsplit``) on 64-row x
    tiles: shared memory, registers, the named barriers in the PTX (each warpgroup's
    ``gl.thread_barrier`` must be a barrier of its own 128 threads), the two warpgroups' K
    loops (the two smallest loops around an HGMMA) with their instructions per K tile and
    decode beside a wgmma in flight, and writes to an in-flight operand over every loop
    around an HGMMA."""
    tilings = [(64, 3, {}), (64, 3, {"pipe": True}), (64, 4, {"pdl": 3}),
               (128, 3, {"pipe": True, "pdl": 3})]  # fmt: skip
    for block_n, stages, kwargs in tilings:
        for frag in (False, True):
            kernel = compile_swap_kernel(64, frag, block_n, stages, 4, wsplit=True, **kwargs)
            cubin = kernel.asm["cubin"]
            regs = re.search(r"REG:(\d+)", cuobjdump(cubin, "-res-usage")).group(1)
            bars = collections.Counter(re.findall(r"bar\.sync\s+(\d+, \d+);", kernel.asm["ptx"]))
            loops = sorted(loop_bodies(cubin), key=len)
            tiles = 2 if kwargs.get("pipe") else 1
            own = [
                f"{len(body) // tiles} per K tile, %d of %d decode LOP3s beside a wgmma"
                % decode_overlap(body)
                for body in loops[:2]
            ]
            races = sum(len(inflight_operand_writes(body)) for body in loops)
            print(f"64 x {block_n}, {stages} stages a ring {kwargs}, "
                  f"{'fragment' if frag else 'canonical'}: {kernel.metadata.shared} bytes "
                  f"shared, {regs} registers, named barriers (id, threads: count) "
                  f"{dict(bars)}; the two K loops: {'; '.join(own)}; {races} writes to "
                  f"in-flight operands over all {len(loops)} loops")  # fmt: skip


def store_counts() -> None:
    """``--stores``: the epilogue's global stores and loads (SASS opcodes, each counted once in
    the kernel) and the registers of the table's tilings in fragment and tile order, with the
    wgmma layout's epilogue and with ``vector_store``, storing the output (MODE 0) and the
    split-K slots (MODE 3)."""
    tilings = [(16, 64, 4, 4, {}), (64, 64, 6, 4, {"pdl": 3}), (128, 64, 3, 4, {"pipe": True}),
               (256, 64, 3, 4, {"specialized": True, "pipe": True}),
               (256, 128, 3, 8, {"specialized": True, "pipe": True})]  # fmt: skip
    for rows, block_n, stages, warps, kwargs in tilings:
        for mode in (0, 3):
            for vector in (False, True):
                cubin = compile_swap(rows, True, block_n, stages, warps, tiled=True,
                                     vector_store=vector, mode=mode, **kwargs)  # fmt: skip
                sass = cuobjdump(cubin, "-sass")
                ops = collections.Counter(re.findall(r"\b((?:STG|LDG)\.E[\w.]*)", sass))
                regs = re.search(r"REG:(\d+)", cuobjdump(cubin, "-res-usage")).group(1)
                print(f"rows {rows} x {block_n}, {stages} stages, {warps} warps {kwargs}, "
                      f"MODE {mode}, vector_store={vector}: {regs} registers, "
                      f"{dict(sorted(ops.items()))}")  # fmt: skip


def main() -> None:
    if sys.argv[1:] == ["--race"]:
        check_races()
        return
    if sys.argv[1:] == ["--stores"]:
        store_counts()
        return
    if sys.argv[1:] == ["--overlap"]:
        check_overlap()
        return
    if sys.argv[1:] == ["--wsplit"]:
        check_wsplit()
        return
    for rows in [int(r) for r in sys.argv[1:]] or [8, 16]:
        for frag, tiled in ((False, False), (True, False), (True, True)):
            cubin = compile_swap(rows, frag, tiled=tiled)
            ops = main_loop(cubin)
            regs = re.search(r"REG:(\d+)", cuobjdump(cubin, "-res-usage")).group(1)
            top = ", ".join(f"{op} {n}" for op, n in collections.Counter(ops).most_common(8))
            tma = sorted(set(re.findall(r"UTMALDG\S*", cuobjdump(cubin, "-sass"))))
            order = "tile order" if tiled else "fragment order" if frag else "canonical"
            print(f"rows {rows}, {order}: {len(ops)} instructions per K tile, {regs} registers"
                  f" ({top}); TMA loads {', '.join(tma)}")  # fmt: skip


if __name__ == "__main__":
    main()
