"""A request's state inside the engine: counters, with everything else derived."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from engine.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    """Where a request is in its life. Everything above PREEMPTED is finished."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        return {
            RequestStatus.FINISHED_STOPPED: "stop",
            RequestStatus.FINISHED_LENGTH_CAPPED: "length",
            RequestStatus.FINISHED_ABORTED: "abort",
        }.get(self)


@dataclass(eq=False)
class Request:
    """One sequence being generated (a request with ``n > 1`` becomes ``n`` of these).

    ``num_computed_tokens`` counts tokens whose K/V are in the cache; the tokens still to run
    through the model are ``all_token_ids[num_computed_tokens:]``. ``max_tokens`` is resolved
    (never None). ``blocks`` is the request's block table, owned by the scheduler.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_tokens: int
    eos_token_id: int | None = None
    priority: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    prompt: str | None = None
    # n > 1: the id the caller knows and this sequence's index among the n.
    parent_id: str | None = None
    index: int = 0

    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    # Tokens sampled on the device by a step whose results the host has not read back yet
    # (asynchronous scheduling: 0 or 1). The next step already computes them.
    num_pending_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first schedule
    num_preemptions: int = 0
    blocks: list[Any] = field(default_factory=list)  # KVCacheBlock, owned by the scheduler
    block_ids: list[int] = field(default_factory=list)  # their ids, kept beside them
    block_hashes: list[int] = field(default_factory=list)  # prefix-cache keys of full blocks
    num_registered_blocks: int = 0  # leading blocks registered in the prefix cache
    leader: Request | None = None  # n > 1: wait for this sibling's prompt to be cached
    stop_reason: int | str | None = None

    # Sampling state: a per-request torch.Generator when seeded, logprobs when asked for.
    generator: Any = None
    cumulative_logprob: float = 0.0
    logprobs: list[dict] = field(default_factory=list)
    # Incremental detokenizer (engine.detokenizer.IncrementalDetokenizer), set by the engine.
    detokenizer: Any = None

    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids(self, start: int, end: int) -> list[int]:
        """``all_token_ids[start:end]`` without building the whole list (a decode step takes
        one token of a sequence that may hold thousands)."""
        num_prompt = len(self.prompt_token_ids)
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt : end - num_prompt]
        if end <= num_prompt:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - num_prompt]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_pending(self) -> int:
        """Tokens known and pending: what the scheduler schedules up to."""
        return self.num_tokens + self.num_pending_tokens

    def samples_after(self, num_new: int) -> bool:
        """Whether computing ``num_new`` more tokens reaches the end of the known and pending
        tokens, so the step's logits get a row to sample this request's next token from."""
        return self.num_computed_tokens + num_new == self.num_tokens_with_pending

    @property
    def is_prefill(self) -> bool:
        """True while prompt tokens (or, after preemption, recomputed ones) remain uncomputed."""
        if not self.output_token_ids and not self.num_pending_tokens:
            return True
        return self.num_computed_tokens < self.num_tokens_with_pending - 1

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def external_id(self) -> str:
        return self.parent_id if self.parent_id is not None else self.request_id
