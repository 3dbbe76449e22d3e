"""The sampler: turns one step's logits into one token per row, vectorized over the batch.

Order of processing follows vLLM: raw logprobs are captured first (log-softmax of the
unprocessed logits), then ``min_tokens`` masking, repetition / frequency / presence penalties,
then greedy rows take the argmax; sampled rows go through temperature, min-p, top-k, top-p and
an exponential race (``argmax(probs / q)``, ``q ~ Exp(1)``), which draws exactly one noise
vector per row, so a seeded row's sample depends only on its own generator and logits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from engine.outputs import Logprob
from engine.request import Request

# Exp(1) draws are clamped to this so that ``probs / q`` stays finite (no 0 / 0 = NaN).
_MIN_NOISE = torch.finfo(torch.float32).tiny


@dataclass
class SamplerOutput:
    """One step's samples.

    ``logprobs[i]`` is None unless ``requests[i].sampling_params.logprobs`` is set; then it maps
    the sampled token and the top-``logprobs`` tokens of the raw distribution to their
    ``Logprob`` (``decoded_token`` left None: the engine fills the text).
    """

    sampled_token_ids: list[int]
    logprobs: list[dict[int, Logprob] | None]


class Sampler:
    """Samples the next token of every row of a batch of logits.

    ``seed`` seeds the generator shared by unseeded rows (random when None). While a request
    has fewer than ``min_tokens`` outputs, its ``eos_token_id``, ``eos_token_ids`` (every id
    that ends a generation) and its stop token ids are masked. Requests with
    ``sampling_params.seed`` get their own ``torch.Generator`` on ``device``, created on first
    use and stored in ``request.generator`` (seeded with ``seed + request.index`` so that the
    ``n`` sequences of one seeded request differ); that is the only change made to a request.
    """

    def __init__(
        self, device: torch.device | str, seed: int | None = None, eos_token_ids: Iterable[int] = ()
    ) -> None:
        self.device = torch.device(device)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.generator = torch.Generator(device=self.device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, requests: Sequence[Request]) -> SamplerOutput:
        """Sample one token per row. ``logits [num_rows, vocab]`` (any float dtype), row ``i``
        belongs to ``requests[i]``. ``logits`` itself is not modified."""
        if logits.dim() != 2 or logits.shape[0] != len(requests):
            raise ValueError(
                f"logits must be [num_rows, vocab] with one row per request; got shape "
                f"{tuple(logits.shape)} for {len(requests)} requests"
            )
        num_rows = len(requests)
        if num_rows == 0:
            return SamplerOutput([], [])
        params = [r.sampling_params for r in requests]
        logits = logits.to(device=self.device, dtype=torch.float32, copy=True)

        logprob_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        raw_logprobs = None
        if logprob_rows:
            raw_logprobs = torch.log_softmax(logits[self._index(logprob_rows)], dim=-1)

        logits = self._process(logits, requests)

        sampled_ids = torch.empty(num_rows, dtype=torch.long, device=self.device)
        greedy_rows = [i for i, p in enumerate(params) if p.is_greedy]
        random_rows = [i for i, p in enumerate(params) if not p.is_greedy]
        if greedy_rows:
            index = self._index(greedy_rows)
            sampled_ids[index] = logits[index].argmax(dim=-1)
        if random_rows:
            index = self._index(random_rows)
            sampled_ids[index] = self._sample(logits[index], [requests[i] for i in random_rows])

        logprobs: list[dict[int, Logprob] | None] = [None] * num_rows
        if raw_logprobs is not None:
            rows = self._gather_logprobs(
                raw_logprobs,
                sampled_ids[self._index(logprob_rows)],
                [params[i].logprobs for i in logprob_rows],
            )
            for i, row in zip(logprob_rows, rows, strict=True):
                logprobs[i] = row
        return SamplerOutput(sampled_token_ids=sampled_ids.tolist(), logprobs=logprobs)

    # ----------------------------------------------------------------------------------------
    # Logit processing (in place on the float32 copy)

    def process_logits(self, logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
        """The logits that greedy rows take the argmax of: a float32 copy of ``logits
        [num_rows, vocab]`` with ``min_tokens`` masking and the penalties applied."""
        logits = logits.to(device=self.device, dtype=torch.float32, copy=True)
        return self._process(logits, requests)

    def _process(self, logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
        self._apply_min_tokens(logits, requests)
        self._apply_penalties(logits, requests)
        return logits

    def _index(self, rows: list[int]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.long).to(self.device, non_blocking=True)

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
        multiplied); frequency and presence penalties over output tokens
        (``logits -= frequency * count + presence * (count > 0)``)."""
        rows = [
            i
            for i, r in enumerate(requests)
            if r.sampling_params.repetition_penalty != 1.0
            or r.sampling_params.frequency_penalty != 0.0
            or r.sampling_params.presence_penalty != 0.0
        ]
        if not rows:
            return
        vocab_size = logits.shape[1]
        chosen = [requests[i] for i in rows]
        index = self._index(rows)
        sub = logits[index]  # [num_penalized, vocab]

        output_counts = self._token_counts([r.output_token_ids for r in chosen], vocab_size)
        repetition = torch.tensor(
            [r.sampling_params.repetition_penalty for r in chosen], dtype=torch.float32
        ).to(self.device)
        if bool((repetition != 1.0).any()):
            prompt_counts = self._token_counts([r.prompt_token_ids for r in chosen], vocab_size)
            seen = (prompt_counts + output_counts) > 0
            penalty = torch.where(seen, repetition[:, None], torch.ones_like(sub))
            sub = torch.where(sub > 0, sub / penalty, sub * penalty)
        frequency = torch.tensor(
            [r.sampling_params.frequency_penalty for r in chosen], dtype=torch.float32
        ).to(self.device)
        presence = torch.tensor(
            [r.sampling_params.presence_penalty for r in chosen], dtype=torch.float32
        ).to(self.device)
        sub = sub - frequency[:, None] * output_counts
        sub = sub - presence[:, None] * (output_counts > 0).to(torch.float32)
        logits[index] = sub

    def _token_counts(self, token_lists: list[list[int]], vocab_size: int) -> torch.Tensor:
        """``[len(token_lists), vocab_size]`` float32 counts of each token id per list."""
        max_len = max((len(t) for t in token_lists), default=0)
        counts = torch.zeros(len(token_lists), vocab_size + 1, device=self.device)
        if max_len == 0:
            return counts[:, :vocab_size]
        # Padding goes to an extra column that is dropped afterwards.
        padded = torch.full((len(token_lists), max_len), vocab_size, dtype=torch.long)
        for i, tokens in enumerate(token_lists):
            if tokens:
                padded[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        padded = padded.to(self.device).clamp_(0, vocab_size)
        counts.scatter_add_(1, padded, torch.ones(padded.shape, device=self.device))
        return counts[:, :vocab_size]

    # ----------------------------------------------------------------------------------------
    # Random sampling

    def _sample(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """Sample from ``logits [rows, vocab]`` (already penalized) for non-greedy ``requests``."""
        params = [r.sampling_params for r in requests]
        temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
        logits = logits / temperature.to(self.device)[:, None]

        min_p = [p.min_p for p in params]
        if any(m > 0 for m in min_p):
            probs = torch.softmax(logits, dim=-1)
            threshold = torch.tensor(min_p, dtype=torch.float32).to(self.device)[:, None]
            threshold = threshold * probs.max(dim=-1, keepdim=True).values
            logits = logits.masked_fill(probs < threshold, float("-inf"))

        logits = apply_top_k_top_p(logits, [p.top_k for p in params], [p.top_p for p in params])

        probs = torch.softmax(logits, dim=-1)
        noise = torch.empty_like(probs)
        seeded = [i for i, p in enumerate(params) if p.seed is not None]
        if len(seeded) < len(params):
            noise.exponential_(generator=self.generator)
        for i in seeded:
            noise[i].exponential_(generator=self._request_generator(requests[i]))
        noise.clamp_(min=_MIN_NOISE)
        return (probs / noise).argmax(dim=-1)

    def _request_generator(self, request: Request) -> torch.Generator:
        if request.generator is None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(request.sampling_params.seed + request.index)
            request.generator = generator
        return request.generator

    # ----------------------------------------------------------------------------------------
    # Logprobs

    def _gather_logprobs(
        self, logprobs: torch.Tensor, sampled_ids: torch.Tensor, num_top: list[int]
    ) -> list[dict[int, Logprob]]:
        """``logprobs [rows, vocab]`` raw log-softmax; returns, per row, the sampled token and
        the row's top-``num_top[i]`` tokens with their 1-based ranks."""
        sampled_logprobs = logprobs.gather(1, sampled_ids[:, None])  # [rows, 1]
        sampled_ranks = (logprobs > sampled_logprobs).sum(dim=-1) + 1
        max_top = max(num_top)
        if max_top > 0:
            top_values, top_ids = logprobs.topk(max_top, dim=-1)
            top_values_list, top_ids_list = top_values.tolist(), top_ids.tolist()
        rows: list[dict[int, Logprob]] = []
        for i, (token_id, value, rank) in enumerate(
            zip(
                sampled_ids.tolist(),
                sampled_logprobs[:, 0].tolist(),
                sampled_ranks.tolist(),
                strict=True,
            )
        ):
            row = {token_id: Logprob(logprob=value, rank=rank)}
            for k in range(num_top[i]):
                top_id = top_ids_list[i][k]
                if top_id not in row:
                    row[top_id] = Logprob(logprob=top_values_list[i][k], rank=k + 1)
            rows.append(row)
        return rows


def apply_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Mask ``logits [rows, vocab]`` to each row's top-k and top-p set (returns a new tensor).

    ``top_k[i] == 0`` and ``top_p[i] == 1`` disable a filter. Top-k keeps every token whose
    logit is >= the k-th largest (ties at the boundary are kept). Top-p keeps the smallest set
    of most likely tokens whose probabilities sum to >= p (the most likely token always stays):
    it drops the least likely tokens whose cumulative probability is <= 1 - p.
    """
    vocab_size = logits.shape[1]
    k_list = [k if 0 < k < vocab_size else 0 for k in top_k]
    has_top_k = any(k > 0 for k in k_list)
    has_top_p = any(p < 1.0 for p in top_p)
    if not has_top_k and not has_top_p:
        return logits
    device = logits.device
    k = torch.tensor([k if k > 0 else vocab_size for k in k_list], dtype=torch.long).to(device)
    if not has_top_p:
        # Only top-k: topk of the largest k is cheaper than a full sort.
        top_values = logits.topk(max(k_list), dim=-1).values
        kth = top_values.gather(1, (k.clamp(max=top_values.shape[1]) - 1)[:, None])
        no_limit = (k >= vocab_size)[:, None]
        return logits.masked_fill((logits < kth) & ~no_limit, float("-inf"))

    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=False)
    if has_top_k:
        kth = sorted_logits.gather(1, (vocab_size - k)[:, None])
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    p = torch.tensor(top_p, dtype=torch.float32).to(device)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= (1 - p)[:, None]
    drop[:, -1] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, sorted_ids, sorted_logits)
