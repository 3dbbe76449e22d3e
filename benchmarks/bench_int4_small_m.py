"""INT4 at small M on the GPU: the table's gemv with and without its weight prefetched into L2
before it waits on the previous kernel (``Int4GemmConfig.l2_prefetch``; "l2 toggled" is the
table's config with that setting flipped), beside bf16 cuBLAS and the time a plain
streaming read of the same packed words takes in the same harness.

    python3 benchmarks/bench_int4_small_m.py [--shapes 4096x4096,...]
    python3 benchmarks/bench_int4_small_m.py --sweep   # gemv configs: long K, wide programs
    python3 benchmarks/bench_int4_small_m.py --pdl 1,16,64  # swapped kernel, dependent launch

Same harness as bench_int4_gemm.py: each op captured in a CUDA graph over enough weight
copies to exceed L2, median replay time / copies. "read" is the fastest of a small sweep of
a Triton kernel that streams the packed words (contiguous chunks per program, xor-reduced,
one int32 out per program), with and without being launched as a programmatic dependent
that prefetches its chunk into L2 before it waits: what the memory system gives a kernel
of this size here, the floor any M = 1 kernel reading these bytes has in this harness.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import SHAPES, Peers, _compile_worker, graph_time_us  # noqa: E402
from tqdm import tqdm  # noqa: E402

from kernels.int4_gemm import (  # noqa: E402
    Int4GemmConfig,
    _prefetch_l2,
    choose_config,
    device_form,
    frag_preferred,
    int4_gemm,
    int4_gemm_ref,
)
from kernels.int4_wgmma import int4_wgmma_swap  # noqa: E402


@triton.jit
def _stream_read(src, out, chunk, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    start = pid * chunk
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        _prefetch_l2(src + start + tl.arange(0, 1), chunk * 4)
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros([BLOCK], tl.int32)
    for off in tl.range(start, start + chunk, BLOCK):
        acc ^= tl.load(src + off + tl.arange(0, BLOCK))
    tl.store(out + pid, tl.xor_sum(acc, axis=0))


def stream_read(words: torch.Tensor, out: torch.Tensor, programs: int, block: int, warps: int,
                stages: int, pdl: bool) -> None:  # fmt: skip
    chunk = words.numel() // programs
    extra = {"launch_pdl": True} if pdl else {}
    _stream_read[(programs,)](
        words, out, chunk, BLOCK=block, PDL=pdl, num_warps=warps, num_stages=stages, **extra
    )


def read_floor(peers: Peers) -> tuple[float, float, tuple]:
    """(best plain time, the same config with PDL + L2 prefetch, the config)."""
    words = [w.qweight.view(-1) for w in peers.int4]
    out = torch.empty(8192, dtype=torch.int32, device="cuda")
    best = (float("inf"), None)
    for programs in (128, 256, 512, 1024, 2048):
        for block in (1024, 2048, 4096):
            if words[0].numel() % (programs * block):
                continue
            for warps, stages in ((4, 2), (4, 4), (8, 3)):
                cfg = (programs, block, warps, stages)
                t = graph_time_us(lambda i, c=cfg: stream_read(words[i], out, *c, False),
                                  peers.num_int4)  # fmt: skip
                best = min(best, (t, cfg))
    cfg = best[1]
    t_pdl = graph_time_us(lambda i: stream_read(words[i], out, *cfg, True), peers.num_int4)
    return best[0], t_pdl, cfg


def sweep_candidates() -> list[Int4GemmConfig]:
    """Gemv configs, fold in PTX, launched as programmatic dependents, holding 4 to 32 words
    per thread per step: long K ranges per program (4-16 outputs, split-K 1 or 2: few or no
    atomics, the read floor's shape of work) and more outputs per program with more warps
    (32-128 outputs, 2-8 warps, split-K 4-32)."""
    out = []
    shapes = [(bn, bk, split) for bn in (4, 8, 16) for bk in (512, 1024, 2048) for split in (1, 2)]
    shapes += [(bn, bk, split) for bn in (32, 64, 128) for bk in (256, 512)
               for split in (4, 8, 16, 32)]  # fmt: skip
    for bn, bk, split in shapes:
        for warps in (2, 4, 8):
            if not 4 <= bn * bk // 8 // (32 * warps) <= 32:
                continue
            modes = ((2, False), (3, False), (1, True)) if split <= 2 else ((2, False),)
            for stages, pre in modes:
                out.append(Int4GemmConfig("gemv", 16, bn, bk, split, warps, stages, fold=True,
                                          asm=True, pdl=True, prefetch=pre))  # fmt: skip
    return out


def sweep(shapes: list[tuple[int, int]], workers: int) -> None:
    """Every ``sweep_candidates`` config on every shape (compiled in parallel first, by
    bench_int4_gemm's worker on its four shapes), the six fastest per shape beside bf16 and
    the table."""
    import multiprocessing as mp

    cands = sweep_candidates()
    jobs = [(1, cfg) for cfg in cands]
    with mp.get_context("spawn").Pool(workers) as pool:
        done = sum(pool.map(_compile_worker, [jobs[i::workers] for i in range(workers)]))
    print(f"precompiled {done} (shape, config) launches", flush=True)
    for k, n in tqdm(shapes, desc="shapes"):
        peers = Peers(k, n, with_torch=False, engine_order=False)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        ref = int4_gemm_ref(x, peers.int4[0]).float()
        table = choose_config(1, n, k, peers.int4[0].group_size, x.device)
        results = []
        for cfg in tqdm([table, *cands], desc=f"{k}x{n}", leave=False):
            try:
                t = graph_time_us(
                    lambda i, c=cfg, x=x, w=peers.int4: int4_gemm(x, w[i], config=c),
                    peers.num_int4,
                )
                out = int4_gemm(x, peers.int4[0], config=cfg).float()
            except Exception as exc:
                print(f"  failed {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            err = ((out - ref).norm() / ref.norm()).item()
            if not err < 1e-2:
                print(f"  WRONG {cfg}: relative error {err:.2e}")
                continue
            results.append((t, cfg))
        t_bf16 = peers.time_bf16(x)
        t_table = results[0][0] if results and results[0][1] is table else float("nan")
        results.sort(key=lambda r: r[0])
        print(f"\n{k} x {n}: bf16 {t_bf16:.1f} us, table {t_table:.1f} us "
              f"({t_bf16 / t_table:.2f}x)")  # fmt: skip
        for t, cfg in results[:6]:
            print(f"  {t:.1f} us ({t_bf16 / t:.2f}x): block_n {cfg.block_n} block_k "
                  f"{cfg.block_k} split {cfg.split_k} warps {cfg.num_warps} stages "
                  f"{cfg.num_stages} prefetch {cfg.prefetch}", flush=True)  # fmt: skip
        peers = None
        torch.cuda.empty_cache()


def pdl_rows(shapes: list[tuple[int, int]], rows: list[int]) -> None:
    """Where the table runs the swapped kernel, its config as a plain launch and as a
    programmatic dependent in each of ``int4_wgmma_swap``'s ``pdl`` forms (1: the next launch
    may start on entry; 2: only after the main loop), engine word order. In the harness the
    kernel before each call is the previous call."""
    table_rows = []
    for k, n in tqdm(shapes, desc="shapes"):
        peers = Peers(k, n, with_torch=False, engine_order=True)
        w0 = peers.int4[0]
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            c = choose_config(m, n, k, w0.group_size, x.device, frag=w0.frag)
            if not (c.strategy == "wgmma" and c.swap):
                continue
            ref = int4_gemm_ref(x, w0).float()
            times = {}
            for mode in (0, 1, 2):

                def run(i, mode=mode, x=x, w=peers.int4, c=c):
                    return int4_wgmma_swap(x, w[i], c.block_m, c.block_n, c.block_k, c.split_k,
                                           c.num_stages, c.num_warps, c.specialized,
                                           pipe=c.pipe, pdl=mode)  # fmt: skip

                err = ((run(0).float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, f"{k}x{n} M={m} pdl {mode}: relative error {err:.1e}"
                times[mode] = graph_time_us(run, peers.num_int4)
            t_bf16 = peers.time_bf16(x)
            table_rows.append((k, n, m, c, t_bf16, times))
            parts = " ".join(f"[pdl {a}] {t:.1f}" for a, t in times.items())
            print(f"{k}x{n} M={m}: bf16 {t_bf16:.1f} {parts}", flush=True)
        peers = None
        torch.cuda.empty_cache()
    print("\n| K x N | M | table tiling | bf16 us | plain us | pdl 1 us | pdl 2 us | "
          "bf16 / plain | bf16 / best |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for k, n, m, c, t_bf16, t in table_rows:
        tiling = f"{c.block_m}x{c.block_n}, split {c.split_k}{', ws' if c.specialized else ''}"
        print(f"| {k} x {n} | {m} | {tiling} | {t_bf16:.1f} | {t[0]:.1f} | {t[1]:.1f} | "
              f"{t[2]:.1f} | {t_bf16 / t[0]:.2f}x | "
              f"{t_bf16 / min(t.values()):.2f}x |")  # fmt: skip


def time_shape(k: int, n: int) -> tuple:
    """Every variant, bf16 and the read floor on one weight shape at M = 1."""
    peers = Peers(k, n, with_torch=False, engine_order=False)  # canonical words: the gemv
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    w0 = peers.int4[0]
    table = choose_config(1, n, k, w0.group_size, x.device)
    variants = {"table": table}
    if table.strategy == "gemv":  # the table with the L2 prefetch the other way
        variants["table, l2 toggled"] = dataclasses.replace(
            table, l2_prefetch=not table.l2_prefetch
        )
    for split in (4, 8, 16):
        for bn, warps in ((16, 1), (32, 1), (64, 2)):
            cfg = dataclasses.replace(table, strategy="gemv", block_m=16, block_n=bn,
                                      block_k=256, split_k=split, num_warps=warps,
                                      num_stages=2, fold=True, asm=True, pdl=True,
                                      l2_prefetch=True)  # fmt: skip
            variants[f"gemv {bn}/{warps}w split {split} + l2"] = cfg
    ref = int4_gemm_ref(x, w0).float()
    times = {}
    for name, cfg in variants.items():
        err = ((int4_gemm(x, w0, config=cfg).float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, f"{k}x{n} {name}: relative error {err:.1e}"
        times[name] = graph_time_us(
            lambda i, c=cfg: int4_gemm(x, peers.int4[i], config=c), peers.num_int4
        )
    if frag_preferred(w0):  # the engine holds this weight in fragment (and tile) order
        frag = [device_form(w) for w in peers.int4]
        cfg = choose_config(1, n, k, w0.group_size, x.device, frag=True)
        times["table, fragment order"] = graph_time_us(
            lambda i: int4_gemm(x, frag[i], config=cfg), peers.num_int4
        )
    t_bf16 = peers.time_bf16(x)
    t_read, t_read_pdl, read_cfg = read_floor(peers)
    best = min((t, name) for name, t in times.items() if "table" not in name)
    print(f"{k}x{n}: bf16 {t_bf16:.1f} " + " ".join(f"[{a}] {t:.1f}" for a, t in
          times.items()) + f" read {t_read:.1f} read+pdl {t_read_pdl:.1f} {read_cfg}",
          flush=True)  # fmt: skip
    return k, n, t_bf16, times, best, t_read, t_read_pdl, read_cfg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=None, help="K x N list (default: the 8B shapes)")
    parser.add_argument("--sweep", action="store_true", help="gemv configs at M = 1")
    parser.add_argument("--workers", type=int, default=12, help="compile processes (--sweep)")
    parser.add_argument(
        "--pdl", default=None, metavar="M,...", help="swapped-kernel configs with / without pdl"
    )
    args = parser.parse_args()
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}", flush=True)  # fmt: skip
    if args.sweep:
        sweep(shapes, args.workers)
        return
    if args.pdl:
        pdl_rows(shapes, [int(m) for m in args.pdl.split(",")])
        return
    rows = []
    for k, n in shapes:
        rows.append(time_shape(k, n))
        torch.cuda.empty_cache()
    print("\n| K x N | bf16 us | table us (engine order) | table, l2 toggled us | "
          "best + l2 (config) | read us | read, PDL + l2 us | bf16 / table | bf16 / best | "
          "bf16 / read |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k, n, t_bf16, times, (t_best, name), t_read, t_read_pdl, _ in rows:
        t_l2 = times.get("table, l2 toggled", float("nan"))
        t_table = times.get("table, fragment order", times["table"])
        print(f"| {k} x {n} | {t_bf16:.1f} | {times['table']:.1f} ({t_table:.1f}) | {t_l2:.1f} | "
              f"{t_best:.1f} ({name}) | {t_read:.1f} | {t_read_pdl:.1f} | "
              f"{t_bf16 / t_table:.2f}x | {t_bf16 / t_best:.2f}x | "
              f"{t_bf16 / min(t_read, t_read_pdl):.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
