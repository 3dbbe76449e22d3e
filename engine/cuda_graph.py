"""CUDA graphs of engine steps: a few replays instead of hundreds of kernel launches.

Decode steps (``DecodeGraphs``) replay whole; steps with prefill tokens replay in pieces
between the attention calls (``PiecewiseGraphs``, below).

A decode-only step (every scheduled sequence adds one token) is padded to the next capture
size (vLLM's: 1, 2, 4, then multiples of 8 up to 512) and replayed from a graph captured the
first time that (size, KV split count) is seen. Inputs live in static buffers the graph
reads; padding rows write no cache slot (slot -1) and attend to nothing (``seq_len`` 0), so
they cost a little compute and change no real row. The graph ends at the final hidden
states; the LM head runs eagerly on the rows that sample (a graph's output stays allocated
while the graph lives, and [size, vocab] float32 logits per graph would add up). Other
steps (prefill tokens, more sequences than the largest size) replay piecewise graphs where
their token count fits those; the rest run eagerly, as does everything with
``enforce_eager=True`` and on CPU. Under tensor parallelism each rank holds its own graphs of
its shard, the all-reduces captured in them: the ranks take every step the same way
(``ModelRunner.execute_remote``), so they capture and replay in the same order and the
replayed collectives pair up.

The split count of the decode attention kernel depends on the step's longest context, a host
value baked into the graph, so it is part of the key: a graph is reused for any step of the
same size whose longest context picks the same count.
"""

from __future__ import annotations

import array
import bisect
import contextlib
from collections.abc import Callable
from dataclasses import replace

import torch

from engine.attention import AttentionMetadata
from engine.ops import Ops
from engine.transfer import copy_to_device

CAPTURE_SIZES = [1, 2, 4, *range(8, 513, 8)]


def put_rows(buf: list[int], at: int, rows: list[list[int]], width: int) -> None:
    """Write ``rows`` into ``buf`` from index ``at`` as a ``len(rows) x width`` row-major
    table; ``buf`` holds what goes past each row's end (the caller's padding)."""
    for i, row in enumerate(rows):
        buf[at + i * width : at + i * width + len(row)] = row


def host_tensor(values: list[int], typecode: str) -> torch.Tensor:
    """A CPU tensor of ``values`` through ``array.array`` (``"q"``: int64, ``"i"``: int32),
    about 3x faster than ``torch.tensor`` on a long list: a decode step's block tables hold
    every block of every sequence, rebuilt each step."""
    dtype = torch.int64 if typecode == "q" else torch.int32
    if not values:  # frombuffer refuses an empty buffer
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(array.array(typecode, values), dtype=dtype)


