"""The engine: requests in, one scheduled forward pass per ``step()``, finished outputs out."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.block_pool import BlockPool
from engine.config import EngineConfig, RuntimeInfo
from engine.detokenizer import IncrementalDetokenizer
from engine.distributed import RankWorkers, TensorParallel, start_rank_workers
from engine.kv_cache_manager import KVCacheManager, cdiv
from engine.loader import load_model_files
from engine.model_runner import PendingTokens, build_runner, resolve_max_model_len
from engine.models.config import ModelConfig
from engine.models.llama import check_tensor_parallel
from engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from engine.request import Request, RequestStatus
from engine.sampler import PendingSample, Sampler
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.transfer import copy_to_device


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's counters and gauges."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_preemptions_total: int
    prefix_cache_queries_total: int  # tokens looked up in the prefix cache
    prefix_cache_hits_total: int  # tokens found there
    prompt_tokens_total: int
    generation_tokens_total: int


@dataclass
class _Inflight:
    """A step whose samples are launched on the device and not read back yet."""

    requests: list[Request]
    sample: PendingSample


@dataclass
class PreparedRequest:
    """A request checked and tokenized, not yet in the scheduler (safe to build off-thread)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int
    priority: int
    arrival_time: float


class LLMEngine:
    """Loads a model and runs continuous batching over it.

    ``add_request`` / ``abort`` / ``step`` are the step API; a thread that wants to submit
    concurrently uses ``engine.engine_loop.EngineLoop``. Not thread-safe by itself.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._rank_workers: RankWorkers | None = None
        tp = TensorParallel(device=config.resolve_device())
        if config.tensor_parallel_size > 1:
            # Ranks 1..N-1 start first so every rank loads its shard at the same time; what
            # would fail on every rank fails here, before they are spawned.
            mcfg = ModelConfig.from_hf_config(load_model_files(config.model).hf_config)
            check_tensor_parallel(mcfg, config.tensor_parallel_size)
            resolve_max_model_len(config, mcfg)
            self._rank_workers = start_rank_workers(config)
            tp = self._rank_workers.tp
        try:
            self._init_rank0(config, tp)
        except BaseException:
            self.shutdown()
            raise

    def _init_rank0(self, config: EngineConfig, tp: TensorParallel) -> None:
        self.runner, loaded = build_runner(config, tp)
        device, dtype = loaded.device, loaded.dtype
        self.model_config = loaded.model_config
        self.tokenizer = loaded.files.tokenizer
        self.generation_config = loaded.files.generation_config
        self.weight_format = loaded.weight_format
        mcfg = self.model_config

        max_model_len = loaded.max_model_len
        block_bytes = loaded.block_bytes
        num_blocks = loaded.num_kv_blocks
        if num_blocks < cdiv(2, config.block_size) + 1:
            raise ValueError(
                f"the KV cache budget holds only {num_blocks} blocks of {block_bytes} bytes; "
                "raise kv_cache_memory_bytes or gpu_memory_utilization"
            )
        ops = loaded.ops
        self.runtime = RuntimeInfo(
            device=device,
            dtype=dtype,
            max_model_len=max_model_len,
            num_kv_blocks=num_blocks,
            block_size=config.block_size,
            attention_backend=ops.name,
        )
        self.pool = BlockPool(num_blocks, enable_caching=config.enable_prefix_caching)
        self.scheduler = Scheduler(
            KVCacheManager(self.pool, config.block_size),
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
        )
        eos = set(getattr(self.tokenizer, "eos_token_ids", set()) or set())
        for source in (mcfg.eos_token_id, self.generation_config.get("eos_token_id")):
            if isinstance(source, int):
                eos.add(source)
            elif isinstance(source, list):
                eos.update(source)
        self.eos_token_ids = eos
        self.sampler = Sampler(device, seed=config.seed, eos_token_ids=eos)
        self._inflight: _Inflight | None = None
        self.async_scheduling = config.resolve_async_scheduling(device)
        self._parents: dict[str, list[Request]] = {}
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0

    def shutdown(self) -> None:
        """Stop the tensor-parallel rank workers (no-op with tensor_parallel_size=1)."""
        workers, self._rank_workers = self._rank_workers, None
        if workers is None:
            return
        runner = getattr(self, "runner", None)
        if runner is not None:
            try:
                runner.shutdown_workers()
                runner.release_cuda_graphs()  # before the process group goes (``stop``)
            finally:
                workers.stop()
        else:  # rank 0 failed before its runner existed: the workers cannot be told
            for proc in workers.processes:
                proc.kill()
            workers.stop()

    @property
    def async_scheduling(self) -> bool:
        """Whether ``step`` launches the next step before reading back the previous one."""
        return self._async

    @async_scheduling.setter
    def async_scheduling(self, value: bool) -> None:
        """Switch between steps; refused while a step's samples are still in flight."""
        if self._inflight is not None:
            raise RuntimeError("a step's samples are in flight: step until they are read back")
        self._async = bool(value)

    @property
    def max_model_len(self) -> int:
        return self.runtime.max_model_len

    # ----------------------------------------------------------------------------- requests
    def prepare_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        add_special_tokens: bool = True,
    ) -> PreparedRequest:
        """Tokenize and check a request without touching engine state (thread-safe).

        Raises ``ValueError`` for an empty prompt, token ids outside the vocabulary, or a
        request that can never fit: prompt + max_tokens beyond ``max_model_len`` or beyond the
        whole KV cache.
        """
        params = params or SamplingParams()
        if isinstance(prompt, str):
            text: str | None = prompt
            token_ids = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        else:
            text, token_ids = None, list(prompt)
        if not token_ids:
            raise ValueError(f"request {request_id!r}: the prompt is empty")
        vocab = self.model_config.vocab_size
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(
                f"request {request_id!r}: token ids {bad[:5]} are outside the vocabulary "
                f"[0, {vocab})"
            )
        num_prompt = len(token_ids)
        limit = self.max_model_len
        if num_prompt >= limit:
            raise ValueError(
                f"request {request_id!r}: the prompt (length {num_prompt}) is longer than the "
                f"maximum model length of {limit} (it must leave room for at least one token)"
            )
        max_tokens = params.max_tokens if params.max_tokens is not None else limit - num_prompt
        if num_prompt + max_tokens > limit:
            raise ValueError(
                f"request {request_id!r}: prompt ({num_prompt} tokens) + max_tokens ({max_tokens}) "
                f"= {num_prompt + max_tokens} exceeds the maximum model length of {limit}"
            )
        blocks_needed = cdiv(num_prompt + max_tokens, self.config.block_size)
        if blocks_needed > self.pool.num_blocks:
            raise ValueError(
                f"request {request_id!r}: prompt + max_tokens = {num_prompt + max_tokens} tokens "
                f"needs {blocks_needed} KV blocks but the whole cache has {self.pool.num_blocks} "
                f"({self.pool.num_blocks * self.config.block_size} tokens)"
            )
        return PreparedRequest(
            request_id, text, token_ids, params, max_tokens, priority, time.monotonic()
        )

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        add_special_tokens: bool = True,
    ) -> None:
        """Queue a request (``priority``: lower runs first). ``ValueError`` if it can never run."""
        self.add_prepared(
            self.prepare_request(request_id, prompt, params, priority, add_special_tokens)
        )

    def add_prepared(self, prep: PreparedRequest) -> None:
        if prep.request_id in self._parents:
            raise ValueError(f"request id {prep.request_id!r} is already in the engine")
        params = prep.params
        children: list[Request] = []
        for index in range(params.n):
            child_id = prep.request_id if params.n == 1 else f"{prep.request_id}#{index}"
            req = Request(
                request_id=child_id,
                prompt_token_ids=prep.prompt_token_ids,
                sampling_params=params,
                max_tokens=prep.max_tokens,
                eos_token_id=min(self.eos_token_ids) if self.eos_token_ids else None,
                priority=prep.priority,
                arrival_time=prep.arrival_time,
                prompt=prep.prompt,
                parent_id=prep.request_id,
                index=index,
                leader=children[0] if children and self.config.enable_prefix_caching else None,
            )
            if params.stop:
                req.detokenizer = IncrementalDetokenizer(
                    self.tokenizer, prep.prompt_token_ids, params
                )
            children.append(req)
            self.scheduler.add_request(req)
        self._parents[prep.request_id] = children

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request (all its ``n`` sequences); returns its output so far, if it was known."""
        children = self._parents.get(request_id)
        if children is None:
            return None
        for req in children:
            if not req.is_finished:
                self.scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
        return self._finish_parent(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self._parents)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._parents)

    # --------------------------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model, sample, update; returns the requests that finished.

        With asynchronous scheduling (``EngineConfig.async_scheduling``) a call launches step
        n + 1 before it reads back step n's samples, so the host's work between two steps
        (reading back and checking one step's tokens, scheduling and launching the next)
        runs while the GPU computes. Step n + 1 takes each request's step-n token on the
        device. A request that stops on that token has one token too many computed for it;
        that token is dropped and its row is not sampled. Stop checks and seeded draws are
        those of synchronous steps; the steps' composition can differ (a request that stops
        frees its blocks a step later), so unseeded rows, which draw from the generator the
        batch shares, and on the GPU the last bits of a row's logits, can differ too.
        """
        sched = self.scheduler.schedule()
        launched = None
        if not sched.is_empty:
            # the requests whose rows the step's logits hold, in batch order
            owners = [req for req, num_new in sched.scheduled if req.samples_after(num_new)]
            launched = sched, self.runner.execute(sched, self._pending_tokens()), owners
        outputs = self._read_back() if self._inflight is not None else []
        if launched is None:
            return outputs
        sched, logits, owners = launched
        sampling = self.scheduler.update_after_step(sched)
        for req, num_new in sched.scheduled:
            if req.output_token_ids == [] and req.num_computed_tokens <= req.num_prompt_tokens:
                self._prompt_tokens_total += num_new
        if not sampling:
            return outputs
        if len(sampling) < len(owners):  # some stopped on the token the step before sampled
            keep = [i for i, req in enumerate(owners) if not req.is_finished]
            assert len(keep) == len(sampling)
            logits = logits[copy_to_device(torch.tensor(keep), logits.device)]
        self._inflight = _Inflight(sampling, self.sampler.launch(logits, sampling))
        if self._async:
            for req in sampling:
                req.num_pending_tokens = 1
        else:
            outputs += self._read_back()
        return outputs

    def _pending_tokens(self) -> PendingTokens | None:
        inflight = self._inflight
        if inflight is None:
            return None
        rows = {req: i for i, req in enumerate(inflight.requests)}
        return PendingTokens(inflight.sample.token_ids, rows)

    def _read_back(self) -> list[RequestOutput]:
        """Wait for the step in flight's samples and apply them: append each token, check
        the stop conditions; returns the requests that finished."""
        inflight, self._inflight = self._inflight, None
        assert inflight is not None
        sampled = inflight.sample.result()
        now = time.monotonic()
        finished_parents: list[str] = []
        for i, req in enumerate(inflight.requests):
            req.num_pending_tokens = 0
            if req.is_finished:  # aborted while its token was in flight
                continue
            token = sampled.sampled_token_ids[i]
            req.output_token_ids.append(token)
            self._generation_tokens_total += 1
            if req.first_token_time is None:
                req.first_token_time = now
            lp = sampled.logprobs[i] if sampled.logprobs else None
            if lp is not None:
                req.logprobs.append(lp)
                req.cumulative_logprob += lp[token].logprob
            status = self._check_stop(req, token)
            if status is not None:
                self.scheduler.finish(req, status)
                parent = req.external_id
                if all(c.is_finished for c in self._parents[parent]):
                    finished_parents.append(parent)
        return [out for p in finished_parents if (out := self._finish_parent(p)) is not None]

    def _check_stop(self, req: Request, token: int) -> RequestStatus | None:
        params = req.sampling_params
        num_out = req.num_output_tokens
        if num_out >= params.min_tokens:
            if not params.ignore_eos and token in self.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if token in params.stop_token_ids:
                req.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
        if req.detokenizer is not None:
            stop = req.detokenizer.update([token], check_stop=num_out >= params.min_tokens)
            if stop is not None:
                req.stop_reason = stop
                return RequestStatus.FINISHED_STOPPED
        if num_out >= req.max_tokens or req.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        return None

    def _finish_parent(self, parent_id: str) -> RequestOutput | None:
        children = self._parents.pop(parent_id, None)
        if children is None:
            return None
        return self._make_output(parent_id, children)

    def _make_output(self, parent_id: str, children: list[Request]) -> RequestOutput:
        first = children[0]
        completions = []
        for req in children:
            params = req.sampling_params
            if req.detokenizer is not None:
                text = req.detokenizer.output_text
            else:
                text = self.tokenizer.decode(
                    req.output_token_ids, skip_special_tokens=params.skip_special_tokens
                )
            logprobs = None
            if params.logprobs is not None:
                logprobs = [
                    {
                        tid: Logprob(
                            lp.logprob,
                            lp.rank,
                            self.tokenizer.decode([tid], skip_special_tokens=False),
                        )
                        for tid, lp in pos.items()
                    }
                    for pos in req.logprobs
                ]
            completions.append(
                CompletionOutput(
                    index=req.index,
                    text=text,
                    token_ids=list(req.output_token_ids),
                    cumulative_logprob=req.cumulative_logprob
                    if params.logprobs is not None
                    else None,
                    logprobs=logprobs,
                    finish_reason=req.status.finish_reason,
                    stop_reason=req.stop_reason,
                )
            )
        metrics = RequestMetrics(
            arrival_time=first.arrival_time,
            first_scheduled_time=first.first_scheduled_time,
            first_token_time=min(
                (c.first_token_time for c in children if c.first_token_time), default=None
            ),
            finished_time=max((c.finished_time for c in children if c.finished_time), default=None),
            num_preemptions=sum(c.num_preemptions for c in children),
        )
        return RequestOutput(
            request_id=parent_id,
            prompt=first.prompt,
            prompt_token_ids=first.prompt_token_ids,
            outputs=completions,
            finished=True,
            metrics=metrics,
            num_cached_tokens=first.num_cached_tokens,
        )

    def stats(self) -> EngineStats:
        bs = self.config.block_size
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=self.pool.usage,
            num_preemptions_total=self.scheduler.num_preemptions_total,
            prefix_cache_queries_total=self.pool.num_cache_queries * bs,
            prefix_cache_hits_total=self.pool.num_cache_hits * bs,
            prompt_tokens_total=self._prompt_tokens_total,
            generation_tokens_total=self._generation_tokens_total,
        )
