"""filter_thresholds (Triton; interpreter on CPU) and filter_thresholds_ref against the
filters' definitions written here in float64: min-p's ``max + T * log(min_p)``, the k-th
largest logit, and top-p's boundary, the logit of the first token (most likely first) at
which the cumulative weight exp((x - max) / T), zero below the min-p and top-k threshold,
reaches p times the total. Top-p's result may instead be a neighbour's logit only where p
times the total lies within 1e-6 of the total from the cumulative weight between them (the
kernel sums a slice's weights in float32)."""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernels' import (jit decoration)

from kernels.sampling_filters import filter_thresholds, filter_thresholds_ref  # noqa: E402


def filters(rows: int, vocab: int, seed: int, device: str = "cpu", scale: float = 3.0):
    """Logits with -inf holes and ties, temperatures 0.3-2, and every mix of the filters:
    top-k from 1 to the vocabulary (off at 0 and >= vocab), top-p from 0.1 to 0.99 (off at
    1), min-p from 0.01 to 1 (off at 0)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * scale
    logits[torch.rand(rows, vocab, generator=gen) < 0.05] = float("-inf")  # min_tokens masks
    logits[:, 0] = torch.randn(rows, generator=gen).abs() * scale  # no row is all holes
    logits[1::4, 5:40:3] = logits[1::4, 5:6]  # repeated values
    temperature = 0.3 + 1.7 * torch.rand(rows, generator=gen)
    choices_k = torch.tensor([0, 1, 2, 5, 17, 50, vocab - 1, vocab, vocab + 3])
    top_k = choices_k[torch.randint(0, len(choices_k), (rows,), generator=gen)]
    choices_p = torch.tensor([1.0, 0.1, 0.5, 0.75, 0.9, 0.95, 0.99])
    top_p = choices_p[torch.randint(0, len(choices_p), (rows,), generator=gen)]
    choices_min_p = torch.tensor([0.0, 0.0, 0.01, 0.1, 0.5, 1.0])
    min_p = choices_min_p[torch.randint(0, len(choices_min_p), (rows,), generator=gen)]
    tensors = logits, temperature, top_k.int(), top_p, min_p.log()
    return tuple(t.to(device) for t in tensors)


def check_against_definition(logits, temperature, top_k, top_p, log_min_p, got, tol=1e-6):
    logits, temperature, top_k, top_p, log_min_p = (
        t.cpu() for t in (logits, temperature, top_k, top_p, log_min_p)
    )
    vocab = logits.shape[1]
    for row, value in enumerate(got.cpu().tolist()):
        v = logits[row].sort(descending=True).values
        t = temperature[row]
        threshold = float(v[0] + t * log_min_p[row])  # float32, as the filters compute it
        k = int(top_k[row])
        if 0 < k < vocab:
            threshold = max(threshold, float(v[k - 1]))
        if float(top_p[row]) >= 1.0:
            # min-p's may round differently under fused multiply-adds: within an ulp
            assert math.isclose(value, threshold, rel_tol=2**-22) or value == threshold, (
                f"row {row}: {value}, by definition {threshold} (min-p {log_min_p[row]}, top-k {k})"
            )
            continue
        vd = v.double()
        w = torch.exp((vd - vd[0]) / float(t))
        w[v < threshold] = 0.0
        cumulative = w.cumsum(0)
        goal = float(top_p[row]) * float(cumulative[-1])
        slack = tol * float(cumulative[-1])
        before = torch.cat([torch.zeros(1, dtype=torch.float64), cumulative[:-1]])
        # j is a boundary when the weight before it is short of the goal and at it reaches it
        allowed = ((before < goal + slack) & (cumulative >= goal - slack) & (w > 0)).nonzero()
        values = {float(v[j]) for j in allowed.flatten().tolist()}
        want = float(v[int((cumulative < goal).sum())])
        assert want in values
        assert value in values, (
            f"row {row}: {value}, by definition {want} (top-p {float(top_p[row])}, top-k {k}, "
            f"min-p threshold {threshold}); cumulative weight at {value}: "
            f"{float(cumulative[v >= value][-1]) if (v >= value).any() else None} "
            f"against {goal}"
        )


@pytest.mark.parametrize(
    ("vocab", "slice_size"), [(50, 4096), (1000, 256), (2500, 512), (2500, 4096)]
)
def test_kernel_and_reference_by_the_definition(vocab, slice_size):
    args = filters(24, vocab, seed=vocab + slice_size)
    got = filter_thresholds(*args, slice_size=slice_size)
    ref = filter_thresholds_ref(*args)
    check_against_definition(*args, got)
    check_against_definition(*args, ref)


@pytest.mark.parametrize("has", ["top-k", "top-p", "min-p"])
def test_searches_left_out_where_no_row_needs_them(has):
    logits, temperature, top_k, top_p, log_min_p = filters(12, 700, seed=5)
    if has != "top-k":
        top_k = torch.zeros_like(top_k)
    if has != "top-p":
        top_p = torch.ones_like(top_p)
    args = logits, temperature, top_k, top_p, log_min_p
    got = filter_thresholds(*args, has_top_k=has == "top-k", has_top_p=has == "top-p",
                            slice_size=256)  # fmt: skip
    check_against_definition(*args, got)
    assert torch.equal(got, filter_thresholds(*args, slice_size=256))


def test_flat_rows_and_exact_ties():
    """A flat row keeps nearly everything under top-p; equal logits at the boundary are all
    kept (the threshold is their value)."""
    logits = torch.zeros(3, 600)
    logits[0] = torch.randn(600) * 1e-3
    logits[1, :300] = 1.0  # 300 tied at the top: p = 0.5 needs 150 of them, so all 300
    logits[2] = torch.arange(600, dtype=torch.float32) % 7  # seven values, each many times
    temperature = torch.tensor([1.0, 1.0, 0.5])
    top_k = torch.tensor([0, 0, 100], dtype=torch.int32)
    top_p = torch.tensor([0.9, 0.5, 0.8])
    log_min_p = torch.full((3,), float("-inf"))
    args = logits, temperature, top_k, top_p, log_min_p
    got = filter_thresholds(*args, slice_size=256)
    check_against_definition(*args, got)
    assert got[1] == 1.0 and (logits[1] >= got[1]).sum() == 300
    assert torch.equal(got, filter_thresholds_ref(*args))


def test_contiguous_float32_only():
    logits = torch.randn(2, 64, dtype=torch.float16)
    one = torch.ones(2)
    with pytest.raises(ValueError, match="float32"):
        filter_thresholds(logits, one, one.int(), one, one)


@pytest.mark.gpu
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per-step"])
def test_kernel_on_cuda_by_the_definition(persistent):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for scale, seed in ((0.02, 1), (3.0, 2)):  # a random model's flat rows, peaked ones
        args = filters(32, 128256, seed=seed, device="cuda", scale=scale)
        got = filter_thresholds(*args, persistent=persistent)
        check_against_definition(*args, got)
        check_against_definition(*args, filter_thresholds_ref(*args))


@pytest.mark.gpu
def test_persistent_launch_with_more_programs_than_fit_at_once():
    """600 rows x 126 slices of 1024 are far more programs than the GPU holds at once: rows
    run as their programs start (tickets), and the counters are left at zero for the next
    launch, also one captured in a CUDA graph."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    args = filters(600, 128256, seed=3, device="cuda")
    first = filter_thresholds(*args, slice_size=1024, persistent=True)
    check_against_definition(*args, first)
    assert torch.equal(filter_thresholds(*args, slice_size=1024, persistent=True), first)
    check_against_definition(*args, filter_thresholds(*args))  # a launch per step
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = filter_thresholds(*args, slice_size=1024, persistent=True)
    for _ in range(2):
        graph.replay()
        assert torch.equal(captured, first)
