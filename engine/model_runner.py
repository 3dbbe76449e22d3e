"""Runs one step: all scheduled tokens of all sequences in one flattened forward pass.

``build_runner`` loads a model (or, under tensor parallelism, this rank's shard of it) and
sizes its KV cache; the engine process and the tensor-parallel rank workers both use it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from engine.attention import AttentionMetadata
from engine.config import EngineConfig
from engine.cuda_graph import (
    DecodeGraphs,
    PiecewiseGraphs,
    put_rows,
    to_device,
    token_capture_sizes,
)
from engine.distributed import TensorParallel
from engine.loader import ModelFiles, load_model_files
from engine.models.config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.ops import Ops, ops_for_device
from engine.request import Request
from engine.scheduler import SchedulerOutput

CPU_DEFAULT_KV_CACHE_BYTES = 1 << 30


@dataclass
class _Step:
    """One step's tokens flattened, as host lists (``ModelRunner.flatten``)."""

    input_ids: list[int]
    positions: list[int]
    slots: list[int]
    starts: list[int]  # query_start_loc
    seq_lens: list[int]
    tables: list[list[int]]
    logit_rows: list[int]
    max_query_len: int
    # Placeholders in input_ids for tokens the previous step sampled (``PendingTokens``):
    # their flat positions and their rows in the previous step's samples.
    gather_at: list[int] = field(default_factory=list)
    gather_rows: list[int] = field(default_factory=list)


@dataclass
class PendingTokens:
    """Tokens sampled by the step before, still on the device (asynchronous scheduling):
    ``token_ids [rows]`` and, for each request with a pending token, its row there."""

    token_ids: torch.Tensor
    rows: dict[Request, int]


