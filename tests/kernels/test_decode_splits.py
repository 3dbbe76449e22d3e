"""The decode split-count rule gives the counts measured fastest on the H200 (132 SMs;
``benchmarks/bench_decode_splits.py``, BENCHMARKS.md), and only splits decode on CUDA."""

from __future__ import annotations

import pytest
import torch

import kernels.paged_attention as pa

# batch -> splits at context 512, 1024, 2048, 4096, 8192 (Llama-3-8B: 8 KV heads)
H200_SPLITS = {
    1: [8, 16, 32, 32, 32],
    2: [8, 16, 16, 16, 16],
    4: [8, 8, 8, 8, 16],
    8: [4, 4, 4, 8, 8],
    12: [4, 4, 4, 4, 4],
    16: [2, 2, 4, 4, 4],
    24: [2, 2, 2, 2, 2],
    32: [1, 2, 2, 2, 2],
    64: [1, 1, 1, 1, 1],
}


# The same where the decode kernel reads K/V by TMA: doubled down to 64 positions per split
# and up to 6 programs per SM, no split under 32 positions.
H200_SPLITS_TMA = {
    1: [16, 32, 32, 64, 64],
    2: [16, 16, 32, 32, 32],
    4: [8, 16, 16, 16, 16],
    8: [8, 8, 8, 8, 8],
    12: [8, 8, 8, 8, 8],
    16: [4, 4, 4, 4, 4],
    24: [4, 4, 4, 4, 4],
    32: [2, 2, 2, 2, 2],
    64: [1, 1, 1, 1, 1],
}


@pytest.mark.parametrize("tma_block", [0, 16])
@pytest.mark.parametrize("batch", sorted(H200_SPLITS))
def test_split_counts_on_an_h200(monkeypatch, batch, tma_block):
    monkeypatch.setattr(pa, "num_sms", lambda device: 132)
    cuda = torch.device("cuda")  # only its type is read
    got = [
        pa.default_num_kv_splits(batch, 8, 1, ctx, cuda, tma_block)
        for ctx in (512, 1024, 2048, 4096, 8192)
    ]
    assert got == (H200_SPLITS_TMA if tma_block else H200_SPLITS)[batch]


def test_no_split_off_cuda_prefill_or_short_contexts(monkeypatch):
    monkeypatch.setattr(pa, "num_sms", lambda device: 132)
    cuda = torch.device("cuda")
    assert pa.default_num_kv_splits(1, 8, 1, 8192, torch.device("cpu")) == 1
    assert pa.default_num_kv_splits(1, 8, 2, 8192, cuda) == 1  # a prefill chunk in the step
    assert pa.default_num_kv_splits(1, 8, 1, 100, cuda) == 1  # under two 64-position splits
    assert pa.default_num_kv_splits(1, 1, 1, 1 << 20, cuda) == 64  # the cap
