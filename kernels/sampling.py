"""One token per row drawn from temperature-scaled, thresholded logits, in two launches.

The sampler's random rows reduce every filter (min-p, top-k, top-p) to a per-row logit
threshold and then draw by inverse CDF in id order with one uniform per row
(``engine.sampler``). In PyTorch that draw is some 35 small operations (weights, chunk sums,
two cumulative sums, two searches, gathers), each a launch: about 0.4 ms of host time per
call on the H200 machine, at 1 row as at 32 (``benchmarks/bench_sampler.py``). ``sample_rows`` does
the same in two launches over (row, slice of the vocabulary): each slice's largest kept logit
and its weight sum, then, from those, the row's total and the slice holding ``uniform *
total``, whose program walks to the first token past it. Weights are ``exp((logit - max) *
inv_temperature)``, zero below the threshold; sums are float64. It agrees with
``sample_rows_ref`` except where the target falls within rounding of a boundary between two
tokens' cumulative weights.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.launch import FastLaunch

_SLICE = 4096  # logits per program: a row is split over programs
_CDF_CHUNK = 256


@triton.jit
def _slice_weights_kernel(
    max_ptr,
    sum_ptr,
    logits_ptr,
    inv_temperature_ptr,
    threshold_ptr,
    vocab_size,
    stride_row,
    num_slices,
    SLICE: tl.constexpr,
):
    """Per (row, slice): the slice's largest kept logit and its weights' float64 sum relative
    to it, sum of exp((x - slice max) / T) over the kept logits (-inf and 0 if none)."""
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    cols = part * SLICE + tl.arange(0, SLICE)
    x = tl.load(logits_ptr + row * stride_row + cols, mask=cols < vocab_size, other=float("-inf"))
    keep = (x >= tl.load(threshold_ptr + row)) & (cols < vocab_size)
    x = tl.where(keep, x, float("-inf"))
    top = tl.max(x, axis=0)
    shift = tl.where(top > float("-inf"), top, 0.0)  # a slice with nothing kept sums to 0
    w = tl.where(keep, tl.exp((x - shift) * tl.load(inv_temperature_ptr + row)), 0.0)
    tl.store(max_ptr + row * num_slices + part, top)
    tl.store(sum_ptr + row * num_slices + part, tl.sum(w.to(tl.float64), axis=0))


@triton.jit
def _slice_draw_kernel(
    out_ptr,
    max_ptr,
    sum_ptr,
    logits_ptr,
    inv_temperature_ptr,
    threshold_ptr,
    uniform_ptr,
    vocab_size,
    stride_row,
    num_slices,
    SLICE: tl.constexpr,
    SLICES_PAD: tl.constexpr,
):
    """Per (row, slice): from every slice's (max, sum), the row's weights rescaled to its
    maximum, their running total and the slice that holds ``uniform * total``; every
    program of the row finds the same one, and that slice's program walks its logits to the
    first token past the target (or, where rounding leaves it short, its last kept token)."""
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    inv_t = tl.load(inv_temperature_ptr + row)
    parts = tl.arange(0, SLICES_PAD)
    tops = tl.load(max_ptr + row * num_slices + parts, mask=parts < num_slices,
                   other=float("-inf"))  # fmt: skip
    sums = tl.load(sum_ptr + row * num_slices + parts, mask=parts < num_slices, other=0.0)
    row_max = tl.max(tops, axis=0)
    scale = tl.where(tops > float("-inf"), tl.exp((tops - row_max) * inv_t), 0.0)
    scaled = sums * scale.to(tl.float64)
    cdf = tl.cumsum(scaled, axis=0)
    total = tl.max(cdf, axis=0)
    # Strictly below the total, so some slice of positive weight holds it.
    target = tl.minimum(tl.load(uniform_ptr + row) * total, total * (1.0 - 2.220446049250313e-16))
    chosen = tl.min(tl.where(cdf > target, parts, SLICES_PAD), axis=0)
    if part == chosen:
        before = tl.sum(tl.where(parts < part, scaled, 0.0), axis=0)
        cols = part * SLICE + tl.arange(0, SLICE)
        x = tl.load(logits_ptr + row * stride_row + cols, mask=cols < vocab_size,
                    other=float("-inf"))  # fmt: skip
        keep = (x >= tl.load(threshold_ptr + row)) & (cols < vocab_size)
        w = tl.where(keep, tl.exp((x - row_max) * inv_t), 0.0).to(tl.float64)
        walk = tl.cumsum(w, axis=0) + before
        first = tl.min(tl.where(walk > target, cols, vocab_size), axis=0)
        last = tl.max(tl.where(w > 0, cols, -1), axis=0)
        tl.store(out_ptr + row, tl.where(first < vocab_size, first, last).to(tl.int64))


_SLICE_WEIGHTS = FastLaunch(_slice_weights_kernel)
_SLICE_DRAW = FastLaunch(_slice_draw_kernel)


def sample_rows(
    logits: torch.Tensor,
    inv_temperature: torch.Tensor,
    threshold: torch.Tensor,
    uniform: torch.Tensor,
    slice_size: int = _SLICE,
) -> torch.Tensor:
    """Triton version of :func:`sample_rows_ref`: token ids ``[rows]`` (int64), one per row of
    ``logits [rows, vocab]`` (float32), drawn with weights ``exp((logit - row max) *
    inv_temperature)`` (``[rows]``, float32, > 0), zero for logits below ``threshold``
    (``[rows]``, float32; -inf keeps all), by inverse CDF in id order at ``uniform`` (``[rows]``,
    float64 in [0, 1)). Every row must keep a logit at or above its threshold. Two launches
    over (row, slice of ``slice_size`` logits), a power of two."""
    rows, vocab_size = logits.shape
    if logits.dtype != torch.float32 or logits.stride(-1) != 1:
        raise ValueError(
            f"logits must be float32 with unit stride over the vocabulary, got {logits.dtype} "
            f"with strides {logits.stride()}"
        )
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    num_slices = triton.cdiv(vocab_size, slice_size)
    tops = torch.empty((rows, num_slices), dtype=torch.float32, device=logits.device)
    sums = torch.empty((rows, num_slices), dtype=torch.float64, device=logits.device)
    inv_t, threshold = inv_temperature.float(), threshold.float()
    warps = 8 if slice_size >= 4096 else 4
    _SLICE_WEIGHTS[(rows, num_slices)](
        tops, sums, logits, inv_t, threshold, vocab_size, logits.stride(0), num_slices,
        SLICE=slice_size, num_warps=warps,
    )  # fmt: skip
    _SLICE_DRAW[(rows, num_slices)](
        out, tops, sums, logits, inv_t, threshold, uniform.double(), vocab_size,
        logits.stride(0), num_slices, SLICE=slice_size,
        SLICES_PAD=max(2, triton.next_power_of_2(num_slices)), num_warps=warps,
    )  # fmt: skip
    return out


def sample_rows_ref(
    logits: torch.Tensor,
    inv_temperature: torch.Tensor,
    threshold: torch.Tensor,
    uniform: torch.Tensor,
) -> torch.Tensor:
    """The draw in PyTorch: weights ``exp((logit - row max) * inv_temperature)``, zero below
    the row's threshold, then ``sample_inverse_cdf``."""
    inv_t = inv_temperature[:, None]
    row_max = logits.amax(dim=-1, keepdim=True)
    weights = torch.addcmul(-row_max * inv_t, logits, inv_t).exp_()
    weights.masked_fill_(logits < threshold[:, None], 0.0)
    return sample_inverse_cdf(weights, uniform)