class ModelRunner:
    """Owns the model and the KV cache tensors; turns a ``SchedulerOutput`` into logits.

    Under tensor parallelism rank 0's ``execute`` broadcasts the step's inputs and the other
    ranks call ``execute_remote`` in a loop; only rank 0 gets logits.
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
        ops: Ops,
        tp: TensorParallel | None = None,
    ) -> None:
        self.model = model
        self.device = device
        self.dtype = dtype
        self.block_size = block_size
        self.ops = ops
        self.tp = tp or TensorParallel(device=device)
        # This rank's KV heads (all of them without tensor parallelism).
        shape = (num_blocks, block_size, model.num_local_kv_heads, model.config.head_dim)
        # Per layer: key_cache and value_cache [num_blocks, block_size, num_kv_heads, head_dim].
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(shape, dtype=dtype, device=device),
            )
            for _ in range(model.config.num_hidden_layers)
        ]
        self.graphs: DecodeGraphs | None = None  # enable_cuda_graphs
        self.piecewise: PiecewiseGraphs | None = None

    def enable_cuda_graphs(
        self, max_num_seqs: int, max_model_len: int, max_capture_tokens: int = 2048
    ) -> None:
        """Replay decode steps of up to ``max_num_seqs`` sequences from CUDA graphs, and
        other steps of up to ``max_capture_tokens`` tokens from piecewise ones (between the
        attention calls; 0: none) (``engine.cuda_graph``); on CPU steps stay eager. Under
        tensor parallelism every rank does this with the same settings and takes each step
        the same way (``execute``, ``execute_remote``), so the ranks capture and replay the
        same graphs in the same order and the all-reduces captured in them pair up."""
        if self.device.type != "cuda":
            return
        if max_capture_tokens > 0:
            self.piecewise = PiecewiseGraphs(
                self._hidden_states_with, self.ops, self.device, max_capture_tokens
            )
        from kernels.paged_attention import _tma_block, default_num_kv_splits

        kv_heads = self.model.num_local_kv_heads
        tma_block = _tma_block(*self.kv_caches[0])

        def num_splits(num_seqs: int, max_seq_len: int) -> int:
            return default_num_kv_splits(num_seqs, kv_heads, 1, max_seq_len, self.device, tma_block)

        self.graphs = DecodeGraphs(
            self._hidden_states, num_splits, self.device, max_num_seqs,
            -(-max_model_len // self.block_size),
        )  # fmt: skip

    def reset_cuda_graphs(self) -> None:
        """Drop the captured graphs (after swapping modules, say); later steps capture anew.
        Not under tensor parallelism: the other ranks would keep theirs, and rank 0's next
        capture would no longer pair its collectives with theirs."""
        if self.tp.is_enabled:
            raise RuntimeError("reset_cuda_graphs is for single-GPU engines only")
        self.release_cuda_graphs()

    def release_cuda_graphs(self) -> None:
        """Free every captured graph now. Each rank does this before it leaves the process
        group: NCCL's communicator teardown waits until every graph that captured one of
        its collectives is destroyed, so a graph still alive then would hang the shutdown."""
        for graphs in (self.graphs, self.piecewise):
            if graphs is not None:
                graphs.clear()
        if self.device.type == "cuda":
            # Graphs held in reference cycles are destroyed now, not later. No synchronize:
            # a graph still running is destroyed when it ends, and a rank waiting on a peer
            # that failed must still reach the bounded teardown (``RankWorkers.stop``).
            gc.collect()

    def flatten(self, sched: SchedulerOutput, pending: PendingTokens | None = None) -> _Step:
        """The step's tokens, flattened, as host lists. A request's pending token (sampled
        by the step before, not read back yet) gets a placeholder and a ``gather`` entry."""
        bs = self.block_size
        step = _Step([], [], [], [0], [], [], [], max(n for _, n in sched.scheduled))
        for req, num_new in sched.scheduled:
            start = req.num_computed_tokens
            end = start + num_new
            known = req.num_tokens
            if end > known:  # only the last token can be pending (a decode of one token)
                assert pending is not None and end == known + 1, "a pending token has no source"
                step.input_ids.extend(req.token_ids(start, known))
                step.gather_at.append(len(step.input_ids))
                step.gather_rows.append(pending.rows[req])
                step.input_ids.append(0)
            else:
                step.input_ids.extend(req.token_ids(start, end))
            step.positions.extend(range(start, end))
            block_ids = req.block_ids
            for b in range(start // bs, (end - 1) // bs + 1):  # a run of slots per block
                base = block_ids[b] * bs - b * bs
                step.slots.extend(range(base + max(start, b * bs), base + min(end, b * bs + bs)))
            step.starts.append(step.starts[-1] + num_new)
            step.seq_lens.append(end)
            step.tables.append(block_ids)
            if req.samples_after(num_new):
                step.logit_rows.append(step.starts[-1] - 1)
        return step

    def prepare(
        self, sched: SchedulerOutput
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Flatten the step's tokens; returns input_ids, positions, metadata, logit rows."""
        step = self.flatten(sched)
        return (*self._tensors(step), step.logit_rows)

    def _tensors(
        self, step: _Step, pending: PendingTokens | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """The step on the device, in two copies: the per-token rows (int64) and the
        per-sequence ones (int32: query_start_loc, seq_lens and the block tables, each
        starting 16-byte aligned, as kernels specialize on it). Pending tokens are gathered
        into the input ids on the device."""
        s = len(step.seq_lens)
        width = max(len(t) for t in step.tables)
        lens_at = -(-(s + 1) // 4) * 4
        tables_at = lens_at + -(-s // 4) * 4
        ints = [0] * (tables_at + s * width)
        ints[: s + 1] = step.starts
        ints[lens_at : lens_at + s] = step.seq_lens
        put_rows(ints, tables_at, step.tables, width)
        n = len(step.input_ids)
        k = len(step.gather_at)
        tokens = to_device(
            step.input_ids + step.positions + step.slots + step.gather_at + step.gather_rows,
            "q",
            self.device,
        )
        ids = tokens[:n]
        if k:
            assert pending is not None
            ids.index_copy_(0, tokens[3 * n : 3 * n + k], pending.token_ids[tokens[3 * n + k :]])
        rows = to_device(ints, "i", self.device)
        meta = AttentionMetadata(
            query_start_loc=rows[: s + 1],
            seq_lens=rows[lens_at : lens_at + s],
            block_tables=rows[tables_at:].view(s, width),
            slot_mapping=tokens[2 * n : 3 * n],
            max_query_len=step.max_query_len,
            max_seq_len=max(step.seq_lens),
        )
        return ids, tokens[n : 2 * n], meta

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput, pending: PendingTokens | None = None) -> torch.Tensor:
        """Run the step; float32 logits [num_sampling_rows, vocab] for the requests that sample
        (those whose scheduled tokens reach the end of their known and pending tokens), in
        batch order. ``pending``: the tokens the step before sampled that the host has not
        read back (asynchronous scheduling); nothing here waits for the GPU. Under tensor
        parallelism the step's inputs go to the other ranks first."""
        step = self.flatten(sched, pending)
        rows = to_device(step.logit_rows, "q", self.device)
        tensors = None
        if self.tp.is_enabled:
            tensors = self._tensors(step, pending)
            self.tp.send_step(*tensors, rows)
        hidden = self._decode_graph(step, pending)
        if hidden is None:
            hidden = self._hidden(*(tensors or self._tensors(step, pending)))
        logits = self._logits(hidden, rows)
        assert logits is not None  # rank 0 always gets the gathered logits
        return logits

    @torch.inference_mode()
    def execute_remote(self) -> bool:
        """Ranks > 0: run the step rank 0 broadcasts, the way rank 0 runs it (the same decode
        graph, piecewise graphs or eager launches); False when it says shut down."""
        received = self.tp.recv_step()
        if received is None:
            return False
        ids, pos, meta, rows = received
        hidden = None
        graphs = self.graphs
        if (
            graphs is not None
            and meta.max_query_len == 1
            and graphs.padded_size(ids.numel(), meta.block_tables.shape[1]) is not None
        ):
            # the host lists a decode graph's inputs are copied from (block table rows come
            # padded to the step's width, which a graph reads no further than seq_len)
            step = _Step(
                ids.tolist(), pos.tolist(), meta.slot_mapping.tolist(), [],
                meta.seq_lens.tolist(), meta.block_tables.tolist(), [], 1,
            )  # fmt: skip
            hidden = self._decode_graph(step)
        if hidden is None:
            hidden = self._hidden(ids, pos, meta)
        self._logits(hidden, rows)
        return True

    def _decode_graph(
        self, step: _Step, pending: PendingTokens | None = None
    ) -> torch.Tensor | None:
        """Hidden states of a decode-only step from its CUDA graph (rows past the step's
        sequences are padding), or None where no graph takes the step."""
        if self.graphs is None or step.max_query_len != 1:
            return None
        size = self.graphs.padded_size(len(step.input_ids), max(map(len, step.tables)))
        if size is None:
            return None
        gather = None
        if step.gather_at:
            assert pending is not None
            gather = (step.gather_at, step.gather_rows, pending.token_ids)
        return self.graphs.run(
            step.input_ids, step.positions, step.slots, step.seq_lens, step.tables, size, gather
        )

    def _hidden(
        self, ids: torch.Tensor, pos: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Hidden states of a step from piecewise graphs where its tokens fit a capture size
        (a step with prefill tokens, or a decode no graph holds), else eagerly."""
        if self.piecewise is not None:
            size = self.piecewise.padded_size(ids.numel())
            if size is not None:
                return self.piecewise.run(ids, pos, meta, size)
        return self._hidden_states(ids, pos, meta)

    def shutdown_workers(self) -> None:
        """Rank 0: end the other ranks' ``execute_remote`` loops."""
        if self.tp.is_enabled:
            self.tp.send_shutdown()

    def _hidden_states(
        self, ids: torch.Tensor, pos: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        return self._hidden_states_with(ids, pos, meta, self.ops)

    def _hidden_states_with(
        self, ids: torch.Tensor, pos: torch.Tensor, meta: AttentionMetadata, ops: Ops
    ) -> torch.Tensor:
        return self.model(ids, pos, self.kv_caches, meta, ops)

    def _logits(self, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
        """Float32 logits of the sampling ``rows`` of ``hidden`` (None on ranks > 0)."""
        if rows.numel() == 0:  # a step of prompt chunks that all end short of sampling
            return hidden.new_empty((0, self.model.config.vocab_size), dtype=torch.float32)
        return self.model.compute_logits(hidden[rows])


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def init_dummy_weights(model: torch.nn.Module, seed: int) -> None:
    """Random weights in place (``load_format="dummy"``): norms 1, the rest N(0, 0.02)."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, param in model.named_parameters():
        if "norm" in name:
            param.data.fill_(1.0)
        else:
            param.data.normal_(0.0, 0.02, generator=gen)


def kv_cache_bytes(config: EngineConfig, device: torch.device, mcfg: ModelConfig) -> int:
    """The KV cache budget of one rank: the configured bytes, or what the GPU has left."""
    if config.kv_cache_memory_bytes is not None:
        return config.kv_cache_memory_bytes
    if device.type != "cuda":
        return CPU_DEFAULT_KV_CACHE_BYTES
    free, total = torch.cuda.mem_get_info(device)
    used = total - free
    # Room for one step's activations: the largest layer intermediates and the logits; and,
    # with CUDA graphs, for the piecewise graphs' memory pool, which holds the same
    # intermediates for steps of up to max_cudagraph_capture_size tokens beside the eager
    # steps' cached blocks.
    per_token = (4 * mcfg.intermediate_size + 8 * mcfg.hidden_size) * 4
    capture = config.piecewise_capture_tokens()
    graph_tokens = token_capture_sizes(capture)[-1] if capture > 0 else 0  # rounded up
    activation_bytes = (
        (config.max_num_batched_tokens + graph_tokens) * per_token
        + config.max_num_seqs * mcfg.vocab_size * 8
        + (512 << 20)
    )
    return max(0, int(total * config.gpu_memory_utilization) - used - activation_bytes)


@dataclass
class LoadedModel:
    """What ``build_runner`` found besides the runner."""

    files: ModelFiles
    model_config: ModelConfig
    weight_format: str  # "gptq" | "awq" | "gguf-q4_1" | "dense" | "dummy"
    num_kv_blocks: int
    block_bytes: int
    device: torch.device
    dtype: torch.dtype
    ops: Ops
    max_model_len: int  # the config's, or the model's own limit


def _check_same_multiprocessors(tp: TensorParallel, device: torch.device) -> None:
    """ValueError on every rank unless all ranks' GPUs have as many multiprocessors: a decode
    graph's key holds the attention kernel's split count, which follows from that number, and
    ranks whose keys differed would capture (running collectives eagerly) where others
    replay, and hang."""
    from kernels.pdl import num_sms

    sms = num_sms(device)
    fewest, most = tp.min_int(sms), -tp.min_int(-sms)
    if fewest != most:
        raise ValueError(
            f"tensor-parallel CUDA graphs need GPUs with the same number of multiprocessors, "
            f"got {fewest} to {most} across the ranks; set enforce_eager=True"
        )


def resolve_max_model_len(config: EngineConfig, mcfg: ModelConfig) -> int:
    """The config's ``max_model_len``, or the model's own limit; ValueError beyond it."""
    max_model_len = config.max_model_len or mcfg.max_position_embeddings
    if max_model_len > mcfg.max_position_embeddings:
        raise ValueError(
            f"max_model_len {max_model_len} exceeds the model's "
            f"max_position_embeddings {mcfg.max_position_embeddings}"
        )
    return max_model_len


def build_runner(config: EngineConfig, tp: TensorParallel) -> tuple[ModelRunner, LoadedModel]:
    """Load the model (this rank's shard of it) and allocate its KV cache; with CUDA graphs
    unless ``enforce_eager`` (on every rank: their graphs' collectives must pair up).

    The number of KV blocks is the smallest any rank can hold, so all ranks agree.
    Raises ``ValueError`` for a model that cannot be split ``tp.world_size`` ways.
    """
    device = tp.device if tp.is_enabled else config.resolve_device()
    dtype = config.resolve_dtype(device)
    files = load_model_files(config.model)
    mcfg = ModelConfig.from_hf_config(files.hf_config)
    max_model_len = resolve_max_model_len(config, mcfg)
    with _default_dtype(dtype), torch.device(device):
        model = LlamaForCausalLM(mcfg, tp)
    model.cos_sin_cache = model.cos_sin_cache.float()
    if config.load_format == "dummy":
        init_dummy_weights(model, config.seed + tp.rank)
        weight_format = "dummy"
    else:
        # INT4 hook: GPTQ/AWQ checkpoints and (on CUDA) GGUF Q4_1 go into Int4Linear modules.
        from engine.quant.loading import load_weights

        weight_format = load_weights(model, files, device, dtype)
    model.eval()
    if device.type == "cpu":
        # oneDNN with weights packed once: faster than F.linear at decode row counts.
        model.pack_linears_for_cpu()
    block_bytes = (
        2
        * mcfg.num_hidden_layers
        * config.block_size
        * model.num_local_kv_heads
        * mcfg.head_dim
        * dtype.itemsize
    )
    num_blocks = tp.min_int(kv_cache_bytes(config, device, mcfg) // block_bytes)
    ops = ops_for_device(device)
    runner = ModelRunner(model, num_blocks, config.block_size, device, dtype, ops, tp)
    if tp.is_enabled and device.type == "cuda" and not config.enforce_eager:
        _check_same_multiprocessors(tp, device)
    if not config.enforce_eager:  # CUDA graphs (a no-op on CPU), every rank alike
        runner.enable_cuda_graphs(
            config.max_num_seqs, max_model_len, config.piecewise_capture_tokens()
        )
    loaded = LoadedModel(
        files, mcfg, weight_format, num_blocks, block_bytes, device, dtype, ops, max_model_len
    )
    return runner, loaded