def to_device(values: list[int], typecode: str, device: torch.device) -> torch.Tensor:
    """``values`` on ``device`` (``typecode`` as in ``host_tensor``) without making the host
    wait for the GPU (``engine.transfer.copy_to_device``)."""
    return copy_to_device(host_tensor(values, typecode), device)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The padded batch sizes for an engine of ``max_num_seqs``: up to the first that holds it."""
    return CAPTURE_SIZES[: bisect.bisect_left(CAPTURE_SIZES, max_num_seqs) + 1]


def token_capture_sizes(max_tokens: int) -> list[int]:
    """The padded step sizes (tokens) of piecewise graphs: ``CAPTURE_SIZES``, then multiples
    of 64, up to the first that holds ``max_tokens``."""
    if max_tokens <= CAPTURE_SIZES[-1]:
        return capture_sizes(max_tokens)
    return [*CAPTURE_SIZES, *range(CAPTURE_SIZES[-1] + 64, max_tokens + 64, 64)]


# forward(input_ids, positions, meta) -> final hidden states [num_tokens, hidden_size]
Forward = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


class DecodeGraphs:
    """Captured decode steps of one model runner, keyed by (padded size, KV splits).

    ``num_splits(size, max_seq_len)`` is the decode kernel's split count for a step (the
    launcher's own rule). Graphs share one memory pool; they replay one at a time on the
    runner's stream.
    """

    def __init__(
        self,
        forward: Forward,
        num_splits: Callable[[int, int], int],
        device: torch.device,
        max_num_seqs: int,
        max_blocks_per_seq: int,
    ) -> None:
        self.forward = forward
        self.num_splits = num_splits
        self.device = device
        self.sizes = capture_sizes(max_num_seqs)
        self.max_blocks_per_seq = max_blocks_per_seq
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros((n, max_blocks_per_seq), dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None

    def padded_size(self, num_seqs: int, table_width: int) -> int | None:
        """The capture size a decode step of ``num_seqs`` runs at, or None (run it eagerly)."""
        if num_seqs > self.sizes[-1] or table_width > self.max_blocks_per_seq:
            return None
        return self.sizes[bisect.bisect_left(self.sizes, num_seqs)]

    def run(
        self,
        input_ids: list[int],
        positions: list[int],
        slots: list[int],
        seq_lens: list[int],
        tables: list[list[int]],
        size: int,
        gather: tuple[list[int], list[int], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Hidden states [size, hidden] of a decode step (rows past ``len(input_ids)`` are
        padding), in the graph's output buffer: valid until the next replay. ``gather``
        (rows, source rows, source): ``input_ids[rows[i]]`` is ``source[source rows[i]]``,
        a token sampled by the previous step and not read back yet; ``input_ids`` holds
        placeholders there."""
        n = len(input_ids)
        pad = [0] * (size - n)
        # padding rows write no slot (a stale one may be live) and read no key (length 0)
        rows = input_ids + pad + positions + pad + slots + [-1] * (size - n) + seq_lens + pad
        if gather is not None:  # tokens the previous step sampled, still on the device
            rows += gather[0] + gather[1]
        host = to_device(rows, "q", self.device)
        self.input_ids[:size].copy_(host[:size])
        self.positions[:size].copy_(host[size : 2 * size])
        self.slot_mapping[:size].copy_(host[2 * size : 3 * size])
        self.seq_lens[:size].copy_(host[3 * size : 4 * size])
        if gather is not None:
            k = len(gather[0])
            index = host[4 * size : 4 * size + k]
            self.input_ids.index_copy_(0, index, gather[2][host[4 * size + k :]])
        # Only the step's own rows and width: the kernels read a row's entries below its
        # seq_len only, so what earlier steps left past them is never read.
        width = max(map(len, tables))
        flat = [0] * (n * width)
        put_rows(flat, 0, tables, width)
        self.block_tables[:n, :width].copy_(to_device(flat, "i", self.device).view(n, width))
        max_seq_len = max(seq_lens)
        key = (size, self.num_splits(size, max_seq_len))
        if key not in self.graphs:
            self.graphs[key] = self._capture(size, max_seq_len)
        graph, hidden = self.graphs[key]
        graph.replay()
        return hidden

    def clear(self) -> None:
        """Drop every graph and their memory pool; later steps capture anew."""
        self.graphs.clear()
        self.pool = None  # a pool whose graphs are all freed cannot take a new capture

    def _capture(self, size: int, max_seq_len: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        meta = AttentionMetadata(
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size],
            slot_mapping=self.slot_mapping[:size],
            max_query_len=1,
            max_seq_len=max_seq_len,
        )
        ids, pos = self.input_ids[:size], self.positions[:size]
        # One eager run first: Triton compiles and autotunes outside the capture. It computes
        # this very step (its cache writes are the ones the replay repeats).
        self.forward(ids, pos, meta)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        # thread_local: other threads (an engine loop's callers) may touch CUDA meanwhile.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            hidden = self.forward(ids, pos, meta)
        return graph, hidden


# forward(input_ids, positions, meta, ops) -> final hidden states, the layer ops given
OpsForward = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata, Ops], torch.Tensor]


