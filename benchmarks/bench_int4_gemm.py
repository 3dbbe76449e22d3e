"""INT4 GEMM on the GPU: tidal's Triton kernel beside bf16 cuBLAS and torch's int4 kernel.

    python benchmarks/bench_int4_gemm.py            # the table in kernels/int4_gemm_config.py
    python benchmarks/bench_int4_gemm.py --sweep --no-model --out DIR  # candidates, best 3
    python benchmarks/bench_int4_gemm.py --previous-order   # narrow weights canonical (gemv)
    python benchmarks/bench_int4_gemm.py --untiled   # fragment order without tile order

Llama-3-8B projection shapes (K x N), group 128, M = 1, 16, 64, 256, 1024. Each op is
captured in a CUDA graph that runs it over enough copies of the weight to exceed the L2
cache several times (weights come from HBM, as in a real forward pass); the median replay
time is divided by the number of copies. Also prints the weight memory of an INT4
Llama-3-8B-shaped model and the time of its linear layers for one decode step (batch 1
and 32; attention, norms and activations excluded) against bf16.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.int4_gemm import (  # noqa: E402
    Int4GemmConfig,
    Int4Weight,
    device_form,
    frag_preferred,
    int4_gemm,
    int4_gemm_ref,
)

SHAPES = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]  # (K, N)
ROWS = [1, 16, 64, 256, 1024]
GROUP = 128
ROTATE_BYTES = 512 * 2**20  # several times the 60 MB L2


def random_int4(n: int, k: int, device: str = "cuda") -> Int4Weight:
    qweight = torch.randint(-(2**31), 2**31 - 1, (n, k // 8), dtype=torch.int32, device=device)
    scales = torch.rand(k // GROUP, n, device=device, dtype=torch.bfloat16) * 0.01 + 0.001
    offsets = -8 * scales
    return Int4Weight(qweight, scales, offsets, GROUP)


# ``--previous-order``: the engine's word order before 2026-11-30's twelfth session, when only
# wide and long-K weights were held in fragment order (narrow ones ran the gemv at M = 1).
PREVIOUS_ORDER = False
# ``--untiled``: fragment-ordered words row-major, as the engine held them before the
# twenty-third session (no ``tile_order``).
UNTILED = False


def engine_int4(n: int, k: int) -> Int4Weight:
    """A random weight in the word order the engine holds it in (``Int4Linear``,
    ``device_form``: fragment and tile order on Hopper; with ``PREVIOUS_ORDER`` fragment
    order only for wide and long-K weights, with ``UNTILED`` no tile order)."""
    weight = random_int4(n, k)
    if PREVIOUS_ORDER or UNTILED:
        frag = frag_preferred(weight) and (not PREVIOUS_ORDER or n > 8192 or k >= 8192)
        return weight.to_frag() if frag else weight
    return device_form(weight)


def graph_time_us(fn, num_copies: int, num_replays: int = 10) -> float:
    """Median time of one ``fn(i)`` call, from CUDA-graph replays over ``num_copies`` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(num_copies):
            fn(i)  # warm-up: compile, allocate
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(num_copies):
            fn(i)
    times = []
    for r in range(num_replays + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        if r >= 3:
            times.append(start.elapsed_time(end) * 1000 / num_copies)
    del graph
    return statistics.median(times)


class Peers:
    """Copies of one (K, N) weight in the three forms compared."""

    def __init__(self, k: int, n: int, with_torch: bool = True, engine_order: bool = True):
        self.k, self.n = k, n
        self.num_bf16 = max(2, ROTATE_BYTES // (k * n * 2))
        self.num_int4 = max(2, ROTATE_BYTES // (k * n // 2))
        self.bf16 = [
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            for _ in range(self.num_bf16)
        ]
        make = engine_int4 if engine_order else random_int4  # sweeps: canonical words
        self.int4 = [make(n, k) for _ in range(self.num_int4)]
        self.torch_int4 = None
        try:
            if not with_torch:
                raise RuntimeError("not requested")
            packed = [
                torch._convert_weight_to_int4pack(
                    torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda"), 8
                )
                for _ in range(self.num_int4)
            ]
            sz = torch.rand(k // GROUP, n, 2, device="cuda", dtype=torch.bfloat16) * 0.01
            self.torch_int4 = (packed, sz)
        except (RuntimeError, AttributeError) as exc:
            print(f"torch._weight_int4pack_mm unavailable: {exc}")

    def time_bf16(self, x: torch.Tensor) -> float:
        return graph_time_us(lambda i: F.linear(x, self.bf16[i]), self.num_bf16)

    def time_torch_int4(self, x: torch.Tensor) -> float:
        if self.torch_int4 is None:
            return float("nan")
        packed, sz = self.torch_int4
        return graph_time_us(
            lambda i: torch._weight_int4pack_mm(x, packed[i], GROUP, sz), self.num_int4
        )

    def time_read_floor(self) -> float:
        """Time to read the packed weights once (a torch sum over qweight): what the memory
        system gives a kernel of this size in the same timing harness."""
        return graph_time_us(
            lambda i: torch.sum(self.int4[i].qweight, dtype=torch.int32), self.num_int4
        )

    def time_ours(self, x: torch.Tensor, config: Int4GemmConfig | None) -> float:
        return graph_time_us(lambda i: int4_gemm(x, self.int4[i], config=config), self.num_int4)

    def check(self, x: torch.Tensor, config: Int4GemmConfig | None) -> float:
        out = int4_gemm(x, self.int4[0], config=config).float()
        ref = int4_gemm_ref(x, self.int4[0]).float()
        return ((out - ref).norm() / ref.norm()).item()


def shape_rows(shapes: list[tuple[int, int]], rows: list[int], desc: str = "shapes x M"):
    """(K, N, M, peers, first) for every shape and M, with a progress bar: one ``Peers`` per
    shape (the engine's word order, no torch int4), freed before the next; ``first`` on a
    shape's first M."""
    from tqdm import tqdm

    peers, shape = None, None
    for k, n, m in tqdm([(k, n, m) for k, n in shapes for m in rows], desc=desc):
        first = shape != (k, n)
        if first:
            del peers
            torch.cuda.empty_cache()
            peers, shape = Peers(k, n, with_torch=False), (k, n)
        yield k, n, m, peers, first


def config_changes(text: str, what: str = "a config change") -> dict:
    """``FIELD=VALUE,...`` as changes of ``Int4GemmConfig`` fields, typed by the fields'
    annotations: flags 0/1/true/false, ``none`` for None (``maxnreg``), strings as given, else
    ints. ``what`` names the source in the errors."""
    types = {f.name: str(f.type) for f in dataclasses.fields(Int4GemmConfig)}
    changes = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip().lower()
        if not sep or name not in types:
            raise SystemExit(
                f"{what} {text!r}: {item!r} is not FIELD=VALUE of Int4GemmConfig "
                f"(fields: {', '.join(types)})"
            )
        kind = types[name]
        if kind in ("bool", str(bool)):
            if value not in ("0", "1", "true", "false"):
                raise SystemExit(f"{what} {text!r}: {name} takes 0/1/true/false, got {value!r}")
            changes[name] = value in ("1", "true")
        elif kind in ("str", str(str)):
            changes[name] = value
        elif value == "none" and "None" in kind:
            changes[name] = None
        else:
            try:
                changes[name] = int(value)
            except ValueError:
                raise SystemExit(
                    f"{what} {text!r}: {name} takes an integer, got {value!r}"
                ) from None
    return changes


def describe(cfg: Int4GemmConfig) -> str:
    """A config in a table cell: strategy, tiling, split, ``ws`` (warp-specialized), ``pipe``."""
    return (f"{cfg.strategy} {cfg.block_m}x{cfg.block_n} split {cfg.split_k}"
            f"{' ws' if cfg.specialized else ''}{' pipe' if cfg.pipe else ''}")  # fmt: skip


def plot_pairs(path: str, curves: dict, title: str, log_x: bool = True) -> None:
    """A PNG of bf16 time / INT4 time by M, one colour per shape: ``curves`` maps a label to
    (Ms, solid ratios, dashed ratios), the solid line the candidate, the dashed its peer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, (ms, solid, dashed) in curves.items():
        (line,) = ax.plot(ms, solid, marker="o", label=label)
        ax.plot(ms, dashed, ls="--", color=line.get_color())
    ax.axhline(1.0, color="grey", lw=0.8)
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel("M (rows of x)")
    ax.set_ylabel("bf16 time / INT4 time")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def candidates(m: int) -> list[Int4GemmConfig]:
    """Configs the sweep tries for M rows (kept small: device time is scarce): the shipped
    table's configs and neighbours of them with the inline-PTX dequantization (``asm``).
    ``mm`` variants: magic-number dequantization, swapped operands (weight tile on the left
    of ``tl.dot``), tl.range-pipelined weight loads (Int4GemmConfig's docstring)."""
    out: list[Int4GemmConfig] = []
    mm = Int4GemmConfig
    tma = {"swap": True, "pipelined": True, "asm": True, "tma": True}
    ktma = {"pipelined": True, "asm": True, "tma": True}  # TMA, not swapped (K-order weights)
    if m == 1:
        # (outputs per program, K per loop step, splits, warps, stages): every gemv config of
        # the 2026-11-30 sweeps (BENCHMARKS.md), options in Int4GemmConfig's docstring.
        gemv = Int4GemmConfig
        fold, fpd = {"fold": True}, {"fold": True, "prefetch": True, "pdl": True}
        ptx = {"fold": True, "asm": True}
        for bn in (16, 32):
            for split in (8, 16, 32):
                out.append(gemv("gemv", 16, bn, 256, split, 1, 2))  # the previous table's form
            for split in (4, 8, 16):
                out.append(gemv("gemv", 16, bn, 256, split, 1, 2, **fold, pdl=True))
                out.append(gemv("gemv", 16, bn, 256, split, 1, 2, pdl=True))
                out.append(gemv("gemv", 16, bn, 256, split, 1, 1, **fpd))
            for split in (8, 16):
                out.append(gemv("gemv", 16, bn, 256, split, 1, 2, **ptx, pdl=True))
            out.append(gemv("gemv", 16, bn, 256, 8, 1, 2, **ptx))
        out.append(gemv("gemv", 16, 64, 256, 8, 2, 2, **ptx, pdl=True))  # N >= 16384
        # not yet timed (for the next device run): the PTX fold with more warps per program,
        # with the register prefetch, and in longer cp.async-pipelined loops
        for bn, warps, split in [(32, 2, 8), (64, 2, 4), (64, 2, 16), (64, 4, 8), (128, 4, 8)]:
            out.append(gemv("gemv", 16, bn, 256, split, warps, 2, **ptx, pdl=True))
        out.append(gemv("gemv", 16, 16, 256, 8, 1, 1, **ptx, prefetch=True, pdl=True))
        for bn, split in [(16, 4), (16, 8), (32, 4)]:  # 512 K per step: fewer epilogues
            out.append(gemv("gemv", 16, bn, 512, split, 1, 2, **ptx, pdl=True))
        for split in (2, 4):
            out.append(gemv("gemv", 16, 16, 256, split, 1, 3, **ptx, pdl=True))
            out.append(gemv("gemv", 16, 64, 256, split, 4, 3, **ptx, pdl=True))
        for bn in (8, 16, 32):
            for split in (8, 16):
                out.append(gemv("gemv", 16, bn, 256, split, 1, 2, **fold))
        for split in (8, 16):
            out.append(gemv("gemv", 16, 8, 256, split, 1, 2))
            out.append(gemv("gemv", 16, 8, 256, split, 1, 1, **fpd))
        # long loops through a cp.async pipeline (stages in shared memory, few registers)
        for split in (1, 2, 4, 8):
            out.append(gemv("gemv", 16, 16, 128, split, 1, 3, **fold))
            out.append(gemv("gemv", 16, 16, 128, split, 1, 3, **fold, pdl=True))
        for split in (2, 4, 8):
            out.append(gemv("gemv", 16, 32, 128, split, 1, 3, **fold))
        for split in (2, 4):
            out.append(gemv("gemv", 16, 32, 128, split, 2, 3, **fold))
            out.append(gemv("gemv", 16, 16, 128, split, 1, 3))
            out.append(gemv("gemv", 16, 32, 256, split, 2, 3, **fold))
            out.append(gemv("gemv", 16, 16, 128, split, 1, 4, **fold))
        for split in (1, 2, 4):
            out.append(gemv("gemv", 16, 16, 256, split, 1, 3, **fold))
    if 1 < m <= 16:
        for split in (4, 8):
            out.append(mm("mm", 16, 64, 128, split, 4, 3, magic=True, swap=True, pipelined=True))
        for bn, split, stages in [(64, 4, 3), (64, 8, 3), (64, 16, 3), (64, 8, 4), (128, 4, 3),
                                  (128, 8, 3), (32, 16, 3)]:  # fmt: skip
            out.append(mm("mm", 16, bn, 128, split, 4, stages, swap=True, pipelined=True, asm=True))
        out.append(mm("mm", 16, 64, 128, 8, 4, 3, pipelined=True, asm=True))
        for bn, split, stages in [(64, 4, 3), (64, 8, 3), (64, 16, 3), (64, 8, 4), (64, 8, 6),
                                  (128, 4, 3), (128, 8, 4), (32, 8, 4), (32, 16, 4)]:  # fmt: skip
            out.append(mm("mm", 16, bn, 128, split, 4, stages, **tma))
        for bn, split in [(64, 8), (128, 4)]:  # not swapped: x from the TMA buffer, K order
            out.append(mm("mm", 16, bn, 128, split, 4, 3, **ktma))
    if m == 64:
        out.append(mm("mm", 64, 32, 128, 4, 4, 3, magic=True))
        out.append(mm("mm", 64, 64, 128, 4, 4, 3, magic=True, pipelined=True))
        out.append(mm("mm", 64, 128, 128, 1, 4, 3, magic=True, pipelined=True))
        for bn, split in [(32, 4), (64, 4), (128, 1), (128, 2)]:
            out.append(mm("mm", 64, bn, 128, split, 4, 3, pipelined=True, asm=True))
        for bn, split in [(64, 4), (64, 8), (128, 2), (128, 4)]:
            out.append(mm("mm", 64, bn, 128, split, 4, 3, swap=True, pipelined=True, asm=True))
        for bn, split, stages in [(64, 1, 3), (64, 2, 3), (64, 4, 3), (64, 4, 4), (128, 1, 3),
                                  (128, 2, 3), (128, 1, 4)]:  # fmt: skip
            out.append(mm("mm", 64, bn, 128, split, 4, stages, **tma))
        for bn, bk, split, warps, stages in [(64, 128, 4, 4, 3), (128, 128, 1, 4, 3),
                                             (128, 128, 2, 4, 3), (128, 64, 2, 4, 4),
                                             (256, 64, 1, 8, 3), (256, 128, 1, 8, 2)]:  # fmt: skip
            out.append(mm("mm", 64, bn, bk, split, warps, stages, **ktma))
    if m >= 64:
        out.append(Int4GemmConfig("dequant"))
    if m >= 256:
        # (2026-11-29: the pointer-load asm kernel, swapped or not, at 64-128 x 128-256 was
        # 2.2-2.9x slower than dequant; BENCHMARKS.md.) Not swapped, TMA: x feeds the MMA
        # from shared memory, the dequantized tile is stored there in K order.
        for bm, bn, bk, warps, stages, split in [
            (128, 128, 128, 8, 3, 1),
            (128, 128, 64, 8, 4, 1),
            (128, 256, 64, 8, 3, 1),
            (128, 256, 128, 8, 2, 1),
            (256, 128, 64, 8, 3, 1),
            (256, 128, 128, 8, 2, 1),
            (128, 128, 128, 4, 3, 1),
            (64, 128, 128, 4, 4, 1),
            (64, 256, 64, 4, 4, 1),
            (128, 128, 128, 8, 3, 2),
            (128, 256, 64, 8, 3, 2),
            (256, 128, 64, 8, 3, 2),
        ]:
            out.append(mm("mm", bm, bn, bk, split, warps, stages, **ktma))
        # the Gluon kernel (kernels/int4_wgmma.py): (block_m, block_n, warps, stages)
        for bm, bn, warps, stages in [(256, 128, 8, 4), (128, 256, 8, 4), (128, 128, 8, 6)]:
            out.append(mm("wgmma", bm, bn, 64, 1, warps, stages))
    return out


def _compile_worker(jobs: list[tuple[int, Int4GemmConfig]]) -> int:
    """Run each (M, config) once on every shape so Triton's disk cache holds its kernels."""
    weights = {(k, n): random_int4(n, k) for k, n in SHAPES}
    done = 0
    for m, cfg in jobs:
        for (k, _n), weight in weights.items():
            try:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                int4_gemm(x, weight, config=cfg)
                done += 1
            except Exception as exc:  # reported again, with its config, by the timed run
                print(f"  precompile failed {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
    torch.cuda.synchronize()
    return done


def precompile(rows: list[int], num_workers: int) -> None:
    """Compile every sweep candidate in parallel processes (Triton compiles on one core);
    one process per (M, config), so no kernel is compiled twice."""
    import multiprocessing as mp

    jobs = [(m, cfg) for m in rows for cfg in candidates(m)]
    chunks = [jobs[i::num_workers] for i in range(num_workers)]
    with mp.get_context("spawn").Pool(num_workers) as pool:
        done = sum(pool.map(_compile_worker, chunks))
    print(f"precompiled {done} launches of {len(jobs)} configs in {num_workers} processes")


def sweep(
    peers: Peers, m: int, x: torch.Tensor, log
) -> tuple[Int4GemmConfig, float, list[tuple[float, Int4GemmConfig]]]:
    """Time and check every candidate; returns the best and all timings, fastest first."""
    results = []
    for cfg in candidates(m):
        try:
            t = peers.time_ours(x, cfg)
            err = peers.check(x, cfg)  # after the replays: the split-K workspace is clean
        except Exception as exc:  # a config that fails to compile is skipped, and said so
            print(f"  failed {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        log.write(f"{peers.k} {peers.n} {m} {t:.2f} {err:.1e} {cfg}\n")
        log.flush()
        if not err < 1e-2:
            print(f"  WRONG {cfg}: relative error {err:.2e}")
            continue
        results.append((t, cfg))
    results.sort(key=lambda r: r[0])
    assert results, f"no candidate ran for K={peers.k} N={peers.n} M={m}"
    return results[0][1], results[0][0], results


def model_memory_and_decode() -> None:
    """INT4 Llama-3-8B-shaped weights: memory, and one decode step's linear layers."""
    hidden, inter, vocab, num_layers = 4096, 14336, 128256, 32
    shapes = [(hidden, 6144), (hidden, hidden), (hidden, 2 * inter), (inter, hidden)]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    layers = [[engine_int4(n, k) for k, n in shapes] for _ in range(num_layers)]
    embed = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16)  # noqa: F841 (held)
    lm_head = engine_int4(vocab, hidden)
    int4_bytes = torch.cuda.memory_allocated() - base
    print(
        f"\nINT4 (g{GROUP}) Llama-3-8B-shaped weights: {int4_bytes / 1e9:.2f} GB "
        "(bf16 embedding, INT4 lm_head); bf16 would be "
        f"{(num_layers * sum(k * n for k, n in shapes) + 2 * vocab * hidden) * 2 / 1e9:.2f} GB"
    )
    bf16_layers = [
        [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for k, n in shapes]
        for _ in range(num_layers)
    ]
    bf16_head = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16)
    for batch in (1, 32):
        xs = {k: torch.randn(batch, k, device="cuda", dtype=torch.bfloat16) for k, _ in shapes}

        def step_int4(_, xs=xs):
            for layer in layers:
                for (k, _n), w in zip(shapes, layer, strict=True):
                    int4_gemm(xs[k], w)
            int4_gemm(xs[hidden], lm_head)

        def step_bf16(_, xs=xs):
            for layer in bf16_layers:
                for (k, _n), w in zip(shapes, layer, strict=True):
                    F.linear(xs[k], w)
            F.linear(xs[hidden], bf16_head)

        t_int4 = graph_time_us(step_int4, 1, 10)
        t_bf16 = graph_time_us(step_bf16, 1, 10)
        print(
            f"decode step linears, batch {batch}: int4 {t_int4:.0f} us "
            f"({batch / t_int4 * 1e6:.0f} tok/s), bf16 {t_bf16:.0f} us "
            f"({batch / t_bf16 * 1e6:.0f} tok/s): {t_bf16 / t_int4:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="time candidate configs")
    parser.add_argument("--no-model", action="store_true", help="skip the 8B-model section")
    parser.add_argument("--rows", default="1,16,64,256,1024", help="M values")
    parser.add_argument("--out", default=".", help="folder for the sweep log")
    parser.add_argument("--workers", type=int, default=12, help="--sweep compile processes")
    parser.add_argument(
        "--previous-order", action="store_true", help="narrow weights in canonical order"
    )
    parser.add_argument(
        "--untiled", action="store_true", help="fragment-ordered words without tile order"
    )
    args = parser.parse_args()
    global PREVIOUS_ORDER, UNTILED
    PREVIOUS_ORDER, UNTILED = args.previous_order, args.untiled
    torch.manual_seed(0)
    print(
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"triton {__import__('triton').__version__}"
    )
    row_values = [int(r) for r in args.rows.split(",")]
    log = open(Path(args.out) / "sweep.txt", "w") if args.sweep else None
    if args.sweep and args.workers > 1:
        precompile(row_values, args.workers)
    rows = []
    for k, n in SHAPES:
        peers = Peers(k, n, with_torch=not args.sweep, engine_order=not args.sweep)
        if not args.sweep:
            mb = peers.int4[0].num_bytes / 1e6
            t_read = peers.time_read_floor()
            print(f"K={k} N={n}: reading the {mb:.1f} MB INT4 weight (torch.sum) {t_read:.1f} us")
        for m in row_values:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            t_bf16 = peers.time_bf16(x)
            t_torch = peers.time_torch_int4(x)
            if args.sweep:
                cfg, t_ours, results = sweep(peers, m, x, log)
                top = "; ".join(f"{t:.1f} {c}" for t, c in results[:3])
                print(f"K={k} N={n} M={m}: bf16 {t_bf16:.1f} us, top 3: {top}", flush=True)
            else:
                err = peers.check(x, None)
                if not err < 1e-2:
                    raise SystemExit(f"wrong result K={k} N={n} M={m}: rel. error {err:.2e}")
                t_ours = peers.time_ours(x, None)
            rows.append((k, n, m, t_bf16, t_torch, t_ours))
        del peers
        torch.cuda.empty_cache()
    print(
        "\n| K x N | M | bf16 F.linear (us) | torch int4 (us) | tidal int4 (us) "
        "| tidal vs bf16 | torch int4 vs bf16 |"
    )
    print("|---|---|---|---|---|---|---|")
    for k, n, m, t_bf16, t_torch, t_ours in rows:
        print(
            f"| {k} x {n} | {m} | {t_bf16:.1f} | {t_torch:.1f} | {t_ours:.1f} | "
            f"{t_bf16 / t_ours:.2f}x | {t_bf16 / t_torch:.2f}x |"
        )
    if not args.no_model:
        model_memory_and_decode()


if __name__ == "__main__":
    main()
