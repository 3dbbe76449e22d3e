"""The sampler: turns one step's logits into one token per row, vectorized over the batch.

Order of processing follows vLLM: raw logprobs are captured first (log-softmax of the
unprocessed logits), then ``min_tokens`` masking, repetition / frequency / presence penalties;
greedy rows take the argmax; sampled rows go through temperature, then min-p, top-k and top-p,
and finally one uniform draw per row picks a token by inverse CDF over the vocabulary in id
order (on CUDA in two Triton launches, ``kernels.sampling``). Every filter is reduced to a
per-row logit threshold computed from values only (never from the order of equal values), so a
seeded row's sample depends on its own logits and its own generator, not on the rest of the
batch. Full sorts are avoided: on CUDA top-p, min-p and top-k above 1024 are found by a
threshold search in Triton that never waits for the GPU (``kernels.sampling_filters``); on the
CPU top-p looks at the top 64 logits, then the top 1024, and sorts only the rows those do not
cover.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from engine.outputs import Logprob
from engine.request import Request
from engine.transfer import copy_to_device
from kernels.sampling import sample_rows, sample_rows_ref
from kernels.sampling_filters import filter_thresholds

# Candidate counts tried by top-p before falling back to a full sort of the row.
_TOP_P_CANDIDATES = (64, 1024)
# The largest top-k that CUDA rows take from torch.topk rather than the threshold search.
_TOP_K_BY_TOPK = 1024


@dataclass
class SamplerOutput:
    """One step's samples.

    ``logprobs[i]`` is None unless ``requests[i].sampling_params.logprobs`` is set; then it maps
    the sampled token and the top-``logprobs`` tokens of the raw distribution to their
    ``Logprob`` (``decoded_token`` left None: the engine fills the text).
    """

    sampled_token_ids: list[int]
    logprobs: list[dict[int, Logprob] | None]


class PendingSample:
    """One step's samples, launched on the device and not read back yet.

    ``token_ids [rows]`` (int64, on the sampler's device) can feed the next step before the
    host has seen them. ``result()`` waits for this step's sampling only: its values are
    copied into pinned host memory behind the sampling kernels and an event marks the copy's
    end, so work queued on the stream after it (the next step's forward) is not waited for.
    """

    def __init__(
        self,
        token_ids: torch.Tensor,
        logprob_parts: tuple[torch.Tensor, ...] | None,
        logprob_rows: list[int],
        num_top: list[int],
        num_rows: int,
    ) -> None:
        self.token_ids = token_ids
        self._logprob_rows = logprob_rows
        self._num_top = num_top
        self._num_rows = num_rows
        parts = (token_ids, *(logprob_parts or ()))
        self._event = None
        if token_ids.device.type == "cuda":
            parts = tuple(
                torch.empty(p.shape, dtype=p.dtype, pin_memory=True).copy_(p, non_blocking=True)
                for p in parts
            )
            self._event = torch.cuda.Event()
            self._event.record()
        self._parts = parts
        self._result: SamplerOutput | None = None

    def result(self) -> SamplerOutput:
        """The samples as host values (waits for the copy behind this step's sampling)."""
        if self._result is None:
            if self._event is not None:
                self._event.synchronize()
            ids = self._parts[0].tolist()
            logprobs: list[dict[int, Logprob] | None] = [None] * self._num_rows
            if len(self._parts) > 1:
                rows = _logprob_rows(ids, self._logprob_rows, self._parts[1:], self._num_top)
                for i, row in zip(self._logprob_rows, rows, strict=True):
                    logprobs[i] = row
            self._result = SamplerOutput(sampled_token_ids=ids, logprobs=logprobs)
        return self._result


class Sampler:
    """Samples the next token of every row of a batch of logits.

    ``seed`` seeds the generator shared by unseeded rows (random when None). ``sort_free``
    False makes CUDA rows take PyTorch's ``topk`` and row sorts for their thresholds instead of
    ``kernels.sampling_filters`` (benchmarks compare the two).
    While a request has fewer than ``min_tokens`` outputs, its ``eos_token_id``,
    ``eos_token_ids`` (every id that ends a generation) and its stop token ids are masked.
    Requests with ``sampling_params.seed`` get their own ``torch.Generator`` on ``device``,
    created on first use and stored in ``request.generator`` (seeded with ``seed +
    request.index`` so that the ``n`` sequences of one seeded request differ); that is the only
    change made to a request.
    """

    def __init__(
        self, device: torch.device | str, seed: int | None = None, eos_token_ids: Iterable[int] = ()
    ) -> None:
        self.device = torch.device(device)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.generator = torch.Generator(device=self.device)
        self.sort_free = True
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, requests: Sequence[Request]) -> SamplerOutput:
        """Sample one token per row. ``logits [num_rows, vocab]`` (any float dtype), row ``i``
        belongs to ``requests[i]``. ``logits`` itself is not modified."""
        return self.launch(logits, requests).result()

    def launch(self, logits: torch.Tensor, requests: Sequence[Request]) -> PendingSample:
        """``__call__`` without waiting: the sampling is queued on the device and read back by
        ``result()``. On CUDA nothing here waits for the GPU (on the CPU, top-p's candidate
        search checks whether a row needs a wider look)."""
        if logits.dim() != 2 or logits.shape[0] != len(requests):
            raise ValueError(
                f"logits must be [num_rows, vocab] with one row per request; got shape "
                f"{tuple(logits.shape)} for {len(requests)} requests"
            )
        num_rows = len(requests)
        if num_rows == 0:
            return PendingSample(torch.empty(0, dtype=torch.long), None, [], [], 0)
        params = [r.sampling_params for r in requests]
        raw = logits.to(device=self.device, dtype=torch.float32)

        logprob_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        raw_logprobs = None
        if logprob_rows:
            rows = raw if len(logprob_rows) == num_rows else raw[self._index(logprob_rows)]
            raw_logprobs = torch.log_softmax(rows, dim=-1)

        processed = self.process_logits(raw, requests)
        greedy_rows = [i for i, p in enumerate(params) if p.is_greedy]
        random_rows = [i for i, p in enumerate(params) if not p.is_greedy]
        if not random_rows:
            sampled_ids = processed.argmax(dim=-1)
        elif not greedy_rows:
            sampled_ids = self._sample(processed, requests)
        else:
            sampled_ids = torch.empty(num_rows, dtype=torch.long, device=self.device)
            index = self._index(greedy_rows)
            sampled_ids[index] = processed[index].argmax(dim=-1)
            index = self._index(random_rows)
            sampled_ids[index] = self._sample(processed[index], [requests[i] for i in random_rows])

        num_top = [params[i].logprobs or 0 for i in logprob_rows]
        parts = None
        if raw_logprobs is not None:
            parts = _logprob_tensors(raw_logprobs, sampled_ids[self._index(logprob_rows)], num_top)
        return PendingSample(sampled_ids, parts, logprob_rows, num_top, num_rows)

    def _index(self, rows: list[int]) -> torch.Tensor:
        return copy_to_device(torch.tensor(rows, dtype=torch.long), self.device)

    def _tensor(self, values: list[float]) -> torch.Tensor:
        return copy_to_device(torch.tensor(values, dtype=torch.float32), self.device)

    # ----------------------------------------------------------------------------------------
    # Logit processing

    def process_logits(self, logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
        """The logits that greedy rows take the argmax of: ``logits [num_rows, vocab]`` as
        float32 with ``min_tokens`` masking and the penalties applied (a copy when anything
        changes; ``logits`` itself is never modified)."""
        work = logits.to(device=self.device, dtype=torch.float32)
        if work.data_ptr() == logits.data_ptr():
            work = work.clone() if self._needs_processing(requests) else work
        self._apply_min_tokens(work, requests)
        self._apply_penalties(work, requests)
        return work

    def _needs_processing(self, requests: Sequence[Request]) -> bool:
        for r in requests:
            p = r.sampling_params
            if len(r.output_token_ids) < p.min_tokens or _has_penalty(r):
                return True
        return False

    def _apply_min_tokens(self, logits: torch.Tensor, requests: Sequence[Request]) -> None:
        """Mask the EOS ids and stop token ids of rows with fewer than ``min_tokens`` outputs."""
        vocab_size = logits.shape[1]
        rows: list[int] = []
        cols: list[int] = []
        for i, request in enumerate(requests):
            params = request.sampling_params
            if len(request.output_token_ids) >= params.min_tokens:
                continue
            banned = set(params.stop_token_ids) | self.eos_token_ids
            if request.eos_token_id is not None:
                banned.add(request.eos_token_id)
            for token_id in banned:
                if 0 <= token_id < vocab_size:
                    rows.append(i)
                    cols.append(token_id)
        if rows:
            logits[self._index(rows), self._index(cols)] = float("-inf")

    def _apply_penalties(self, logits: torch.Tensor, requests: Sequence[Request]) -> None:
        """Repetition penalty over prompt + output tokens (positive logits divided, negative
        multiplied), then frequency and presence penalties over output tokens
        (``logits -= frequency * count + presence``). Works on the ``[rows, num_tokens]`` ids,
        never on a dense ``[rows, vocab]`` count table."""
        repetition_rows = [
            i for i, r in enumerate(requests) if r.sampling_params.repetition_penalty != 1.0
        ]
        if repetition_rows:
            chosen = [requests[i] for i in repetition_rows]
            ids = self._padded_ids([r.prompt_token_ids + r.output_token_ids for r in chosen])
            index = self._index(repetition_rows)[:, None]
            penalty = self._tensor([r.sampling_params.repetition_penalty for r in chosen])
            values = logits[index, ids]
            penalized = torch.where(
                values > 0, values / penalty[:, None], values * penalty[:, None]
            )
            # Repeated ids write the same value (gathered before writing), so order is moot.
            logits[index, ids] = penalized

        count_rows = [
            i
            for i, r in enumerate(requests)
            if r.output_token_ids
            and (
                r.sampling_params.frequency_penalty != 0 or r.sampling_params.presence_penalty != 0
            )
        ]
        if count_rows:
            chosen = [requests[i] for i in count_rows]
            vocab_size = logits.shape[1]
            # Padding is vocab_size: it sorts last and never counts as a real id.
            ids = self._padded_ids([r.output_token_ids for r in chosen], pad=vocab_size)
            ids = ids.sort(dim=-1).values
            # Occurrences of each id in its row: the width of its run in the sorted row.
            counts = torch.searchsorted(ids, ids, right=True) - torch.searchsorted(ids, ids)
            frequency = self._tensor([r.sampling_params.frequency_penalty for r in chosen])
            presence = self._tensor([r.sampling_params.presence_penalty for r in chosen])
            penalty = frequency[:, None] * counts.to(torch.float32) + presence[:, None]
            # Padding then repeats the row's first (smallest) id with that id's penalty.
            is_pad = ids == vocab_size
            ids = torch.where(is_pad, ids[:, :1], ids)
            penalty = torch.where(is_pad, penalty[:, :1], penalty)
            index = self._index(count_rows)[:, None]
            logits[index, ids] = logits[index, ids] - penalty

    def _padded_ids(self, token_lists: list[list[int]], pad: int | None = None) -> torch.Tensor:
        """``[len(token_lists), longest]`` int64, padded with ``pad``, or when None with each
        row's own first id (so padding only repeats an id already there). No list is empty."""
        longest = max(len(t) for t in token_lists)
        padded = torch.empty((len(token_lists), longest), dtype=torch.long)
        for i, tokens in enumerate(token_lists):
            padded[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            padded[i, len(tokens) :] = tokens[0] if pad is None else pad
        return copy_to_device(padded, self.device)

    # ----------------------------------------------------------------------------------------
    # Random sampling

    def _sample(self, logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
        """Sample from ``logits [rows, vocab]`` (already penalized) for non-greedy ``requests``."""
        params = [r.sampling_params for r in requests]
        temperature = self._tensor([p.temperature for p in params])
        threshold = sampling_thresholds(
            logits,
            temperature,
            [p.top_k for p in params],
            [p.top_p for p in params],
            [p.min_p for p in params],
            self.sort_free,
        )
        uniform = torch.empty(len(requests), dtype=torch.float64, device=self.device)
        seeded = [i for i, p in enumerate(params) if p.seed is not None]
        if len(seeded) < len(params):
            uniform.uniform_(generator=self.generator)
        for i in seeded:
            uniform[i : i + 1].uniform_(generator=self._request_generator(requests[i]))
        # Weights exp((x - max) / T), zero below the row's threshold, drawn by inverse CDF:
        # on CUDA in one launch (the PyTorch form is some 35), on CPU in PyTorch.
        draw = sample_rows if logits.is_cuda else sample_rows_ref
        return draw(logits.contiguous(), 1.0 / temperature, threshold, uniform)

    def _request_generator(self, request: Request) -> torch.Generator:
        if request.generator is None:
            seed = request.sampling_params.seed
            assert seed is not None
            generator = torch.Generator(device=self.device)
            generator.manual_seed(seed + request.index)
            request.generator = generator
        return request.generator


def _logprob_tensors(
    logprobs: torch.Tensor, sampled_ids: torch.Tensor, num_top: list[int]
) -> tuple[torch.Tensor, ...]:
    """From ``logprobs [rows, vocab]`` (raw log-softmax) and each row's sampled id, on the
    device: the sampled tokens' logprobs and 1-based ranks, and the rows' top
    ``max(num_top)`` logprobs and ids when any row asks for some."""
    sampled_logprobs = logprobs.gather(1, sampled_ids[:, None])[:, 0]
    sampled_ranks = (logprobs > sampled_logprobs[:, None]).sum(dim=-1) + 1
    max_top = max(num_top)
    if max_top == 0:
        return (sampled_logprobs, sampled_ranks)
    values, ids = logprobs.topk(max_top, dim=-1)
    return (sampled_logprobs, sampled_ranks, values, ids)


def _logprob_rows(
    sampled_ids: list[int],
    rows: list[int],
    parts: tuple[torch.Tensor, ...],
    num_top: list[int],
) -> list[dict[int, Logprob]]:
    """Per logprob row (``rows``, indices into ``sampled_ids``), the sampled token and the
    row's top-``num_top[i]`` tokens with their ranks, from ``_logprob_tensors``' values."""
    sampled_logprobs, sampled_ranks = parts[0].tolist(), parts[1].tolist()
    top_values = parts[2].tolist() if len(parts) > 2 else []
    top_ids = parts[3].tolist() if len(parts) > 2 else []
    out: list[dict[int, Logprob]] = []
    for i, row_index in enumerate(rows):
        token_id = sampled_ids[row_index]
        row = {token_id: Logprob(logprob=sampled_logprobs[i], rank=sampled_ranks[i])}
        for k in range(num_top[i]):
            if top_ids[i][k] not in row:
                row[top_ids[i][k]] = Logprob(logprob=top_values[i][k], rank=k + 1)
        out.append(row)
    return out


def _has_penalty(request: Request) -> bool:
    p = request.sampling_params
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0 or p.presence_penalty != 0


def sampling_thresholds(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: list[int],
    top_p: list[float],
    min_p: list[float],
    sort_free: bool = True,
) -> torch.Tensor:
    """Per row of ``logits [rows, vocab]`` (before temperature), the smallest logit that
    survives min-p, top-k and top-p at the row's ``temperature [rows]`` (> 0); -inf keeps all.

    ``top_k[i] == 0``, ``top_p[i] == 1`` and ``min_p[i] == 0`` disable a filter. Min-p keeps
    tokens with probability >= ``min_p`` times the row's highest. Top-k keeps every token whose
    logit is >= the k-th largest. Top-p keeps the most likely tokens until their probability
    (after min-p and top-k) sums to >= p. Being thresholds, ties at a boundary are all kept and
    nothing depends on how a sort orders equal values. On CUDA top-p (and top-k above 1024)
    is searched in Triton without sorting and without waiting for the GPU
    (``kernels.sampling_filters``), or with ``sort_free`` False in PyTorch (a sort of every
    top-p row: what benchmarks compare it with); on the CPU top-p looks at the top 64 logits,
    then the top 1024, and sorts only the rows those do not cover.
    """
    num_rows, vocab_size = logits.shape
    device = logits.device
    has_min_p = any(m > 0 for m in min_p)
    k_rows = [i for i, k in enumerate(top_k) if 0 < k < vocab_size]
    p_rows = [i for i, p in enumerate(top_p) if p < 1.0]
    # On CUDA top-k up to _TOP_K_BY_TOPK takes torch.topk (cheaper than the search from 32
    # rows up: BENCHMARKS.md, "The sampler's thresholds without a sort"); top-p and larger
    # top-k take the search.
    small_k = not k_rows or max(top_k[i] for i in k_rows) <= _TOP_K_BY_TOPK
    search = logits.is_cuda and sort_free and (bool(p_rows) or not small_k)
    threshold = torch.full((num_rows,), float("-inf"), device=device)

    if has_min_p and not search:
        # p_i >= min_p * p_max  <=>  x_i >= x_max + T * log(min_p)
        log_min_p = copy_to_device(torch.tensor(min_p, dtype=torch.float32).log(), device)
        threshold = torch.maximum(threshold, logits.amax(dim=-1) + temperature * log_min_p)

    if k_rows and not (search and not small_k):
        index = copy_to_device(torch.tensor(k_rows), device)
        k = copy_to_device(torch.tensor([top_k[i] for i in k_rows]), device)
        values = logits[index].topk(max(top_k[i] for i in k_rows), dim=-1).values
        kth = values.gather(1, (k - 1)[:, None])[:, 0]
        threshold[index] = torch.maximum(threshold[index], kth)

    if search:
        return filter_thresholds(
            logits,
            temperature,
            copy_to_device(torch.tensor(top_k, dtype=torch.int32), device),
            copy_to_device(torch.tensor(top_p, dtype=torch.float32), device),
            copy_to_device(torch.tensor(min_p, dtype=torch.float32).log(), device),
            has_top_k=not small_k,
            has_top_p=bool(p_rows),
            floor=threshold,
        )

    if p_rows:
        index = copy_to_device(torch.tensor(p_rows), device)
        rows = logits[index]
        scaled = (rows / temperature[index][:, None]).masked_fill_(
            rows < threshold[index][:, None], float("-inf")
        )
        p = copy_to_device(torch.tensor([top_p[i] for i in p_rows], dtype=torch.float64), device)
        # on CUDA a candidate check would wait for the GPU: sort the rows
        candidates = () if logits.is_cuda else _TOP_P_CANDIDATES
        boundary_ids = _top_p_boundary(scaled, p, candidates)
        threshold[index] = rows.gather(1, boundary_ids[:, None])[:, 0]
    return threshold


def _top_p_boundary(
    scaled: torch.Tensor, top_p: torch.Tensor, candidates: tuple[int, ...] = _TOP_P_CANDIDATES
) -> torch.Tensor:
    """Per row of ``scaled [rows, vocab]`` (logits / T, masked), the id of the least likely
    token among the most likely ones whose probabilities first sum to >= ``top_p [rows]``.
    Tries the top ``candidates`` in turn (64, then 1024) and sorts only the rows still
    uncovered; with none, sorts every row (nothing read back to the host)."""
    num_rows, vocab_size = scaled.shape
    log_total = torch.logsumexp(scaled, dim=-1, keepdim=True).double()
    boundary_ids = torch.empty(num_rows, dtype=torch.long, device=scaled.device)
    pending = torch.arange(num_rows, device=scaled.device)
    for num_candidates in (*candidates, vocab_size):
        rows = scaled[pending]
        if num_candidates >= vocab_size:
            values, ids = rows.sort(dim=-1, descending=True)
        else:
            values, ids = rows.topk(num_candidates, dim=-1)  # descending
        cumulative = torch.exp(values.double() - log_total[pending]).cumsum(dim=-1)
        p = top_p[pending][:, None]
        boundary = (cumulative < p).sum(dim=-1).clamp_(max=values.shape[1] - 1)
        boundary_ids[pending] = ids.gather(1, boundary[:, None])[:, 0]
        if num_candidates >= vocab_size:
            break
        uncovered = cumulative[:, -1] < p[:, 0]
        if not bool(uncovered.any()):
            break
        pending = pending[uncovered]
    return boundary_ids


def apply_sampling_filters(
    logits: torch.Tensor,
    top_k: list[int],
    top_p: list[float],
    min_p: list[float] | None = None,
    temperature: list[float] | None = None,
) -> torch.Tensor:
    """``logits [rows, vocab]`` with what min-p, top-k and top-p remove set to -inf (see
    ``sampling_thresholds``; temperature 1 unless given). Returns a new tensor."""
    num_rows = logits.shape[0]
    temps = torch.tensor(temperature or [1.0] * num_rows, dtype=torch.float32)
    threshold = sampling_thresholds(
        logits, temps.to(logits.device), top_k, top_p, min_p or [0.0] * num_rows
    )
    return logits.masked_fill(logits < threshold[:, None], float("-inf"))