class PiecewiseGraphs:
    """Steps with prefill tokens (chunks, extends, decodes mixed) of up to ``max_tokens``
    tokens, replayed from CUDA graphs captured in pieces between the attention calls (vLLM's
    piecewise CUDA graphs).

    Everything in a layer but the attention kernel depends only on the number of tokens,
    so a step is padded to the next capture size (``token_capture_sizes``) and
    its linears, norms, rotary embedding and cache writes replay from one graph per piece:
    from the embedding to the first attention, between consecutive attentions, and from the
    last one to the final norm. The attention kernel, whose grid and tiles follow the step's
    sequences, runs eagerly between the pieces on the real tokens only: each piece ends by
    copying the rotated queries into a static buffer it reads, and the next piece starts
    from the static buffer it writes. Padding tokens write no cache slot (slot -1) and are
    never attended; they cost their rows of compute. The graphs of one size replay in the
    order they were captured and no two sizes interleave, so all share one memory pool,
    captured on one stream and the largest size first (``run``) so that later sizes reuse
    its blocks.

    ``forward`` runs the model with the layer ops it is given; ``ops.paged_attention`` is
    the eager attention.
    """

    def __init__(self, forward: OpsForward, ops: Ops, device: torch.device, max_tokens: int):
        self.forward = forward
        self.ops = ops
        self.device = device
        self.sizes = token_capture_sizes(max_tokens)
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        # [n, num_heads, head_dim] each, allocated at the first attention call
        self.query: torch.Tensor | None = None
        self.out: torch.Tensor | None = None
        # size -> (piece graphs, the attention calls between them, final hidden states)
        self.graphs: dict[int, tuple[list[torch.cuda.CUDAGraph], list[tuple], torch.Tensor]] = {}
        self.pool = None
        self._split_ops = replace(ops, paged_attention=self._attention)
        self._num_tokens = 0  # the real tokens of the step being run eagerly
        self._capturing: tuple[list, list] | None = None  # (graphs, attention calls)
        self._stream: torch.cuda.Stream | None = None  # the capture stream

    def padded_size(self, num_tokens: int) -> int | None:
        """The capture size a step of ``num_tokens`` runs at, or None (run it eagerly)."""
        if num_tokens > self.sizes[-1]:
            return None
        return self.sizes[bisect.bisect_left(self.sizes, num_tokens)]

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, size: int
    ) -> torch.Tensor:
        """Hidden states [size, hidden] of a step (rows past ``len(input_ids)`` are padding),
        in the graphs' output buffer: valid until the next replay. The step's tensors are
        on the device; its slots are ``meta.slot_mapping``."""
        if not self.graphs and size != self.sizes[-1]:
            # The largest size first, on no tokens at all (every slot -1, no attention):
            # the pool's blocks, freed after each capture, are then large enough for every
            # later size. Captured smallest first, each larger size would need new blocks
            # while the smaller ones' stay reserved (several GiB at 8B up to 2048 tokens).
            self.slot_mapping.fill_(-1)
            self.graphs[self.sizes[-1]] = self._capture(self.sizes[-1], meta, 0)
        n = input_ids.shape[0]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)  # padding rows keep stale ids and positions
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:size].fill_(-1)  # padding rows must write no slot
        if size not in self.graphs:
            self.graphs[size] = self._capture(size, meta, n)
        pieces, calls, hidden = self.graphs[size]
        assert self.query is not None and self.out is not None
        for graph, (key_cache, value_cache, scale, window) in zip(pieces[:-1], calls, strict=True):
            graph.replay()
            self.ops.paged_attention(
                self.query[:n], key_cache, value_cache, meta.query_start_loc, meta.seq_lens,
                meta.block_tables, scale, meta.max_query_len, meta.max_seq_len, window,
                out=self.out[:n],
            )  # fmt: skip
        pieces[-1].replay()
        return hidden

    def clear(self) -> None:
        """Drop every graph and their memory pool; later steps capture anew."""
        self.graphs.clear()
        self.pool = None

    def _attention(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_tables: torch.Tensor,
        scale: float,
        max_query_len: int,
        max_seq_len: int,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        """``ops.paged_attention`` as the model sees it while a size is run eagerly and then
        captured: the queries go into the static buffer; eagerly the attention runs on the
        real tokens, under capture the piece ends there and the next one begins."""
        size = query.shape[0]
        if self.query is None or self.query.shape[1:] != query.shape[1:]:
            shape = (self.sizes[-1], *query.shape[1:])
            self.query = torch.zeros(shape, dtype=query.dtype, device=self.device)
            self.out = torch.zeros(shape, dtype=query.dtype, device=self.device)
        assert self.out is not None
        self.query[:size].copy_(query)
        if self._capturing is None:
            n = self._num_tokens
            self.ops.paged_attention(
                self.query[:n], key_cache, value_cache, query_start_loc, seq_lens, block_tables,
                scale, max_query_len, max_seq_len, sliding_window, out=self.out[:n],
            )  # fmt: skip
        else:
            pieces, calls = self._capturing
            pieces[-1].capture_end()
            calls.append((key_cache, value_cache, scale, sliding_window))
            pieces.append(self._begin())
        return self.out[:size]

    def _begin(self) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (an engine loop's callers) may touch CUDA meanwhile.
        graph.capture_begin(self.pool, capture_error_mode="thread_local")
        return graph

    def _capture(
        self, size: int, meta: AttentionMetadata, num_tokens: int
    ) -> tuple[list[torch.cuda.CUDAGraph], list[tuple], torch.Tensor]:
        fwd_meta = replace(meta, slot_mapping=self.slot_mapping[:size])
        ids, pos = self.input_ids[:size], self.positions[:size]
        # One eager run first: Triton compiles outside the capture. It computes this very
        # step (its cache writes are the ones the replay repeats).
        self._num_tokens = num_tokens
        self.forward(ids, pos, fwd_meta, self._split_ops)
        torch.cuda.synchronize(self.device)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        pieces: list[torch.cuda.CUDAGraph] = []
        calls: list[tuple] = []
        # One capture stream for every size: the caching allocator reuses a freed block
        # only for the stream it was allocated on, so a stream per size would keep each
        # size's blocks to itself.
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        self._capturing = (pieces, calls)
        try:
            with torch.cuda.stream(stream):
                pieces.append(self._begin())
                try:
                    hidden = self.forward(ids, pos, fwd_meta, self._split_ops)
                except BaseException:
                    with contextlib.suppress(Exception):  # the stream must leave capture
                        pieces[-1].capture_end()
                    raise
                pieces[-1].capture_end()
        except BaseException:
            # Start the next capture afresh: a new stream (a failed capture may leave the
            # allocator routing this one to the pool), and a new pool if no graph holds it.
            self._stream = None
            if not self.graphs:
                self.pool = None
            raise
        finally:
            self._capturing = None
        torch.cuda.current_stream(self.device).wait_stream(stream)
        return pieces, calls, hidden
