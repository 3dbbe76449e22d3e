"""rms_norm (Triton; interpreter on CPU) against rms_norm_ref, and the reference against the
formula in float64."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernels' import (jit decoration)

from kernels.rms_norm import rms_norm, rms_norm_ref  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (atol, rtol) per dtype, on outputs of size ~1: the sum of squares may add in another order.
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}
DTYPES = [torch.float32, torch.float16]


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype, f"{what}: {out.dtype} vs {ref.dtype}"
    atol, rtol = TOLERANCE[dtype]
    bad = ((out.double() - ref.double()).abs() > atol + rtol * ref.double().abs()).nonzero()
    assert len(bad) == 0, f"{what}: {len(bad)} mismatches, first [token, col] {bad[:4].tolist()}"


@pytest.mark.parametrize("has_residual", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens, hidden", [(1, 64), (9, 80), (4, 1000)])
def test_matches_reference(num_tokens, hidden, dtype, has_residual):
    x = (2 * torch.randn(num_tokens, hidden + 7, device=DEVICE)).to(dtype)[:, 3 : 3 + hidden]
    weight = (1 + 0.1 * torch.randn(hidden, device=DEVICE)).to(dtype)
    residual = torch.randn(num_tokens, hidden, device=DEVICE).to(dtype) if has_residual else None
    out = rms_norm(x, weight, 1e-6, residual)
    ref = rms_norm_ref(x, weight, 1e-6, residual)
    if has_residual:
        assert_close(out[0], ref[0], dtype, "normed")
        assert_close(out[1], ref[1], dtype, "new residual")
    else:
        assert_close(out, ref, dtype, "normed")


def test_fp32_weight_promotes_like_the_reference():
    x = torch.randn(3, 96, device=DEVICE).half()
    weight = torch.rand(96, device=DEVICE) + 0.5
    out, ref = rms_norm(x, weight, 1e-5), rms_norm_ref(x, weight, 1e-5)
    assert out.dtype == ref.dtype == torch.float32
    assert_close(out, ref, torch.float16, "fp16 x, fp32 weight")


def test_reference_matches_formula():
    x = torch.randn(5, 48, dtype=torch.float64)
    residual = torch.randn(5, 48, dtype=torch.float64)
    weight = torch.randn(48, dtype=torch.float64)
    h = x + residual
    expected = h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-6) * weight
    out, new_residual = rms_norm_ref(x, weight, 1e-6, residual)
    # The reference normalizes in fp32 whatever the input dtype.
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(new_residual, h, atol=1e-6, rtol=1e-6)


def test_rejects_bad_input():
    x = torch.randn(2, 32, device=DEVICE)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, torch.ones(31, device=DEVICE), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        rms_norm(x, torch.ones(32, device=DEVICE), 1e-6, torch.randn(3, 32, device=DEVICE))
