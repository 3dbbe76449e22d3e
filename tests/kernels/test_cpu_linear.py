"""oneDNN linear on packed weights (``kernels/cpu_linear.py``) against a float64 matmul."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_linear import pack_linear_weight, packed_linear, packed_linear_supported

pytestmark = pytest.mark.skipif(
    not packed_linear_supported(torch.float32), reason="this PyTorch build has no oneDNN linear"
)


def linear_f64(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    y = x.double() @ weight.double().T
    return y if bias is None else y + bias.double()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 7, 64, 300])
def test_matches_a_float64_matmul(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(576 + 5, 192, generator=gen)  # odd output width
    b = torch.randn(weight.shape[0], generator=gen) if bias else None
    x = torch.randn(rows, 192, generator=gen)
    packed = pack_linear_weight(weight)
    assert packed is not None
    out = packed_linear(x, packed, b)
    assert out.shape == (rows, weight.shape[0]) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), linear_f64(x, weight, b), rtol=1e-4, atol=1e-4)


def test_strided_and_batched_inputs():
    """Rows of a wider tensor (the q slice of a fused projection) and a leading batch dim."""
    weight = torch.randn(96, 64)
    packed = pack_linear_weight(weight)
    wide = torch.randn(10, 128)
    x = wide[:, :64]
    assert not x.is_contiguous()
    torch.testing.assert_close(
        packed_linear(x, packed).double(), linear_f64(x, weight, None), rtol=1e-4, atol=1e-4
    )
    x3 = torch.randn(2, 5, 64)
    torch.testing.assert_close(
        packed_linear(x3, packed).double(), linear_f64(x3, weight, None), rtol=1e-4, atol=1e-4
    )


def test_unsupported_weights_are_not_packed():
    assert pack_linear_weight(torch.randn(4, 4, 4)) is None  # not a matrix
    assert pack_linear_weight(torch.randn(4, 4).half()) is None  # no fp16 path here
