"""Which padded batch size a decode step replays at (the CUDA capture itself is tested in
test_cuda_engine.py on a GPU)."""

from __future__ import annotations

import torch

from engine.cuda_graph import DecodeGraphs, capture_sizes


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
