"""silu_and_mul (Triton; interpreter on CPU) against silu_and_mul_ref and the formula."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernels' import (jit decoration)

from kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (atol, rtol) per dtype: both round silu to the input dtype before the product.
TOLERANCE = {torch.float32: (1e-6, 1e-5), torch.float16: (1e-3, 2e-3), torch.bfloat16: (1e-2, 1e-2)}
DTYPES = [torch.float32, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens, d", [(1, 64), (7, 80), (5, 1500)])
def test_matches_reference(num_tokens, d, dtype):
    # A strided input: every other row of a taller buffer.
    x = (3 * torch.randn(2 * num_tokens, 2 * d, device=DEVICE)).to(dtype)[::2]
    out = silu_and_mul(x)
    ref = silu_and_mul_ref(x)
    assert out.shape == ref.shape == (num_tokens, d) and out.dtype == dtype
    atol, rtol = TOLERANCE[dtype]
    bad = ((out.float() - ref.float()).abs() > atol + rtol * ref.float().abs()).nonzero()
    assert len(bad) == 0, f"{len(bad)} mismatches, first [token, col] {bad[:4].tolist()}"


def test_reference_matches_formula():
    x = torch.randn(6, 2 * 40, dtype=torch.float64)
    gate, up = x[:, :40], x[:, 40:]
    torch.testing.assert_close(silu_and_mul_ref(x), gate / (1 + torch.exp(-gate)) * up)


def test_leading_dims_and_bad_input():
    x = torch.randn(2, 3, 2 * 24, device=DEVICE)
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x))
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(torch.randn(3, 7, device=DEVICE))
