"""Per-row logit thresholds of min-p, top-k and top-p without sorting the vocabulary.

The sampler reduces every filter to one threshold per row: tokens whose logit is at or above
it are kept (``engine.sampler``). Top-k's threshold is the k-th largest logit; top-p's is the
largest logit ``v`` whose tokens at or above it carry at least ``p`` of the probability
(after min-p and top-k, at the row's temperature). PyTorch finds them with ``topk`` and a sort
of each row, 0.4-0.9 ms per call on Llama-3's 128,256-token vocabulary at 1-32 rows on the
H200 (``benchmarks/bench_sampler.py``).

Here both are one search: the largest key ``K`` of a row whose elements with key >= ``K``
weigh at least a target (weight 1 and target k for top-k; weight ``exp((x - max) / T)`` and
target ``p`` times the total for top-p), where a logit's key is its float32 bits mapped to an
unsigned integer of the same order. The key is found four bits at a time, from the top: each
launch over (row, slice of the vocabulary) finishes the previous digit from every slice's
16 bucket weights (the largest digit whose buckets at and above it, plus what lies above the
prefix, reach the target), then sums its slice's weights per value of the next digit among the
elements that share the prefix (from the second digit on, only the logits its slice kept in the
step before: those that matched the prefix then). Eight digits give the exact key, so the
result is a logit of the row and ties at the boundary are all kept, as in the sort. A slice's
weights are summed in
float32, the slices' sums in float64: top-p's boundary can differ from an exact one only
where p times the total lies within about 1e-7 of the total from the cumulative weight at a
token (PyTorch's, normalized by a float32 log-sum-exp, has errors of that size too). Sums
follow the logits' order, so a row's threshold never depends on the other rows or the run.

On CUDA, for a few rows, all of it is one launch of rows x slices programs, those of a row
waiting for each other between steps; for more rows (and in the interpreter) a launch per
step: one for the rows' maxima, eight per filter searched, one to finish. Nothing waits for
the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.launch import FastLaunch
from kernels.pdl import num_sms
from kernels.scratch import zeroed_int32

_SLICE = 4096  # logits per program
_DIGITS = 8  # four-bit digits of a 32-bit key
_BUCKETS = 16


@triton.jit
def _key(x):
    """float32 -> uint32 of the same order (-inf smallest)."""
    bits = x.to(tl.int32, bitcast=True)
    flip = (bits >> 31) | -2147483648  # all ones for negatives, the sign bit for the rest
    return (bits ^ flip).to(tl.uint32, bitcast=True)


@triton.jit
def _value(key):
    """The inverse of ``_key``: uint32 (held in an int64) -> float32."""
    k = key.to(tl.uint32).to(tl.int32, bitcast=True)
    bits = tl.where(k < 0, k ^ -2147483648, ~k)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _row_max(max_ptr, row, num_slices, SLICES_PAD: tl.constexpr):
    parts = tl.arange(0, SLICES_PAD)
    tops = tl.load(max_ptr + row * num_slices + parts, mask=parts < num_slices,
                   other=float("-inf"), cache_modifier=".cg")  # fmt: skip
    return tl.max(tops, axis=0)


@triton.jit
def _finish_digit(
    partial_ptr, prefix_ptr, above_ptr, parity, step, row, num_rows, num_slices, target,
    scale_target, SLICES_PAD: tl.constexpr,
):  # fmt: skip
    """Digit ``step`` - 1 of the key (``step`` >= 1), from the bucket sums of the launch before
    (at ``parity``, beside the prefix and the weight above it that that launch's slice-0
    program stored, or none at ``step`` 1): the largest digit whose buckets at and above it,
    plus the weight above the prefix, reach the target. Returns the prefix with it, the
    weight above that, and the target: ``target``, or with ``scale_target`` that times the
    row's total (top-p's first digit)."""
    parts = tl.arange(0, SLICES_PAD)
    buckets = tl.arange(0, 16)
    offsets = ((parity * num_rows + row) * num_slices + parts[:, None]) * 16 + buckets[None, :]
    # written by other programs (``.cg``: from L2, never a stale L1 line of an earlier step)
    sums = tl.load(partial_ptr + offsets, mask=parts[:, None] < num_slices, other=0.0,
                   cache_modifier=".cg")  # fmt: skip
    sums = tl.sum(sums, axis=0)
    prefix = tl.zeros((), tl.int64)
    above = tl.zeros((), tl.float64)
    if step > 1:
        prefix = tl.load(prefix_ptr + parity * num_rows + row, cache_modifier=".cg")
        above = tl.load(above_ptr + parity * num_rows + row, cache_modifier=".cg")
    if scale_target:
        target = target * tl.sum(sums, axis=0)
    # at and above each digit: non-increasing in the digit, so the digits that reach the
    # target are 0 .. the one sought
    at_or_above = above + tl.cumsum(sums, axis=0, reverse=True)
    digit = tl.maximum(tl.sum((at_or_above >= target).to(tl.int32), axis=0) - 1, 0)
    above += tl.sum(tl.where(buckets > digit, sums, 0.0), axis=0)
    return prefix * 16 + digit, above, target


@triton.jit
def _bucket_sums(weight, key, step):
    """``[16]`` float64: the weights per value of digit ``step`` of their keys."""
    digit = ((key >> (28 - 4 * step)) & 15).to(tl.int32)
    buckets = tl.arange(0, 16)
    # one [16, chunk] reduction, not sixteen: float32 within a chunk (exact for counts; for
    # weights within about 1e-7 of the chunk's total), float64 from there on
    one_hot = digit[None, :] == buckets[:, None]
    return tl.sum(tl.where(one_hot, weight[None, :], 0.0), axis=1).to(tl.float64)


@triton.jit
def _slice_max(max_ptr, logits_ptr, row, part, vocab_size, stride_row, num_slices,
               SLICE: tl.constexpr):  # fmt: skip
    cols = part * SLICE + tl.arange(0, SLICE)
    x = tl.load(logits_ptr + row * stride_row + cols, mask=cols < vocab_size, other=float("-inf"))
    tl.store(max_ptr + row * num_slices + part, tl.max(x, axis=0))


@triton.jit
def _slice_max_kernel(max_ptr, logits_ptr, vocab_size, stride_row, num_slices,
                      SLICE: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    _slice_max(max_ptr, logits_ptr, row, tl.program_id(1), vocab_size, stride_row, num_slices,
               SLICE)  # fmt: skip


@triton.jit
def _search_step(
    row,
    part,
    out_ptr,
    threshold_ptr,
    max_ptr,
    partial_ptr,
    prefix_ptr,
    above_ptr,
    target_ptr,
    logits_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    log_min_p_ptr,
    floor_ptr,
    keys_ptr,
    counts_ptr,
    vocab_size,
    stride_row,
    num_rows,
    num_slices,
    step,
    TOP_P: tl.constexpr,
    AFTER_TOP_K: tl.constexpr,
    SLICE: tl.constexpr,
    SLICES_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """One step (0 .. 8) of the top-k search (``TOP_P`` False) or the top-p search, for slice
    ``part`` of ``row``. A step finishes digit ``step`` - 1 (from 1 on) and sums the slice's bucket
    weights of digit ``step`` (up to 7); at step 8 the slice-0 program writes the row's
    threshold. The top-p search's step 0 first sets the row's min-p and top-k threshold
    (finishing the top-k search, ``AFTER_TOP_K``), below which its weights are zero; a row
    that searches neither gets that threshold where its search would write."""
    parity = step % 2
    row_max = _row_max(max_ptr, row, num_slices, SLICES_PAD)
    temperature = tl.load(temperature_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    top_k_on = (top_k > 0) & (top_k < vocab_size)
    # min-p: p_i >= min_p * p_max  <=>  x_i >= x_max + T * log(min_p)
    threshold = row_max + temperature * tl.load(log_min_p_ptr + row)
    threshold = tl.maximum(threshold, tl.load(floor_ptr + row))
    if TOP_P:
        top_p = tl.load(top_p_ptr + row)
        active = top_p < 1.0
        goal = top_p.to(tl.float64)
        if step == 0:
            if AFTER_TOP_K:
                if top_k_on:
                    key, _, _ = _finish_digit(
                        partial_ptr, prefix_ptr, above_ptr, 1, 8, row, num_rows, num_slices,
                        top_k.to(tl.float64), False, SLICES_PAD,
                    )  # fmt: skip
                    threshold = tl.maximum(threshold, _value(key))
            if part == 0:
                tl.store(threshold_ptr + row, threshold)
                if top_p >= 1.0:
                    tl.store(out_ptr + row, threshold)
        else:
            threshold = tl.load(threshold_ptr + row, cache_modifier=".cg")
            if step > 1:
                goal = tl.load(target_ptr + row, cache_modifier=".cg")
    else:
        active = top_k_on
        goal = top_k.to(tl.float64)
        if (step == 8) & (part == 0) & ((top_k <= 0) | (top_k >= vocab_size)):
            tl.store(out_ptr + row, threshold)  # min-p's alone; no top-p search follows
    if active:
        prefix = tl.zeros((), tl.int64)
        scale_target = step == 1  # top-p's target is p times the total the first digit sums
        if not TOP_P:
            scale_target = step < 0
        if step > 0:
            prefix, above, goal = _finish_digit(
                partial_ptr, prefix_ptr, above_ptr, 1 - parity, step, row, num_rows, num_slices,
                goal, scale_target, SLICES_PAD,
            )  # fmt: skip
            if part == 0:
                tl.store(prefix_ptr + parity * num_rows + row, prefix)
                tl.store(above_ptr + parity * num_rows + row, above)
                if TOP_P:
                    if step == 1:
                        tl.store(target_ptr + row, goal)
        if step == 8:
            if part == 0:
                value = _value(prefix)
                if not TOP_P:
                    value = tl.maximum(threshold, value)
                tl.store(out_ptr + row, value)
        else:
            # This slice's weights per value of digit ``step`` among the keys whose digits
            # above it are ``prefix``, a chunk at a time. From step 1 on, the logits that
            # match are also kept, in order, in the slice's own region of ``keys_ptr``, and
            # from step 2 on only those are read: once the prefix is a few digits long, few
            # are left. A program rewrites its region in place (a logit is written at or
            # before where it was read, after the whole chunk is loaded).
            region = keys_ptr + (row * num_slices + part) * SLICE
            if step < 2:
                count = tl.minimum(vocab_size - part * SLICE, SLICE)
            else:
                count = tl.load(counts_ptr + row * num_slices + part, cache_modifier=".cg")
            sums = tl.zeros((16,), tl.float64)
            kept = tl.zeros((), tl.int32)
            for start in range(0, SLICE, CHUNK):
                if start < count:
                    offsets = start + tl.arange(0, CHUNK)
                    valid = offsets < count
                    if step < 2:
                        x = tl.load(logits_ptr + row * stride_row + part * SLICE + offsets,
                                    mask=valid, other=float("-inf"))  # fmt: skip
                    else:
                        x = tl.load(region + offsets, mask=valid, other=float("-inf"),
                                    cache_modifier=".cg")  # fmt: skip
                    key = _key(x)
                    match = valid
                    if step > 0:
                        match &= (key >> (32 - 4 * step)).to(tl.int64) == prefix
                    if TOP_P:
                        match &= x >= threshold
                    if tl.max(match.to(tl.int32), axis=0) > 0:
                        if TOP_P:
                            weight = tl.where(match, tl.exp((x - row_max) / temperature), 0.0)
                        else:
                            weight = tl.where(match, 1.0, 0.0)
                        sums += _bucket_sums(weight, key, step)
                        if step > 0:
                            tl.debug_barrier()  # every thread has read the chunk
                            ones = match.to(tl.int32)
                            position = kept + tl.cumsum(ones, axis=0) - 1
                            tl.store(region + position, x, mask=match)
                            kept += tl.sum(ones, axis=0)
            if step > 0:
                tl.store(counts_ptr + row * num_slices + part, kept)
            base = ((parity * num_rows + row) * num_slices + part) * 16
            tl.store(partial_ptr + base + tl.arange(0, 16), sums)


@triton.jit(do_not_specialize=["step"])
def _search_kernel(
    out_ptr, threshold_ptr, max_ptr, partial_ptr, prefix_ptr, above_ptr, target_ptr, logits_ptr,
    temperature_ptr, top_k_ptr, top_p_ptr, log_min_p_ptr, floor_ptr, keys_ptr, counts_ptr,
    vocab_size, stride_row, num_rows, num_slices, step, TOP_P: tl.constexpr,
    AFTER_TOP_K: tl.constexpr, SLICE: tl.constexpr, SLICES_PAD: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """One step of a search per launch, program (row, slice)."""
    _search_step(
        tl.program_id(0).to(tl.int64), tl.program_id(1), out_ptr, threshold_ptr, max_ptr,
        partial_ptr, prefix_ptr, above_ptr, target_ptr, logits_ptr, temperature_ptr, top_k_ptr,
        top_p_ptr, log_min_p_ptr, floor_ptr, keys_ptr, counts_ptr, vocab_size, stride_row,
        num_rows, num_slices, step, TOP_P, AFTER_TOP_K, SLICE, SLICES_PAD, CHUNK,
    )  # fmt: skip


@triton.jit
def _row_barrier(arrived_ptr, goal):
    """Wait until the row's programs have arrived ``goal`` times in all (this one included):
    every thread's stores before it are visible to the row's programs after it."""
    tl.debug_barrier()
    tl.atomic_add(arrived_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(arrived_ptr, 0, sem="acquire", scope="gpu")
    while seen < goal:
        seen = tl.atomic_add(arrived_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _filters_kernel(
    counters_ptr, out_ptr, threshold_ptr, max_ptr, partial_ptr, prefix_ptr, above_ptr,
    target_ptr, logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, log_min_p_ptr, floor_ptr,
    keys_ptr, counts_ptr, vocab_size, stride_row, num_rows, num_slices,
    HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr, SLICE: tl.constexpr,
    SLICES_PAD: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """Every step in one launch of rows x slices programs. A program takes its (row, slice)
    from a ticket, in the order programs start, so the row of every ticket handed out before
    the last one has all its programs running: the row's programs wait for each other between
    steps (``_row_barrier``) and never for a program that cannot start. ``counters_ptr``:
    the ticket, then each row's arrivals and exits, all 0 before and after a launch."""
    ticket = tl.atomic_add(counters_ptr, 1, sem="relaxed", scope="gpu")
    if ticket == num_rows * num_slices - 1:
        tl.store(counters_ptr, 0)  # the last ticket: none is taken after it
    row = (ticket // num_slices).to(tl.int64)
    part = ticket % num_slices
    arrived_ptr = counters_ptr + 1 + row
    _slice_max(max_ptr, logits_ptr, row, part, vocab_size, stride_row, num_slices, SLICE)
    _row_barrier(arrived_ptr, num_slices)
    barriers = 1
    for search in tl.static_range(2):  # top-k's, then top-p's
        if (HAS_TOP_K and search == 0) or (HAS_TOP_P and search == 1):
            for step in range(8):
                _search_step(
                    row, part, out_ptr, threshold_ptr, max_ptr, partial_ptr, prefix_ptr,
                    above_ptr, target_ptr, logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr,
                    log_min_p_ptr, floor_ptr, keys_ptr, counts_ptr, vocab_size, stride_row,
                    num_rows, num_slices, step, search == 1, HAS_TOP_K and search == 1, SLICE,
                    SLICES_PAD, CHUNK,
                )  # fmt: skip
                barriers += 1
                _row_barrier(arrived_ptr, barriers * num_slices)
    # step 8 (the slice-0 program): the threshold
    _search_step(
        row, part, out_ptr, threshold_ptr, max_ptr, partial_ptr, prefix_ptr, above_ptr,
        target_ptr, logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, log_min_p_ptr, floor_ptr,
        keys_ptr, counts_ptr, vocab_size, stride_row, num_rows, num_slices, 8, HAS_TOP_P,
        HAS_TOP_K, SLICE, SLICES_PAD, CHUNK,
    )  # fmt: skip
    exits_ptr = counters_ptr + 1 + num_rows + row
    if tl.atomic_add(exits_ptr, 1, sem="relaxed", scope="gpu") == num_slices - 1:
        # every program of the row is past its last barrier
        tl.store(arrived_ptr, 0)
        tl.store(exits_ptr, 0)


_SLICE_MAX = FastLaunch(_slice_max_kernel)
_SEARCH = FastLaunch(_search_kernel)
_FILTERS = FastLaunch(_filters_kernel)


def _launch_shape(rows: int, vocab_size: int, device: torch.device) -> tuple[bool, int]:
    """(persistent, slice size): one launch where all its programs are resident at once,
    one per multiprocessor in slices of 1024 or (programs of four warps, about four per
    multiprocessor) in slices of 2048; else a launch per step in slices of 4096. On the H200
    (Llama-3's vocabulary, ``bench_sampling_filters.py``): 1 row 47-87 us of GPU time in one
    launch of 1024-logit slices against 101-150 a step at a time (and 100-120 us of host time
    against 400-500); 8 rows 86-158 against 118-188; 32 rows 335-622 against 264-415 a step
    at a time."""
    if device.type != "cuda":
        return False, _SLICE  # the interpreter runs programs one after another
    multiprocessors = num_sms(device)
    if rows * triton.cdiv(vocab_size, 1024) <= multiprocessors:
        return True, 1024
    if rows * triton.cdiv(vocab_size, 2048) <= 4 * multiprocessors:
        return True, 2048
    return False, _SLICE


def filter_thresholds(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    log_min_p: torch.Tensor,
    has_top_k: bool = True,
    has_top_p: bool = True,
    floor: torch.Tensor | None = None,
    slice_size: int | None = None,
    persistent: bool | None = None,
) -> torch.Tensor:
    """Triton version of :func:`filter_thresholds_ref`: per row of ``logits [rows, vocab]``
    (float32, unit stride over the vocabulary), the smallest logit kept by min-p, top-k and
    top-p, ``[rows]`` float32. ``temperature [rows]`` float32 (> 0), ``top_k [rows]`` int
    (0, or >= vocab, turns it off), ``top_p [rows]`` float32 (>= 1 turns it off),
    ``log_min_p [rows]`` float32 (-inf turns it off). ``has_top_k`` / ``has_top_p`` False
    promise that no row uses that filter (its steps are skipped; the result is the same).
    ``floor [rows]`` float32 (default -inf): a threshold found elsewhere (top-k by
    ``torch.topk``, say), applied with min-p's before top-p.

    ``persistent`` runs every step in one launch whose programs wait for each other between
    steps, instead of a launch per step; ``slice_size`` is the logits per program (a power of
    two). By default (``_launch_shape``, from the H200 runs in BENCHMARKS.md) one launch on
    CUDA while every program of the call fits on the GPU at once (a few rows), a launch per
    step in slices of 4096 beyond (GPU time then outweighs the host's cost per launch)."""
    rows, vocab_size = logits.shape
    if logits.dtype != torch.float32 or logits.stride(-1) != 1:
        raise ValueError(
            f"logits must be float32 with unit stride over the vocabulary, got {logits.dtype} "
            f"with strides {logits.stride()}"
        )
    device = logits.device
    out = torch.empty(rows, dtype=torch.float32, device=device)
    if rows == 0:
        return out
    if floor is None:
        floor = torch.full((rows,), float("-inf"), device=device)
    floor = floor.float()
    if persistent is None or slice_size is None:
        shape = _launch_shape(rows, vocab_size, device)
        persistent = shape[0] if persistent is None else persistent
        slice_size = shape[1] if slice_size is None else slice_size
    num_slices = triton.cdiv(vocab_size, slice_size)
    maxima = torch.empty((rows, num_slices), dtype=torch.float32, device=device)
    partial = torch.empty((2, rows, num_slices, _BUCKETS), dtype=torch.float64, device=device)
    prefix = torch.empty((2, rows), dtype=torch.int64, device=device)
    above = torch.empty((2, rows), dtype=torch.float64, device=device)
    target = torch.empty(rows, dtype=torch.float64, device=device)
    threshold = torch.empty(rows, dtype=torch.float32, device=device)
    keys = torch.empty((rows, num_slices * slice_size), dtype=torch.float32, device=device)
    counts = torch.empty((rows, num_slices), dtype=torch.int32, device=device)
    warps = 8 if slice_size >= 4096 else 4
    chunk = min(slice_size, 32 * 2 * warps)  # two logits per thread, 32 bucket sums
    pad = max(2, triton.next_power_of_2(num_slices))
    args = (
        out, threshold, maxima, partial, prefix, above, target, logits, temperature.float(),
        top_k.to(torch.int32), top_p.float(), log_min_p.float(), floor, keys, counts, vocab_size,
        logits.stride(0),
        rows, num_slices,
    )  # fmt: skip
    if persistent:
        # the ticket, then each row's arrivals and exits: all zero before and after a launch
        counters = zeroed_int32(device, 1 + 2 * rows, "sampling_filters")
        _FILTERS[(rows * num_slices,)](
            counters, *args, HAS_TOP_K=has_top_k, HAS_TOP_P=has_top_p, SLICE=slice_size,
            SLICES_PAD=pad, CHUNK=chunk, num_warps=warps,
        )  # fmt: skip
        return out
    _SLICE_MAX[(rows, num_slices)](
        maxima, logits, vocab_size, logits.stride(0), num_slices, SLICE=slice_size,
        num_warps=warps,
    )  # fmt: skip
    searches = [(False, False)] * has_top_k + [(True, has_top_k)] * has_top_p
    if not searches:
        searches = [(False, False)]  # min-p alone: step 8 of a search with no active row
    for top_p_search, after_top_k in searches:
        last = not top_p_search and has_top_p
        for step in range(_DIGITS + 1):
            if last and step == _DIGITS:
                break  # the top-p search's step 0 finishes it
            if not (has_top_k or top_p_search) and step < _DIGITS:
                continue
            grid = (rows, 1 if step == _DIGITS else num_slices)
            _SEARCH[grid](
                *args, step, TOP_P=top_p_search, AFTER_TOP_K=after_top_k, SLICE=slice_size,
                SLICES_PAD=pad, CHUNK=chunk, num_warps=warps,
            )  # fmt: skip
    return out


def filter_thresholds_ref(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    log_min_p: torch.Tensor,
    has_top_k: bool = True,
    has_top_p: bool = True,
    floor: torch.Tensor | None = None,
) -> torch.Tensor:
    """The thresholds in PyTorch, by sorting each row (float64 cumulative weights).

    ``logits [rows, vocab]`` float32; ``temperature``, ``top_k``, ``top_p``, ``log_min_p``
    ``[rows]`` (and ``floor``) as in :func:`filter_thresholds`. Returns ``[rows]`` float32: the
    largest of ``max + T * log(min_p)``, ``floor``, the ``top_k``-th largest logit, and the
    logit of the least likely token among the most likely ones whose probabilities (at
    temperature T, zero below the others) first sum to >= ``top_p``; -inf where no filter is
    on. ``has_top_*`` are accepted for the same signature and not needed."""
    del has_top_k, has_top_p
    rows, vocab_size = logits.shape
    values = logits.sort(dim=-1, descending=True).values
    threshold = values[:, 0] + temperature * log_min_p
    if floor is not None:
        threshold = torch.maximum(threshold, floor)
    k = top_k.long()
    k_on = (k > 0) & (k < vocab_size)
    kth = values.gather(1, (k.clamp(1, vocab_size) - 1)[:, None])[:, 0]
    threshold = torch.where(k_on, torch.maximum(threshold, kth), threshold)
    weights = torch.exp((values.double() - values[:, :1].double()) / temperature.double()[:, None])
    weights = weights.masked_fill(values < threshold[:, None], 0.0)
    cumulative = weights.cumsum(dim=-1)
    goal = top_p.double() * cumulative[:, -1]
    boundary = (cumulative < goal[:, None]).sum(dim=-1).clamp(max=vocab_size - 1)
    top_p_value = values.gather(1, boundary[:, None])[:, 0]
    return torch.where(top_p < 1.0, top_p_value, threshold)
