"""sample_rows (Triton; interpreter on CPU) and sample_rows_ref against inverse-CDF sampling
written here from its definition in float64: weights exp((x - max) / T), zero below the
row's threshold, and the first token whose cumulative weight exceeds uniform * total. The
two may pick different tokens only where that target lies within rounding of the
cumulative weight between them."""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernels' import (jit decoration)

from kernels.sampling import sample_rows, sample_rows_ref  # noqa: E402


def draws(rows: int, vocab: int, seed: int, device: str = "cpu"):
    """Logits with -inf holes, temperatures 0.3-2, thresholds that keep all, a few or one
    token per row, and uniforms including both ends of [0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    logits[torch.rand(rows, vocab, generator=gen) < 0.05] = float("-inf")  # min_tokens masks
    logits[:, 0] = torch.randn(rows, generator=gen).abs() * 3  # no row is all holes
    temperature = 0.3 + 1.7 * torch.rand(rows, generator=gen)
    threshold = torch.full((rows,), float("-inf"))
    kth = logits.sort(dim=-1, descending=True).values
    threshold[1::3] = kth[1::3, 4]  # top-5 style
    threshold[2::6] = kth[2::6, 0]  # a single token
    uniform = torch.rand(rows, generator=gen, dtype=torch.float64)
    uniform[0] = 0.0
    uniform[-1] = 1.0 - 2.0**-53
    tensors = logits, 1.0 / temperature, threshold, uniform
    return tuple(t.to(device) for t in tensors)


def check_against_definition(logits, inv_t, threshold, uniform, got: list[int], tol=1e-9):
    logits, inv_t, threshold, uniform = (t.double().cpu() for t in (logits, inv_t, threshold,
                                                                     uniform))  # fmt: skip
    for row, token in enumerate(got):
        x = logits[row]
        w = torch.exp((x - x.max()) * inv_t[row])
        w[x < threshold[row]] = 0.0
        cdf = w.cumsum(0)
        target = float(uniform[row]) * float(cdf[-1])
        want = int((cdf > target).nonzero()[0])
        assert w[token] > 0, f"row {row}: token {token} has no weight"
        if token != want:  # only at a boundary within rounding
            lo, hi = min(token, want), max(token, want)
            for edge in (float(cdf[lo]), float(cdf[hi - 1])):
                assert math.isclose(edge, target, rel_tol=tol, abs_tol=tol * float(cdf[-1])), (
                    f"row {row}: token {token}, by definition {want}; cumulative weight "
                    f"{edge} against target {target}"
                )


@pytest.mark.parametrize("slice_size", [256, 4096], ids=["slices", "one-slice"])
@pytest.mark.parametrize("vocab", [50, 1000, 2500])
def test_kernel_and_reference_draw_by_the_definition(vocab, slice_size):
    args = draws(48, vocab, seed=vocab)
    got = sample_rows(*args, slice_size=slice_size).tolist()
    ref = sample_rows_ref(*args).tolist()
    check_against_definition(*args, got, tol=1e-6)
    check_against_definition(*args, ref, tol=1e-6)
    single = list(range(2, 48, 6))  # rows whose threshold keeps their maximum only
    top = args[0].argmax(dim=-1).tolist()
    assert [got[r] for r in single] == [top[r] for r in single] == [ref[r] for r in single]


def test_contiguous_float32_only():
    logits = torch.randn(2, 64, dtype=torch.float16)
    one = torch.ones(2)
    with pytest.raises(ValueError, match="float32"):
        sample_rows(logits, one, one * float("-inf"), one.double() / 2)


@pytest.mark.gpu
def test_kernel_on_cuda_draws_by_the_definition():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    args = draws(32, 128256, seed=1, device="cuda")
    check_against_definition(*args, sample_rows(*args).tolist(), tol=1e-6)
    check_against_definition(*args, sample_rows_ref(*args).tolist(), tol=1e-6)