def sample_inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Token ids ``[rows]`` drawn from unnormalized ``weights [rows, vocab]`` (>= 0, each row
    with some positive weight) by inverse CDF in id order, with ``uniform [rows]`` in [0, 1).

    Two levels keep it cheap and accurate: the cumulated sums of 256-token chunks pick a chunk,
    then a float64 cumsum inside that chunk picks the token. A zero weight is never picked.
    """
    num_rows, vocab_size = weights.shape
    chunk = _CDF_CHUNK
    num_full = vocab_size // chunk
    sums = []
    if num_full:
        full = weights[:, : num_full * chunk].reshape(num_rows, num_full, chunk)
        sums.append(full.sum(dim=-1))
    if vocab_size % chunk:
        sums.append(weights[:, num_full * chunk :].sum(dim=-1, keepdim=True))
    # float32 chunk sums (a float64 reduction costs 6x), accumulated across chunks in float64.
    chunk_cdf = torch.cat(sums, dim=1).double().cumsum(dim=-1)  # [rows, num_chunks]
    total = chunk_cdf[:, -1]
    target = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    chosen = torch.searchsorted(chunk_cdf, target[:, None], right=True)  # [rows, 1]
    before = torch.where(chosen > 0, chunk_cdf.gather(1, (chosen - 1).clamp(min=0)), 0.0)

    cols = chosen * chunk + torch.arange(chunk, device=weights.device)  # [rows, chunk]
    in_vocab = cols < vocab_size
    cols = cols.clamp_(max=vocab_size - 1)
    local_cdf = (weights.gather(1, cols) * in_vocab).double().cumsum(dim=-1)
    local_total = local_cdf[:, -1:]
    within = (target[:, None] - before).clamp(min=0)
    within = torch.minimum(within, torch.nextafter(local_total, torch.zeros_like(local_total)))
    position = torch.searchsorted(local_cdf, within, right=True)
    return cols.gather(1, position)[:, 0]
