"""Launch settings for ``kernels.int4_gemm``: one fixed table per shape bucket.

No autotuning at run time: a config depends only on (M bucket, N, K, group size), so the
same launch is replayed inside a CUDA graph. The table was
chosen from the sweep in ``benchmarks/bench_int4_gemm.py --sweep`` on an H200 (see
BENCHMARKS.md, "INT4 GEMM").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

STRATEGIES = ("gemv", "tiled", "mm", "dequant", "wgmma", "mma")


# Ring slots ``thread_release`` can name: the swapped kernel gives each slot a named barrier
# (PTX ``bar``, ids 0-15) from the last ones, which Triton leaves free (``int4_wgmma``'s
# ``_EMPTY_BARS``).
THREAD_RELEASE_SLOTS = 6


@dataclass(frozen=True)
class Int4GemmConfig:
    """How to run one INT4 GEMM.

    strategy: ``gemv`` (M small, reduction in registers, ``block_k`` K values per loop step
    across quantization groups), ``tiled`` (``tl.dot`` on raw codes, scale and offset per
    group tile; ``block_k`` capped at the group size), ``mm`` (large M: each weight tile
    dequantized in registers, one accumulating ``tl.dot`` chain), ``dequant`` (dequantize,
    then cuBLAS) or ``wgmma`` (sm_90+, 16-bit x, K tiles within a group: the Gluon kernels of
    ``kernels.int4_wgmma``, which decode a tile while the tensor cores multiply the previous
    one; with ``swap`` the small-M form, the weight tile decoded into wgmma's register operand
    and ``block_m`` being wgmma's N (8 .. 256), split-K allowed; elsewhere
    ``wgmma_fallback``). ``split_k`` > 1 splits K across programs and reduces with fp32
    atomics.
    ``nibble`` (tiled): multiply each nibble position of the packed words by the matching
    slice of x (read as int32 pairs for 16-bit x) with codes as 16-bit floats by the
    magic-number trick, instead of unpacking to K order.
    ``mm`` only: ``magic`` decodes each nibble plane in place by the magic-number trick (no
    integer-to-float conversions) before interleaving to K order; ``swap`` computes
    ``(W x^T)^T``, the dequantized tile being the left ``tl.dot`` operand (registers);
    ``pipelined`` streams the packed words with ``tl.range(num_stages)`` instead of a
    one-tile register prefetch; ``asm`` (fp16/bf16 x on CUDA, else ignored) dequantizes by
    inline PTX, two weights per LOP3 / HADD2 / HFMA2 (x read in the matching K order);
    ``tma`` (with ``swap`` and ``asm``, sm_90+, tiles of one whole group) fetches the x and
    weight tiles with the TMA engine (tensor descriptors) instead of per-thread loads.
    ``gemv`` only: ``fold`` (16-bit x) reads each code as a biased fp32 in one AND-OR and
    takes the biases off once per sub-group (an AND-OR and an FMA per weight plus four shifts
    per word of eight codes; no subtraction), in inline PTX with ``asm`` on CUDA (each word's
    shifted copies then stay inside its block of PTX instead of all being live at once);
    ``prefetch`` loads the next step's words before this step's math; ``pdl`` (sm_90+)
    launches as a programmatic dependent, so the launch overlaps the previous kernel's tail
    (it reads nothing before that kernel has finished); ``l2_prefetch`` (with ``pdl``, where
    the weight's rows are 16-byte aligned) prefetches the program's words, scales and
    offsets into L2 before it waits, so the DRAM reads overlap the previous kernel too.
    ``wgmma`` with ``swap`` only: ``specialized`` moves the TMA refills to a producer warp
    (warp specialization; the decoding warps hand ring slots back through empty barriers);
    ``pipe`` keeps two wgmmas in flight (the next K tile's issued before this one's is waited
    for; 3 or more stages); ``pdl`` launches it as a programmatic dependent that lets the next
    launch start on entry (``int4_wgmma_swap``'s form 1; not in the table, BENCHMARKS.md);
    with ``weights_first`` as well (not ``specialized``) it lets the next launch start once
    every program is past its main loop and copies its ring's first weight tiles before it
    waits on the previous kernel, x's after (form 3); ``vector_store`` passes the accumulator
    through shared memory so that each thread stores 8 consecutive outputs (and 8 floats of a
    split-K slot) at once, where the wgmma layout stores 2 bytes at a time; ``thread_release``
    (with ``specialized``) hands ring slots back to the producer warp through named barriers
    that each decoding warp arrives on once past its own wait, instead of a barrier of all of
    them and one arrival; ``early_ticket`` (split-K) takes a tile's ticket before the
    split's slot store, and the last split keeps its partial in registers (every split form of
    the table since the fortieth session, ``_narrow_swap``); ``wsplit`` (not
    ``specialized``, ``num_warps`` 4, no ``maxnreg``) adds a second warpgroup that takes the
    later half of each program's K tiles on a ring of its own (``num_stages`` more slots) and
    hands its sum to the first through shared memory once both are done.
    ``mma`` (sm_80+, 16-bit x, fragment-ordered words, groups of a multiple of 128: the register
    mma kernel of ``kernels.int4_mma``): ``block_m`` x rows per program, ``block_n`` weight
    rows per program: ``num_warps`` warps of 16, 32 or 64 rows each (``row_tiles`` of 16), or
    with ``wsplit`` the same ``block_n`` rows over ``num_warps`` K ranges summed in shared
    memory, and with ``x_smem`` as well each warp copying its tiles of x into shared memory
    for ``ldmatrix`` (two tiles in its ring), or with ``row_warps`` > 1 each K range held by
    that many warps over different rows that share its copies (``block_n`` is then their
    rows together, ``block_m`` at least twice ``row_warps``); ``maxnreg`` (also for
    ``wgmma`` with ``swap``) caps the registers per thread (ptxas's schedule changes with it:
    0.5-0.8 us per call of the mma kernel at M <= 8 on the H200); ``scaled`` (with
    ``x_smem``) decodes the weights with their scales and offsets applied, rounded once to x's
    dtype, instead of a second mma on ones for x's group sums; ``num_stages`` K tiles of
    words loaded ahead (1 or 2); ``split_k`` and ``pdl`` as elsewhere; ``weights_first``
    (with ``pdl``) issues those tiles of words and scales before it waits on the previous
    kernel, and reads x only after (weights are read-only: ``kernels.pdl``); ``s_ahead``
    (where the scales apply after every K tile and the decode does not apply them) loads
    each tile's scales and offsets with its words, a tile ahead, instead of after its
    products; ``w_ring`` (with ``x_smem``) copies the words into a shared ring beside x's
    tiles, ``num_stages`` (1-3) tiles ahead in a ring of ``num_stages`` + 1 slots, instead of
    loading them into registers; where it does not apply, the swapped wgmma kernel runs
    instead.
    """

    strategy: str
    block_m: int = 16
    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    nibble: bool = False
    magic: bool = False
    swap: bool = False
    pipelined: bool = False
    asm: bool = False
    tma: bool = False
    fold: bool = False
    prefetch: bool = False
    pdl: bool = False
    l2_prefetch: bool = False
    specialized: bool = False
    pipe: bool = False
    wsplit: bool = False
    x_smem: bool = False
    row_warps: int = 1
    maxnreg: int | None = None
    scaled: bool = False
    weights_first: bool = False
    s_ahead: bool = False
    w_ring: bool = False
    vector_store: bool = False
    thread_release: bool = False
    early_ticket: bool = False

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        for name, least in (("block_m", 8), ("block_n", 4), ("block_k", 8)):
            v = getattr(self, name)
            if v < least or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= {least}, got {v}")
        if self.split_k < 1:
            raise ValueError(f"split_k must be >= 1, got {self.split_k}")
        for name in ("specialized", "pipe", "vector_store", "early_ticket"):
            if getattr(self, name) and not (self.strategy == "wgmma" and self.swap):
                raise ValueError(f"{name} applies to the wgmma strategy with swap=True only")
        if self.thread_release and not (
            self.strategy == "wgmma"
            and self.swap
            and self.specialized
            and self.num_stages <= THREAD_RELEASE_SLOTS
        ):
            raise ValueError(
                "thread_release applies to the wgmma strategy with swap=True, specialized=True "
                f"and num_stages <= {THREAD_RELEASE_SLOTS} (a named barrier a slot)"
            )
        swap_plain = self.strategy == "wgmma" and self.swap and not self.specialized
        if self.wsplit and not (
            self.strategy == "mma" or (swap_plain and self.num_warps == 4 and not self.maxnreg)
        ):
            raise ValueError(
                "wsplit applies to the mma strategy, and to the wgmma strategy with swap=True, "
                "specialized=False, num_warps=4 and no maxnreg"
            )
        if self.x_smem and not (self.wsplit and self.strategy == "mma"):
            raise ValueError("x_smem applies to the mma strategy with wsplit=True only")
        if self.scaled and not self.x_smem:
            raise ValueError("scaled applies to the mma strategy with x_smem=True only")
        if self.row_warps != 1 and not (
            self.x_smem
            and self.row_warps in (2, 4, 8)
            and self.num_warps % self.row_warps == 0
            and 2 * self.row_warps <= self.block_m
        ):
            raise ValueError(
                "row_warps > 1 (2, 4 or 8, dividing num_warps, at most block_m // 2) applies "
                f"to the mma strategy with x_smem=True only, got {self.row_warps}"
            )
        if self.maxnreg is not None and not (
            (self.strategy == "mma" or (self.strategy == "wgmma" and self.swap))
            and self.maxnreg >= 24
        ):
            raise ValueError(
                "maxnreg (>= 24) applies to the mma strategy and the wgmma strategy with "
                f"swap=True, got {self.maxnreg}"
            )
        if self.strategy == "mma" and self.num_stages not in ((1, 2, 3) if self.w_ring else (1, 2)):
            raise ValueError(
                "the mma strategy loads 1 or 2 tiles ahead (1-3 with w_ring), got "
                f"{self.num_stages}"
            )
        if self.strategy == "mma" and (
            self.block_n % self._warp_share or self.row_tiles not in (1, 2, 4)
        ):
            raise ValueError(
                "the mma strategy gives each warp 16, 32 or 64 weight rows: block_n must be "
                f"that{'' if self.wsplit else ' times num_warps'}, got {self.block_n}"
            )
        if self.weights_first and not ((self.strategy == "mma" or swap_plain) and self.pdl):
            raise ValueError(
                "weights_first applies to the mma strategy and the wgmma strategy with "
                "swap=True, specialized=False, and with pdl=True only"
            )
        if self.s_ahead and (self.strategy != "mma" or self.scaled):
            raise ValueError("s_ahead applies to the mma strategy without scaled only")
        if self.w_ring and not self.x_smem:
            raise ValueError("w_ring applies to the mma strategy with x_smem=True only")
        if self.l2_prefetch and not (self.strategy == "gemv" and self.pdl):
            raise ValueError("l2_prefetch applies to the gemv strategy with pdl=True only")
        if self.pipe and self.num_stages < 3:
            raise ValueError(f"pipe needs num_stages >= 3, got {self.num_stages}")

    @property
    def _warp_share(self) -> int:
        """``mma``: the weight rows of a program per 16-row tile of one warp (16 per row warp
        with ``wsplit``, whose K ranges all hold the program's rows; else 16 per warp)."""
        return 16 * self.row_warps if self.wsplit else 16 * self.num_warps

    @property
    def row_tiles(self) -> int:
        """``mma``: the 16-row tiles each warp holds (``int4_mma``'s ``row_tiles``)."""
        return self.block_n // self._warp_share


# Where the wgmma kernel does not apply: the unswapped TMA mm kernel of the same bucket.
WGMMA_FALLBACK = Int4GemmConfig(
    "mm", 128, 128, 64, 1, 8, 4, magic=True, pipelined=True, asm=True, tma=True
)


def wgmma_fallback(cfg: Int4GemmConfig) -> Int4GemmConfig:
    """The Triton ``mm`` config that runs where a ``wgmma`` config does not apply (group 32,
    fp32 x, pre-sm_90, no Gluon): for the swapped (small-M) form, the swapped TMA mm kernel
    with the same rows, K tile and split; else ``WGMMA_FALLBACK``."""
    if not cfg.swap:
        return WGMMA_FALLBACK
    return Int4GemmConfig(
        "mm", max(16, cfg.block_m), 64, cfg.block_k, cfg.split_k, 4, 3, swap=True, magic=True,
        pipelined=True, asm=True, tma=True,
    )  # fmt: skip


# Programs of the swapped kernel's 128-row x tiles that run at once, one per multiprocessor of
# the H200 the table was fitted on (their 4-stage ring fills its shared memory).
_ONE_WAVE = 132


def _pow2_split(target: int, k: int, block_k: int, cap: int) -> int:
    """The smallest power of two >= target, capped, keeping >= block_k of K per split."""
    split = 1
    while split < target and split < cap and k // (2 * split) >= block_k:
        split *= 2
    return split


# Above M = 256: the swapped kernel in two tilings or dequantize + cuBLAS, whichever a cost
# model fitted on the H200 (eighth session of 2026-11-30, ``bench_int4_wgmma.py --swap --pipe
# --rows 384,...,4096``; BENCHMARKS.md, "INT4 GEMM") puts first. A tiling's time is its waves
# (programs over those that run at once) times one program's time, linear in K; dequantize +
# cuBLAS is a fixed cost, the products at 760 TFLOP/s and 2.5 bytes per weight at 3.3 TB/s.
# Over 28 measured (shape, M) points the model's pick was within 4% of the fastest of the three.
# The tilings: x tiles of 128 rows by 64 weight rows, two programs per multiprocessor (in
# fragment order, a shorter decode, with two wgmmas in flight); 256 by 128, warp-specialized,
# two wgmmas in flight, one program per multiprocessor; and since the twenty-seventh session
# ``_NARROW_256`` (256 by 64, as at 128 < M <= 256 on qkv), half the products per program of
# 256 by 128 at about half the time (one wave of it took 24-28 us at K = 4096 and 84-85 at
# K = 14336, ``bench_int4_large.py``, M = 256-2048), whose finer grid fills the waves where
# 256 by 128 leaves them part empty. Where both fill them alike (twice the waves of half the
# cost) 256 by 128 is kept: it was 2-8% faster there (x's tile serves twice the weight rows).
# All these tilings store 16 bytes at a time (``vector_store``): 0.5-7% faster above M = 128,
# but for 1.5% slower on 14336 x 4096 at M = 512 (BENCHMARKS.md, twenty-seventh session).
# 256 by 128 hands its ring slots back through named barriers, one arrival per warp
# (``thread_release``), so its two warpgroups no longer sync for that every K tile: on an
# H100 (thirty-eighth session, ``bench_int4_swap_option.py --option thread_release --rounds
# 5``, medians, two processes) B / A was 0.950-0.999 at M = 192-2048 on the four shapes,
# bitwise the same output. On the one-warpgroup tilings (256 by 64, 128 by 64) it was within
# 2% either way, so they keep the empty mbarriers.
_LARGE_PLAIN = Int4GemmConfig("wgmma", 128, 64, 128, 1, 4, 3, swap=True, vector_store=True)
_LARGE_PLAIN_FRAG = Int4GemmConfig(
    "wgmma", 128, 64, 128, 1, 4, 3, swap=True, pipe=True, vector_store=True
)
_LARGE_WIDE = Int4GemmConfig(
    "wgmma", 256, 128, 128, 1, 8, 3, swap=True, specialized=True, pipe=True, vector_store=True,
    thread_release=True,
)  # fmt: skip


def _plain_128x64(frag: bool) -> Int4GemmConfig:
    """x tiles of 128 rows by 64 weight rows, a 3-stage ring, two programs per multiprocessor,
    not warp-specialized: ``_LARGE_PLAIN``, or ``_LARGE_PLAIN_FRAG`` (two wgmmas in flight) on
    fragment-ordered words. Above M = 256 one of ``_large_config``'s forms; on wide weights at
    64 < M <= 128 too (seventh session of 2026-11-30: 60.0 / 60.6 us on 4096 x 28672 at M = 128
    against 73.0 / 64.5 for the previous warp-specialized tilings, canonical / fragment order),
    where since the thirty-third session fragment order keeps two wgmmas in flight as above M =
    256 (BENCHMARKS.md, "INT4 GEMM", thirty-third session)."""
    return _LARGE_PLAIN_FRAG if frag else _LARGE_PLAIN


# Narrow weights whose 128-row x tiles overflow one wave at 128 < M <= 256 (qkv-sized):
# 256 x 64, one program per multiprocessor.
_NARROW_256 = Int4GemmConfig(
    "wgmma", 256, 64, 128, 1, 4, 3, swap=True, specialized=True, pipe=True, vector_store=True
)

# o_proj-sized weights (two 64-row x tiles fill 96-132 programs) at 64 < M <= 128 on
# fragment-ordered words: 64 x 64, unsplit, warp-specialized, two wgmmas in flight, a ring of 6.
# On the H200 (thirty-fifth session, ``bench_int4_gemm.py`` A/B; BENCHMARKS.md, "INT4 GEMM")
# 4096 x 4096 at M = 104 / 112 / 120 / 128 took 13.7, 13.6 / 13.6, 13.6 / 13.7, 13.6 / 13.6,
# 13.7 against 15.3, 15.1 / 15.2, 15.3 / 15.2, 15.3 / 15.5, 15.7 us (128 x 64 split 2). With
# more rows past M in the second tile (M = 65-96, 32-63 past) its zero fill made it as slow
# or slower (M = 65: 22.7, 20.4 against 17.2, 17.0), so there x is padded to 128 rows from
# 32 rows past M (``pad_rows``; thirty-sixth session, on an H100: M = 65 / 72 / 80 / 88 / 96
# took 14.7, 15.0 / 14.6, 14.6 / 14.6, 14.6 / 14.6, 14.6 / 14.6, 14.6 against 17.2, 17.2 /
# 17.1, 16.8 / 16.8, 16.9 / 17.4, 17.7 / 16.7, 17.0 us). On down_proj (K = 14336) 64-row
# tiles were 19-96% slower. Its ring slots go back through named barriers (``thread_release``,
# as ``_LARGE_WIDE``'s): on an H100 (thirty-eighth session, medians of 5) M = 96 / 128 took
# 14.4 / 13.0 against 14.9 / 13.5 us, and M = 128 in a second process 12.9 against 13.4.
_NARROW_2X64 = Int4GemmConfig(
    "wgmma", 64, 64, 128, 1, 4, 6, swap=True, specialized=True, pipe=True, vector_store=True,
    thread_release=True,
)  # fmt: skip


def _wide_swap(m: int, frag: bool) -> Int4GemmConfig:
    """Wide weights (N > 8192) for M <= 256 on the swapped wgmma kernel, unsplit, K tiles of
    128: 128 weight rows and wgmma's N the smallest power of two >= M up to M = 64, one
    warpgroup (4 warps), ``_plain_128x64`` up to 128, then ``_LARGE_WIDE``: x tiles of 256 rows
    (half of them zeros at M = 129-255), warp-specialized (a producer warp issues the TMA
    refills), two wgmmas in flight.

    At M = 33-64 in fragment order the one warpgroup keeps two wgmmas in flight (``pipe``),
    where until the twenty-eighth session two warpgroups of 64 weight rows each ran the plain
    loop. Each thread then decodes 16 words per K tile instead of 8, so the loop's fixed
    work (ring barriers, TMA issue, the wgmma chain) is spread over twice the weights: 383
    instructions per K tile for 128 weights a thread against 258 for 64, and every decode
    instruction beside a wgmma in flight, where the plain loop runs none so (offline sm_90
    SASS, ``benchmarks/sass_int4_swap.py --overlap``). On an H100 (the device tool lent no
    H200 that session; ``bench_int4_swap_grid.py --shapes 4096x28672 --rows 40,48,56,64
    --block-n 128 --warps 4,8 --stages 4 --splits 1``, twice in one process) 4096 x 28672
    took 36.1-37.0 us at M = 40-64 against 37.8-38.6 for the two-warpgroup form; 4 warps
    without ``pipe`` were slower (40.7-41.1 at M = 48-64), and at M = 32 ``pipe`` was slower
    (30.2 against 29.3).

    Up to M = 64 the kernel is launched as a programmatic dependent that copies its ring's
    first weight tiles before it waits (``weights_first``, form 3 of ``int4_wgmma_swap``). In
    the engine the kernel before it is an ``rms_norm`` of a few programs, and an 8B-shaped
    decode step took 24 / 37 us less GPU time at batch 1 / 32 (seventeenth session). Timed
    back to back with itself (``bench_int4_gemm.py``, where its early programs share the
    multiprocessors with a running GEMM) it was 0.4-0.8 us slower per call in the sixteenth
    session and within that benchmark's spread in the seventeenth (24.1 against 23.8 us at
    M = 1, 25.4 against 26.2 at M = 16)."""
    if m > 128:
        return _LARGE_WIDE
    if m > 64:
        return _plain_128x64(frag)
    rows = max(8, 1 << (m - 1).bit_length())
    return Int4GemmConfig(
        "wgmma", rows, 128, 128, 1, 4, 4, swap=True, pdl=True, weights_first=True,
        vector_store=m > 16, pipe=frag and rows >= 64,
    )  # fmt: skip


def _narrow_swap(m: int, n: int, k: int, *, frag: bool) -> Int4GemmConfig:
    """Weights with N <= 8192 (qkv, o_proj, down_proj) for 2 <= M <= 256 on the swapped wgmma
    kernel: 64 weight rows, K tiles of 128, 4 warps, split-K reduced in slots. From the H200
    sweep of 2026-11-30, seventh session (BENCHMARKS.md, "INT4 GEMM"): 4 splits up to M = 16;
    above, the fewest that give >= 96 programs (until the thirtieth session doubled for long K,
    >= 8192, up to M = 64: see the second warpgroup below); above M = 64, x tiles of 128 rows,
    warp-specialized with 4 stages while the programs fit in one wave (one per multiprocessor),
    else plain with 3 (two per multiprocessor); the warp-specialized tiling keeps two wgmmas in
    flight above M = 128 (eighth session). From M = 33 to 64 (but not in the second warpgroup's
    form) registers are capped at 200 per thread, under which ptxas schedules the loop
    differently: 4096 x 6144 at M = 64 took 14.5 against 15.9 us, the other narrow weights 0-2%
    less (fourteenth session, ``bench_int4_maxnreg.py``). Above M = 128, where the 128-row x
    tiles alone (unsplit) make more programs than one wave but tiles of 256 rows would not
    (qkv-sized weights), x tiles of 256 rows, warp-specialized, two wgmmas in flight: 4096 x
    6144 at M = 160 / 256 took 43.2 / 27.1 against 51.8 / 30.9 us, and 29.0 at M = 160 once x
    was padded to the whole tile (``pad_rows``; fifteenth session, BENCHMARKS.md, "INT4 GEMM").
    Since the twenty-sixth session, weights with K < 8192 at M = 17-64 issue their first tiles
    of the weight before they wait on the previous kernel (``weights_first``) and keep 6 tiles
    in the ring where one wave holds the programs: 4096 x 6144 at M = 32 / 48 / 64 took 11.7 /
    13.8-13.9 / 13.7-13.8 against 12.3-12.4 / 14.0-14.2 / 14.2-14.5 us, 4096 x 4096 at M = 40 /
    48 / 64 10.8-10.9 / 10.8-11.0 / 11.2-11.3 against 11.3-11.6 / 11.2-11.4 / 11.7-11.8, in four
    A/B pairs of ``bench_int4_gemm.py`` over two device calls (BENCHMARKS.md, "INT4 GEMM",
    twenty-sixth session); on down_proj (K = 14336, 256 programs at M = 64: with 6 stages one
    per multiprocessor, two waves) the same form took 25.5-30.4 against 19.9-24.2, so it keeps
    the form above.

    Since the thirtieth session, at M = 17-64 where one split already makes >= 96 programs
    (qkv-sized weights; not at M = 33-47) or K is long (down_proj, then 2 splits), a second
    warpgroup runs the later half of each program's K tiles (``wsplit``: two rings of 4,
    two wgmmas in flight in each above M = 32, the weight first, no register cap). On an H100
    (no H200 was lent), in two A/B pairs of ``bench_int4_gemm.py`` against the previous table
    (``with_int4_table.py``, BENCHMARKS.md, "INT4 GEMM", thirtieth session), old / new us:
    4096 x 6144 at M = 32 11.5, 11.5 / 11.5, 11.2; M = 48 13.7, 13.7 / 13.4, 13.2; M = 64
    13.7, 13.3 / 12.9, 12.7; 14336 x 4096 at M = 32 19.3, 18.9 / 18.7, 18.7; M = 47 22.8,
    22.9 / 22.0, 22.0; M = 64 23.7, 23.2 / 22.0, 22.6; at M = 17-24 within 0.3 us either way.
    At M = 33 / 40 the qkv-sized form was slower (18.5 against 16.4 at M = 33), and neither
    o_proj-sized nor wide weights gained in ``bench_int4_swap_grid.py --wsplit 0,1``. Since
    the thirty-first session long K at M = 9-16 too, with 2 splits (in fragment order instead
    of the mma kernel, ``_mma_config``): 14336 x 4096 at M = 12 / 16 took 16.7, 16.4 / 16.7,
    16.4 against 17.4, 17.3 / 17.4, 17.5 us (mma), at M = 9 16.6, 16.4 against 16.7, 16.4,
    on an H100 in two A/B pairs (BENCHMARKS.md, "INT4 GEMM", thirty-first session). Canonical
    words take the same rule, timed only in fragment order.

    The warp-specialized 128-row tiling keeps two wgmmas in flight above M = 128 in either
    word order (eighth session), and since the thirty-third session from M = 65 on
    fragment-ordered words (``frag``; BENCHMARKS.md, "INT4 GEMM", thirty-third session).
    Since the thirty-fifth session, o_proj-sized weights in fragment order at 104 <= M <= 128
    run two 64-row x tiles unsplit instead (``_NARROW_2X64``; its comment gives the figures),
    and since the thirty-sixth at every 64 < M <= 128, x padded by ``pad_rows``.

    Since the fortieth session every split form takes the tile's ticket before its slot
    store (``early_ticket``: the last split adds its partial from registers). On an H100 in
    ``bench_int4_swap_option.py --option early_ticket`` (two and four A/B rounds; no H200 was
    lent), table / with it, us: 4096 x 4096 at M = 48 / 64 10.6 / 10.0, 11.0 / 10.7 and
    10.9 / 10.7; 14336 x 4096 at M = 48 / 64 / 96 / 128 21.5 / 21.1, 22.3 / 21.8 and 22.0 /
    21.5, 35.3 / 33.8, 32.6 / 31.0 and 31.8 / 30.4; at M = 16 16.8 / 16.8 and 16.4 / 16.5
    (BENCHMARKS.md, "INT4 GEMM", fortieth session). Outputs are bitwise the same."""
    rows = 128 if m > 64 else max(8, 1 << (m - 1).bit_length())
    tiles = -(-m // rows) * -(-n // 64)
    # wsplit: a second warpgroup over the later half of each program's K tiles instead of more
    # splits, where K is long from M = 9 (M <= 8 stays on the mma kernel in fragment order)
    # and at M = 17-64 where one split fills the grid
    if m <= 16:
        wsplit = m > 8 and k >= 8192
        target = 2 if wsplit else 4
    else:
        target = 1
        while tiles * target < 96:
            target *= 2
        wsplit = m <= 64 and (k >= 8192 or (target == 1 and not 32 < m < 48))
    split = _pow2_split(target, k, 128, 16)
    if frag and 64 < m <= 128 and k < 8192 and 96 <= 2 * tiles <= _ONE_WAVE:
        # o_proj-sized: two 64-row x tiles, unsplit, rather than one of 128 split in two
        return _NARROW_2X64
    if m > 128 and tiles > _ONE_WAVE and -(-n // 64) <= _ONE_WAVE:
        return _NARROW_256
    if m > 64 and tiles * split > _ONE_WAVE:
        return Int4GemmConfig(
            "wgmma", rows, 64, 128, split, 4, 3, swap=True, vector_store=True,
            early_ticket=split > 1,
        )  # fmt: skip
    if wsplit:  # two rings of 4, above M = 32 two wgmmas in flight in each, no register cap
        return Int4GemmConfig(
            "wgmma", rows, 64, 128, split, 4, 4, swap=True, pipe=m > 32, wsplit=True, pdl=True,
            weights_first=True, vector_store=split > 1, early_ticket=split > 1,
        )  # fmt: skip
    cap = 200 if 32 < m <= 64 else None
    # qkv- and o_proj-sized at M <= 64: the weight's first tiles before the wait, and a ring of
    # 6 where one wave of programs holds it (x tiles of 32 rows: three programs per
    # multiprocessor; of 64: one, so at most _ONE_WAVE programs)
    first = m <= 64 and k < 8192
    stages = 6 if first and (rows <= 32 or tiles * split <= _ONE_WAVE) else 4
    # the 16-byte epilogue (slower on unsplit 64-row x tiles: 15.6 against 13.8 us, qkv M = 64)
    vector = m > 16 and not (split == 1 and rows <= 64)
    return Int4GemmConfig(
        "wgmma", rows, 64, 128, split, 4, stages, swap=True, specialized=m > 64,
        pipe=m > 128 or (frag and m > 64), maxnreg=cap, pdl=first, weights_first=first,
        vector_store=vector, early_ticket=split > 1,
    )  # fmt: skip


def _form_cost(cfg: Int4GemmConfig, m: int, n: int, k: int) -> float | None:
    """The cost model's time (us) of ``cfg`` on M rows of an N x K weight: dequantize +
    cuBLAS, or the unsplit swapped tilings' waves (programs over those that run at once)
    times one program's time, linear in K; None for forms it does not model. The 128 x 64
    warp-specialized tiling (one per multiprocessor, 4 stages: o_proj- and down_proj-sized
    weights at 128 < M <= 256) was fitted on its M = 256 times (16.3 / 49.2 us at K = 4096 /
    14336, twenty-seventh session) and is not a candidate above M = 256."""
    if cfg.strategy == "dequant":
        return 4.0 + 2 * m * n * k / 760e6 + 2.5 * n * k / 3.3e6
    if not (cfg.strategy == "wgmma" and cfg.swap) or cfg.split_k != 1:
        return None
    per_sm = 1 if cfg.specialized else 2
    programs = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    waves = -(-programs // (per_sm * _ONE_WAVE))
    wide = 2.7 + 0.01231 * k  # a wave of 256 x 128
    per_wave = {
        (128, 64, False): 4.1 + 0.00655 * k,
        (128, 64, True): 3.1 + 0.00321 * k,
        (256, 128, True): wide,
        (256, 64, True): wide / 2,  # half of 256 x 128's products per program
    }.get((cfg.block_m, cfg.block_n, cfg.specialized))
    return None if per_wave is None else waves * per_wave


def _large_config(m: int, n: int, k: int, frag: bool) -> Int4GemmConfig:
    """M > 256: ``_LARGE_PLAIN`` (``_LARGE_PLAIN_FRAG`` for fragment-ordered words: two
    wgmmas in flight were 0-14% faster there and 0-14% slower on canonical words, M = 256-2048
    in the eighth session's sweeps), ``_LARGE_WIDE``, ``_NARROW_256`` (ties go to
    ``_LARGE_WIDE``) or dequantize + cuBLAS, by the cost model (``_form_cost``). With
    ``_NARROW_256`` in it, on the H200 in two runs (twenty-seventh session,
    ``bench_int4_large.py``, BENCHMARKS.md): 4096 x 6144 at M = 1024 took 75.8 / 78.1 us
    against 89.7 / 85.7 (dequantize + cuBLAS), 14336 x 4096 at M = 512 84.7 / 83.8 against
    97.8 / 100.2 (128 x 64), 4096 x 4096 at M = 512 26.6 / 26.2 against 29.2 / 29.2, 4096 x
    28672 at M = 512 190.0 / 190.6 against 196.8 / 220.0 (256 x 128); no pick of 44 points
    was slower than the previous model's."""
    plain = _plain_128x64(frag)
    # min keeps the first of equal costs: _LARGE_WIDE before _NARROW_256, whose twice the
    # waves of half the cost is exactly a tie
    forms = (plain, _LARGE_WIDE, Int4GemmConfig("dequant"), _NARROW_256)
    return min(forms, key=lambda cfg: _form_cost(cfg, m, n, k))


# Rows past the last multiple of 256 that ``split_rows`` may leave to a second call.
_SPLIT_REST = 64


@functools.lru_cache(maxsize=8192)  # int4_gemm asks on every eager call above M = 256
def split_rows(
    m: int, n: int, k: int, group_size: int, device: torch.device, frag: bool = False
) -> int:
    """Above M = 256, with 1-64 rows past a multiple of 256: the rows up to that multiple,
    where the cost model (``_form_cost``) puts two calls first (those rows on their config,
    then the rest on theirs, the outputs joined); else 0 (one call). One call pays for the
    few rows past the multiple with a whole wave more, or with dequantize + cuBLAS; the
    second call reads the weight once more, at its small-M time (modelled as 2.5 us, the
    weight's bytes at 3.3 TB/s and 0.2 us per row), and the join copies the output
    (4 bytes per output at 3 TB/s). On the H200 (twenty-seventh session,
    ``bench_int4_row_split.py``) 4096 x 28672 at M = 257 took 128.9 against 176.6 us in one
    call, 14336 x 4096 at M = 257 / 513 63.2 / 105.5 against 98.6 / 122.3."""
    rest = m % 256
    if m <= 256 or not 0 < rest <= _SPLIT_REST:
        return 0
    main = m - rest
    one = _form_cost(choose_config(m, n, k, group_size, device, frag), m, n, k)
    first = _form_cost(choose_config(main, n, k, group_size, device, frag), main, n, k)
    if one is None or first is None:
        return 0
    second = 2.5 + 0.5 * n * k / 3.3e6 + 0.2 * rest
    join = 4 * m * n / 3.0e6
    return main if first + second + join < one else 0


def pad_rows(m: int, cfg: Int4GemmConfig, k: int) -> int:
    """Rows of x to add before the swapped wgmma kernel runs ``cfg``: its x tile is a
    TMA box of ``block_m`` rows, and a box that reaches far past M made the call up to 2.4x
    slower on the H200 (the zero fill of its out-of-bounds rows; fifteenth session,
    ``bench_int4_ragged.py``: 14336 x 4096 at M = 136 121.1 us against 47.5 on x padded to
    256 rows, 51.1 with the copy). So x is copied into a buffer of whole tiles where the last
    tile has at least 48 rows past M (24 for the tilings that are not warp-specialized, two
    programs per multiprocessor; 96 for those with 128 weight rows, twice the products per
    byte of x), which was faster wherever the copy (1.5-3 us below M = 256) was not; at
    fewer rows past M the fill cost less than the copy (4096 x 6144 at M = 96: 19.8 us
    against 21.4 padded). 0 for every other strategy.

    Since the thirty-fifth session, the single 128-row tile of the warp-specialized tiling with
    two wgmmas in flight (M < 128, fragment-ordered words) pads from 32 rows past M where each
    program runs at least 32 of the K (``k``) tiles: on the H200 (``bench_int4_gemm.py`` A/B,
    BENCHMARKS.md, "INT4 GEMM", thirty-fifth session) 4096 x 6144 at M = 88 / 96 took 18.1,
    18.0 / 18.0, 17.8 against 19.8, 19.7 / 19.3, 19.1 us, 14336 x 4096 at M = 88 34.5, 34.3
    against 40.7, 39.0; with fewer K tiles per program the copy cost more than the fill
    (4096 x 4096, split 2, at M = 88 / 96: 17.3 / 17.2 padded against 16.6 / 16.4).

    Tiles of fewer than 128 rows pad nothing, except the second 64-row tile of
    ``_NARROW_2X64`` (64 < M <= 128), from 32 rows past M, since the thirty-sixth session (the
    figures are in its comment)."""
    if not (cfg.strategy == "wgmma" and cfg.swap):
        return 0
    past = -m % cfg.block_m
    if cfg.block_m < 128:  # least = block_m: never
        two_64 = cfg.block_m == 64 and cfg.specialized and cfg.pipe and 64 < m <= 128
        least = 32 if two_64 else cfg.block_m
    else:
        least = 24 if not cfg.specialized else 48 * cfg.block_n // 64
        # one 128-row tile with two wgmmas in flight, each program over >= 32 K tiles
        if cfg.pipe and cfg.specialized and cfg.block_m == 128 and m < 128:
            if k >= 32 * cfg.block_k * cfg.split_k:
                least = 32
    return past if past >= least else 0


def _mma_config(m: int, n: int, k: int) -> Int4GemmConfig | None:
    """Small M on a fragment-ordered weight: the register mma kernel where it led the swapped
    kernel on the H200, else None. Its warps split K (``wsplit``), launched as a
    programmatic dependent, 8 rows of x per program (16 above M = 8). Since the twenty-third
    session (words in tile order, ``bench_int4_mma.py --frag --tiled 1``; BENCHMARKS.md),
    us per call against the table before:
    - wide weights (N > 8192, measured at 28672) up to M = 8: x through shared memory, 8
      warps of two row tiles, the scales a tile ahead: 23.2 / 24.1 against 24.3 / 24.5 at
      M = 1 / 8 (the swapped kernel); since the twenty-fourth session 4 such warps (each
      warp's K range twice as long): 20.0-20.3 / 21.4-21.8 against 23.0-23.2 / 23.7-24.0 at
      M = 1 / 8 in two sweeps (2 warps, 1 or 4 row tiles, 3 stages of x and split-K 2 were
      slower; so were 4 warps on the narrow weights and on the wide one at M = 16);
    - down_proj-sized weights at M <= 2 with two row tiles per warp and the scales ahead,
      no register cap: 11.5 / 11.8 against 11.8 / 12.2; at M = 3-8 the scales ahead, no
      cap: 12.0 / 12.2 against 12.9 / 12.7 at M = 4 / 8; at M = 9-16 the form of o_proj,
      scaled, capped at 128: 16.1 against 18.4 at M = 16 (the swapped kernel), until the
      thirty-first session put the swapped kernel's second warpgroup there (``_narrow_swap``);
    - o_proj-sized ones at M = 9-16 scaled: 6.2 against 6.7.
    Before that:
    - down_proj-sized weights (K >= 8192): at M <= 2 x's fragments loaded in place, 16 weight
      rows per program, one tile ahead, no split-K, 16 warps (registers capped at 64) while
      two programs per multiprocessor hold every row (N <= 4096 on the H200), else 8; at M =
      3-8 x through shared memory (``x_smem``), 8 warps, 32 rows (two row tiles per warp),
      split-K 2, registers capped at 128;
    - others up to M = 8 through shared memory, 8 warps of 16 rows, each tile's scales and
      offsets loaded with its words, a tile ahead (``s_ahead``), registers capped at 96
      where two programs per multiprocessor hold every row (o_proj-sized, N <= 4096), else at
      80, which lets three fit (qkv-sized: 384 programs), and there the words copied into x's
      shared ring one tile ahead (``w_ring``) instead of into registers;
    - at M = 9-16 through shared memory, 8 warps: o_proj-sized ones with 16 rows, qkv-sized
      ones with two row warps (32 rows, each K range's copy of x read by two warps) and the
      scales applied in the decode (``scaled``: half the mmas; 4096 x 6144 at M = 16 9.8
      against 10.6 us, fifteenth session; no gain on the other shapes or at M <= 8);
    - o_proj-sized ones at M = 17-32 the same (two row warps, scaled) in x tiles of 16 rows,
      registers capped at 128: 4096 x 4096 at M = 24 / 32 9.4 / 9.5 against 9.8 / 10.0 us on
      the swapped kernel (fifteenth session; qkv-sized ones stay there: 13.5 against 12.3).
    Every form issues its first tile of words (and scales) before it waits on the previous
    kernel (``weights_first``): qkv / o_proj at M = 1 6.4 / 5.1 against 7.0 / 5.6 us, at M =
    16 9.4 / 7.0 against 9.8 / 7.5, down_proj at M = 1 14.1 against 14.6; and down_proj's
    16-warp form at M <= 2 is capped at 64 registers, the count it uses anyway (offline
    SASS), under which ptxas schedules it differently: 13.0 / 13.4 against 13.7 / 14.2 us at
    M = 1 / 2 (sixteenth session).

    ``s_ahead`` and ``w_ring`` (twenty-third session, ``bench_int4_latency.py``, words in
    tile order, two runs): 4096 x 4096 at M = 1 / 8 4.4-4.5 / 4.6-4.7 against 4.9 / 4.8 us;
    4096 x 6144 at M = 1 / 8 6.1 / 6.2-6.3 against 6.3 / 6.3-6.5 (on down_proj's forms of
    then neither helped, nor at M = 9-32: deeper rings were slower, up to 1.4x; the sweep
    above found down_proj's new forms, where ``s_ahead`` comes with other changes).

    Measured (BENCHMARKS.md, "INT4 GEMM", fourteenth session of 2026-11-30,
    ``bench_int4_mma.py --frag --x-smem --row-tiles 1,2 --maxnreg 0,128,96,80,72 --x-stages 2
    --launch pdl``, us, against the table before): 4096 x 6144 at M = 1 / 4 / 8: 7.0 / 7.1 /
    7.1 against 7.8 / 7.7 / 7.7 (M = 16 with row warps: 10.6 against 10.9); 4096 x 4096 at
    M = 1 / 4 / 8: 5.5 against 6.0 / 6.2 / 6.3; 14336 x 4096 at M = 4 / 8: 14.5 / 15.1
    against 15.6 / 15.7."""
    smem = dict(pdl=True, weights_first=True, wsplit=True, x_smem=True)
    if n > 8192:  # wide (gate_up): 4 warps of two row tiles up to M = 8, measured to N = 28672
        if m <= 8 and n <= 32768:
            return Int4GemmConfig("mma", 8, 32, 128, 1, 4, 1, s_ahead=True, **smem)
        return None
    two_per_sm = -(-n // 16) <= 2 * _ONE_WAVE  # programs of 16 rows, two per multiprocessor
    if k >= 8192:
        if m <= 2:
            if two_per_sm:  # in tile order: two row tiles per warp, the scales a tile ahead
                return Int4GemmConfig(
                    "mma", 8, 32, 128, 1, 16, 1, pdl=True, weights_first=True, wsplit=True,
                    s_ahead=True,
                )  # fmt: skip
            return Int4GemmConfig(
                "mma", 8, 16, 128, 1, 8, 1, pdl=True, weights_first=True, wsplit=True
            )
        if m <= 8:
            return Int4GemmConfig("mma", 8, 32, 128, 2, 8, 1, s_ahead=True, **smem)
        return None  # M = 9-16: the swapped kernel's second warpgroup (``_narrow_swap``)
    if m <= 8:
        if two_per_sm:  # o_proj-sized: the scales a tile ahead
            return Int4GemmConfig("mma", 8, 16, 128, 1, 8, 1, maxnreg=96, s_ahead=True, **smem)
        # qkv-sized: and the words through x's shared ring, one tile ahead
        return Int4GemmConfig(
            "mma", 8, 16, 128, 1, 8, 1, maxnreg=80, s_ahead=True, w_ring=True, **smem
        )
    if m <= 16:
        if n <= 4096:
            return Int4GemmConfig("mma", 16, 16, 128, 1, 8, 1, scaled=True, **smem)
        return Int4GemmConfig("mma", 16, 32, 128, 1, 8, 1, row_warps=2, scaled=True, **smem)
    if m <= 32 and n <= 4096:
        return Int4GemmConfig(
            "mma", 16, 32, 128, 1, 8, 1, row_warps=2, scaled=True, maxnreg=128, **smem
        )
    return None


def _frag_config(m: int, n: int, k: int) -> Int4GemmConfig:
    """The table for fragment-ordered words (``Int4Weight.frag``), which the swapped wgmma
    kernel, the register mma kernel and the dequantizer read: K tiles of 128, wgmma's N the
    smallest power of two >= M, ``_large_config`` above M = 256. Wide weights (fourth session
    of 2026-11-30, ``bench_int4_wgmma.py --swap --frag``; BENCHMARKS.md, "INT4 GEMM"):
    split-free, 128 rows up to M = 64, ``_plain_128x64`` up to 128, x tiles of 256 rows
    warp-specialized above. Narrower ones: ``_mma_config`` at small M, else
    ``_narrow_swap``."""
    if m > 256:
        return _large_config(m, n, k, frag=True)
    if n <= 8192:
        return _mma_config(m, n, k) or _narrow_swap(m, n, k, frag=True)
    return _mma_config(m, n, k) or _wide_swap(m, frag=True)


@functools.lru_cache(maxsize=8192)  # launchers ask on every eager call
def choose_config(
    m: int, n: int, k: int, group_size: int, device: torch.device, frag: bool = False
) -> Int4GemmConfig:
    """The table: strategy and tiles from the number of rows M and the weight's shape.

    From the H200 sweeps of 2026-11-29 and 30 (Llama-3-8B shapes, group 128; BENCHMARKS.md,
    "INT4 GEMM"): M = 1 gemv, the ``fold`` decode in inline PTX, launched as a programmatic
    dependent: 64 outputs per two-warp program for wide weights (N >= 16384, split-K 8) and
    for N <= 4096 with K >= 4096 (split-K 16), else one-warp programs of 32 outputs for
    N > 4096 and K < 8192, else of 16 (split-K 8); M <= 16 the mm kernel 16 x 64 with swapped
    operands, inline-PTX dequantization and TMA tile loads (magic-number dequantization and
    pointer loads where those do not apply), split-K 8 (4 for wide weights); M <= 64 the same
    kernel not swapped (x feeds the MMA from the TMA buffer, the weight tile is stored in K
    order), 64 x 64 split-K 4 (N <= 8192) or 64 x 128 unsplit (wider); M <= 256 with N > 8192
    the Gluon wgmma kernel at 256 x 128 x 64, 8 warps, 4 stages (else the unswapped kernel at
    128 x 128 x 64); above, and for narrower weights, dequantize + cuBLAS was fastest.
    Ahead of all of these from M = 2, for groups that are multiples of 128 (third session of
    2026-11-30): the swapped Gluon kernel, K tiles of 128, up to M = 256: on wide weights (N >
    8192) as that session chose (but ``_plain_128x64`` at 64 < M <= 128; warp-specialized above),
    on narrower ones as ``_narrow_swap`` (seventh session, once split-K partials were reduced
    in slots instead of with atomics); above M = 256 (eighth session) the swapped kernel or
    dequantize + cuBLAS by a cost model (``_large_config``). ``frag``: the weight's words are
    in fragment order (``_frag_config``).
    """
    if frag:
        return _frag_config(m, n, k)
    block_k = 128 if group_size >= 128 or group_size == k else group_size
    if m == 1:
        # l2_prefetch stays off: 1-6% faster alone on qkv and o_proj, 4-11% slower on wide
        # and long-K weights, not faster end to end (eleventh session, BENCHMARKS.md).
        fold = {"fold": True, "asm": True, "pdl": True}
        if n >= 16384:  # wide (gate_up, lm_head): 64 outputs per two-warp program
            return Int4GemmConfig("gemv", 16, 64, 256, _pow2_split(8, k, 256, 32), 2, 2, **fold)
        if n <= 4096 and k >= 4096:
            return Int4GemmConfig("gemv", 16, 64, 256, _pow2_split(16, k, 256, 32), 2, 2, **fold)
        block_n = 32 if n > 4096 and k < 8192 else 16
        return Int4GemmConfig("gemv", 16, block_n, 256, _pow2_split(8, k, 256, 32), 1, 2, **fold)
    small = n <= 8192
    # The swapped Gluon kernel (weights decoded into wgmma's register operand) in K tiles of
    # 128 up to M = 256. wgmma's N is the smallest power of two >= M (the TMA tile of x reads
    # zeros past M).
    if block_k == 128:
        if m > 256:
            return _large_config(m, n, k, frag=False)
        return _narrow_swap(m, n, k, frag=False) if small else _wide_swap(m, frag=False)
    # magic: the fallback where the inline-PTX and TMA paths do not apply (fp32 x, pre-sm_90)
    tma = {"magic": True, "pipelined": True, "asm": True, "tma": True}
    if m <= 16:
        split = _pow2_split(8 if small else 4, k, block_k, 8)
        return Int4GemmConfig("mm", 16, 64, block_k, split, 4, 3, swap=True, **tma)
    # Not swapped where K tiles are >= 64: Triton 3.6 (and 3.9) fail to compile the 64 x 128
    # tile with K tiles of 32 unswapped (TritonGPUOptimizeDotOperands); swapped compiles.
    swap = block_k < 64
    if m <= 64:
        if small:
            split = _pow2_split(4, k, block_k, 4)
            return Int4GemmConfig("mm", 64, 64, block_k, split, 4, 3, swap=swap, **tma)
        return Int4GemmConfig("mm", 64, 128, block_k, 1, 4, 3, swap=swap, **tma)
    if m <= 256 and not small:  # groups of 64 (K tiles of 64): the unswapped Gluon kernel
        return Int4GemmConfig("wgmma", 256, 128, 64, 1, 8, 4)
    return Int4GemmConfig("dequant")
