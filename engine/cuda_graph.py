"""CUDA graphs of decode steps: one replay instead of hundreds of kernel launches.

A decode-only step (every scheduled sequence adds one token) is padded to the next capture
size (vLLM's: 1, 2, 4, then multiples of 8 up to 512) and replayed from a graph captured the
first time that (size, KV split count) is seen. Inputs live in static buffers the graph
reads; padding rows write no cache slot (slot -1) and attend to nothing (``seq_len`` 0), so
they cost a little compute and change no real row. The graph ends at the final hidden
states; the LM head runs eagerly on the rows that sample (a graph's output stays allocated
while the graph lives, and [size, vocab] float32 logits per graph would add up). Steps with
prefill tokens, more sequences than the largest size, or tensor parallelism run eagerly, as
does everything with ``enforce_eager=True`` and everything on CPU.

The split count of the decode attention kernel depends on the step's longest context, a host
value baked into the graph, so it is part of the key: a graph is reused for any step of the
same size whose longest context picks the same count.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import torch

from engine.attention import AttentionMetadata

CAPTURE_SIZES = [1, 2, 4, *range(8, 513, 8)]


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The padded batch sizes for an engine of ``max_num_seqs``: up to the first that holds it."""
    return CAPTURE_SIZES[: bisect.bisect_left(CAPTURE_SIZES, max_num_seqs) + 1]


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
    ) -> torch.Tensor:
        """Hidden states [size, hidden] of a decode step (rows past ``len(input_ids)`` are
        padding), in the graph's output buffer: valid until the next replay."""
        n = len(input_ids)
        host = torch.zeros((4, size), dtype=torch.int64)
        host[0, :n] = torch.tensor(input_ids)
        host[1, :n] = torch.tensor(positions)
        host[2].fill_(-1)  # padding rows must write no slot: a stale one may be live
        host[2, :n] = torch.tensor(slots)
        host[3, :n] = torch.tensor(seq_lens)  # padding rows: 0, no key read
        host = host.to(self.device)
        self.input_ids[:size].copy_(host[0])
        self.positions[:size].copy_(host[1])
        self.slot_mapping[:size].copy_(host[2])
        self.seq_lens[:size].copy_(host[3])
        # Only the step's own rows and width: the kernels read a row's entries below its
        # seq_len only, so what earlier steps left past them is never read.
        width = max(map(len, tables))
        table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        self.block_tables[:n, :width].copy_(table)
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
