"""Continuous batching: the batch is rebuilt every step under a token budget."""

from __future__ import annotations

import bisect
import itertools
import time
from dataclasses import dataclass, field

from engine.kv_cache_manager import KVCacheManager
from engine.request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    """What runs this step: (request, number of its new tokens), in batch order."""

    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Decides which requests run each step and how many tokens each computes.

    Order is (priority, arrival): a lower priority value runs first, FCFS within a priority,
    as in vLLM. When blocks run out the worst running request (highest priority value, latest
    arrival) is preempted: its blocks are freed and it recomputes later.
    """

    def __init__(
        self,
        kv_manager: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
    ) -> None:
        self.kv = kv_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: list[Request] = []  # sorted by _key
        self.running: list[Request] = []
        self._seq = itertools.count()
        self._order: dict[str, int] = {}
        self.num_preemptions_total = 0

    def _key(self, req: Request) -> tuple[int, float, int]:
        return (req.priority, req.arrival_time, self._order[req.request_id])

    def add_request(self, req: Request) -> None:
        self._order[req.request_id] = next(self._seq)
        self._insert_waiting(req)

    def _insert_waiting(self, req: Request) -> None:
        bisect.insort(self.waiting, req, key=self._key)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def schedule(self) -> SchedulerOutput:
        # Invariant: every running request holds blocks for all of its computed tokens plus the
        # tokens scheduled for it now; the step's tokens fit max_num_batched_tokens and at most
        # max_num_seqs requests run. Running requests are served before waiting ones, each in
        # (priority, arrival) order, so decodes never stall behind a long prompt: a prompt
        # takes what budget is left, in chunks.
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        self.running.sort(key=self._key)
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if _pending_is_last(req):
                i += 1
                continue
            num_new = min(req.num_tokens_with_pending - req.num_computed_tokens, budget)
            while not self.kv.allocate_slots(req, num_new):
                victim = self.running.pop()  # the worst running request
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            else:
                out.scheduled.append((req, num_new))
                budget -= num_new
                i += 1

        if out.preempted:
            return out  # blocks are short: admit nobody new this step
        skipped: list[Request] = []
        while self.waiting and budget > 0:
            req = self.waiting[0]
            leader = req.leader
            if leader is not None and not leader.is_finished and leader.is_prefill:
                skipped.append(self.waiting.pop(0))  # share the sibling's prompt blocks later
                continue
            if _pending_is_last(req):  # preempted with its last token in flight
                skipped.append(self.waiting.pop(0))
                continue
            computed = self.kv.get_computed_blocks(req) if req.num_computed_tokens == 0 else []
            num_computed = req.num_computed_tokens + len(computed) * self.kv.block_size
            num_new = min(req.num_tokens_with_pending - num_computed, budget)
            if len(self.running) >= self.max_num_seqs or not self.kv.can_fit(
                req, num_new, computed
            ):
                freed = self._preempt_for(req, out)
                if freed is None:
                    break
                budget += freed
                continue
            self.waiting.pop(0)
            self.kv.allocate_slots(req, num_new, computed)
            req.num_computed_tokens = num_computed
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.monotonic()
                req.num_cached_tokens = num_computed
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append((req, num_new))
            budget -= num_new
        for req in skipped:
            self._insert_waiting(req)
        return out

    def _preempt_for(self, req: Request, out: SchedulerOutput) -> int | None:
        """Preempt the worst running request if ``req`` outranks it; return tokens refunded."""
        if not self.running:
            return None
        victim = max(self.running, key=self._key)
        if self._key(victim) <= self._key(req):
            return None
        self.running.remove(victim)
        refunded = 0
        for j, (r, n) in enumerate(out.scheduled):
            if r is victim:
                refunded = n
                del out.scheduled[j]
                break
        self._preempt(victim)
        out.preempted.append(victim)
        return refunded

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = RequestStatus.PREEMPTED
        self.num_preemptions_total += 1
        self._insert_waiting(req)

    def update_after_step(self, out: SchedulerOutput) -> list[Request]:
        """Advance computed counters and cache full blocks; return requests that now sample.

        A request that finished since the step was scheduled (it stopped on the token the step
        before sampled, read back only now under asynchronous scheduling, or was aborted) is
        skipped: its blocks are gone and its step's token is discarded."""
        sampling = []
        for req, num_new in out.scheduled:
            if req.is_finished:
                continue
            req.num_computed_tokens += num_new
            self.kv.cache_full_blocks(req)
            if req.num_computed_tokens == req.num_tokens_with_pending:
                sampling.append(req)
        return sampling

    def finish(self, req: Request, status: RequestStatus) -> None:
        """Remove a request (running or waiting) and free its blocks."""
        req.status = status
        req.finished_time = time.monotonic()
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req)
        self._order.pop(req.request_id, None)


def _pending_is_last(req: Request) -> bool:
    """The request's pending token (asynchronous scheduling) is its last one (``max_tokens``,
    which also keeps it within the model's length): the request ends when that token is read
    back, so there is nothing left to compute for it."""
    return req.num_pending_tokens > 0 and req.num_output_tokens + req.num_pending_tokens >= (
        req.max_tokens
    )
