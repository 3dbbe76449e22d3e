"""Which padded size a step replays at (the CUDA captures themselves are tested in
test_cuda_engine.py on a GPU)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.attention import AttentionMetadata
from engine.config import EngineConfig
from engine.cuda_graph import DecodeGraphs, PiecewiseGraphs, capture_sizes, token_capture_sizes
from engine.ops import REFERENCE_OPS


def test_capture_sizes_follow_vllm_up_to_the_first_that_holds_max_num_seqs():
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 4]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(10) == [1, 2, 4, 8, 16]
    sizes = capture_sizes(10_000)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 512
    assert all(b - a == 8 for a, b in zip(sizes[3:], sizes[4:], strict=False))


def test_padded_size_is_the_smallest_capture_size_that_holds_the_step():
    graphs = DecodeGraphs(
        forward=lambda *args: None, num_splits=lambda *args: 1, device=torch.device("cpu"),
        max_num_seqs=20, max_blocks_per_seq=8,
    )  # fmt: skip
    assert [graphs.padded_size(n, 1) for n in (1, 2, 3, 5, 8, 9, 17, 24)] == [
        1, 2, 4, 8, 8, 16, 24, 24,
    ]  # fmt: skip
    assert graphs.padded_size(25, 1) is None  # more sequences than the largest graph: eager
    assert graphs.padded_size(4, 9) is None  # a block table wider than the static one: eager
    assert graphs.block_tables.shape == (24, 8)


class _Replay:
    """Stands in for a captured graph: records the static inputs at each replay."""

    def __init__(self, graphs: DecodeGraphs) -> None:
        self.graphs, self.seen = graphs, []

    def replay(self) -> None:
        g = self.graphs
        self.seen.append((g.input_ids.clone(), g.positions.clone(), g.slot_mapping.clone(),
                          g.seq_lens.clone(), g.block_tables.clone()))  # fmt: skip


def test_run_fills_the_static_inputs_and_pads_with_no_slot_and_no_context():
    graphs = DecodeGraphs(
        forward=lambda *args: None, num_splits=lambda *args: 1, device=torch.device("cpu"),
        max_num_seqs=8, max_blocks_per_seq=4,
    )  # fmt: skip
    replay = _Replay(graphs)
    graphs.graphs[(4, 1)] = (replay, torch.zeros(4, 2))
    graphs.run([5, 6, 7], [40, 17, 2], [641, 272, 35], [41, 18, 3], [[1, 2, 40], [17, 9], [2]], 4)
    graphs.run([8, 9], [41, 18], [642, 273], [42, 19], [[1, 2, 40], [17, 9]], 4)
    ids, pos, slots, lens, tables = replay.seen[0]
    assert ids[:3].tolist() == [5, 6, 7] and pos[:3].tolist() == [40, 17, 2]
    assert slots[:4].tolist() == [641, 272, 35, -1] and lens[:4].tolist() == [41, 18, 3, 0]
    assert tables[:3, :3].tolist() == [[1, 2, 40], [17, 9, 0], [2, 0, 0]]
    ids, pos, slots, lens, tables = replay.seen[1]
    assert ids[:2].tolist() == [8, 9] and pos[:2].tolist() == [41, 18]
    # the third row is padding now: it writes no slot and reads no key
    assert slots[:4].tolist() == [642, 273, -1, -1] and lens[:4].tolist() == [42, 19, 0, 0]
    assert tables[:2, :3].tolist() == [[1, 2, 40], [17, 9, 0]]


def test_piecewise_sizes_pad_steps_in_tokens_and_go_past_512_in_steps_of_64():
    assert token_capture_sizes(40) == [1, 2, 4, 8, 16, 24, 32, 40]
    assert token_capture_sizes(512)[-1] == 512
    assert token_capture_sizes(1000)[-9:] == [512, 576, 640, 704, 768, 832, 896, 960, 1024]
    graphs = PiecewiseGraphs(
        forward=lambda *args: None, ops=REFERENCE_OPS, device=torch.device("cpu"),
        max_tokens=600,
    )  # fmt: skip
    sizes = [graphs.padded_size(n) for n in (1, 3, 9, 511, 513, 577, 640)]
    assert sizes == [1, 4, 16, 512, 576, 640, 640]
    assert graphs.padded_size(641) is None  # a larger step runs eagerly
    assert graphs.slot_mapping.shape == (640,) and bool((graphs.slot_mapping == -1).all())


def test_max_cudagraph_capture_size_must_not_be_negative():
    with pytest.raises(ValueError, match="max_cudagraph_capture_size must be >= 0"):
        EngineConfig(max_cudagraph_capture_size=-1)
    assert EngineConfig(max_cudagraph_capture_size=0).max_cudagraph_capture_size == 0


def test_piecewise_run_captures_the_largest_size_first_then_replays_around_attention():
    """The first step of a smaller size captures the largest size first, on no tokens (all
    slots -1), so later sizes fit in its freed pool blocks; then its own size, on the
    step's tokens with padding slots -1. A replay runs piece, attention on the real tokens,
    piece, ..., last piece (captures and replays stand in for CUDA here)."""
    events = []
    calls = [("k0", "v0", 0.5, None), ("k1", "v1", 0.5, None)]

    def attention(query, key_cache, *args, out):
        events.append(("attention", key_cache, query.shape[0], out.shape[0]))

    ops = replace(REFERENCE_OPS, paged_attention=attention)
    graphs = PiecewiseGraphs(forward=None, ops=ops, device=torch.device("cpu"), max_tokens=40)

    class Piece:
        def __init__(self, i: int) -> None:
            self.i = i

        def replay(self) -> None:
            events.append(("piece", self.i, graphs.slot_mapping[:8].tolist()))

    def capture(size, meta, num_tokens):
        events.append(("capture", size, num_tokens, graphs.slot_mapping.tolist()))
        graphs.query = torch.zeros(40, 2, 4)
        graphs.out = torch.zeros(40, 2, 4)
        return [Piece(0), Piece(1), Piece(2)], calls, torch.zeros(size, 3)

    graphs._capture = capture
    meta = AttentionMetadata(torch.tensor([0, 3]), torch.tensor([9]), torch.zeros(1, 1),
                             torch.tensor([5, 6, 7]), 3, 9)  # fmt: skip
    ids, pos = torch.tensor([11, 12, 13]), torch.tensor([6, 7, 8])
    hidden = graphs.run(ids, pos, meta, 4)
    assert hidden.shape == (4, 3)
    assert events[0] == ("capture", 40, 0, [-1] * 40)
    assert events[1][:3] == ("capture", 4, 3) and events[1][3][:5] == [5, 6, 7, -1, -1]
    assert events[2:] == [
        ("piece", 0, [5, 6, 7, -1, -1, -1, -1, -1]), ("attention", "k0", 3, 3),
        ("piece", 1, [5, 6, 7, -1, -1, -1, -1, -1]), ("attention", "k1", 3, 3),
        ("piece", 2, [5, 6, 7, -1, -1, -1, -1, -1]),
    ]  # fmt: skip
    assert graphs.input_ids[:3].tolist() == [11, 12, 13]
    events.clear()
    graphs.run(ids[:1], pos[:1], replace(meta, slot_mapping=torch.tensor([9])), 1)
    assert [e[:3] for e in events if e[0] == "capture"] == [("capture", 1, 1)]
    assert events[-1][:2] == ("piece", 2) and events[-1][2][:1] == [9]  # the size-1 graph's view
