"""Round-to-nearest 4-bit quantization (the baseline) and the shared per-group parameters.

Quantization grid, as in GPTQ's reference ``Quantizer``: per row and group the range
[min(w, 0), max(w, 0)] maps onto codes 0..15; value = scale * (q - zero). Zero points are kept
in 1..15 so that the GPTQ "v1" checkpoint format (which stores zero - 1) can hold them, and
scales are rounded to fp16 first, so the values written are the values quantized against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAXQ = 15


@dataclass
class QuantizedWeight:
    """A 4-bit weight in GPTQ's terms, columns in the original input order.

    codes int32 [N, K] (0..15); scales float32 [G, N]; zeros int32 [G, N];
    g_idx int32 [K] (group of each input column); value = scale * (code - zero).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    g_idx: torch.Tensor
    group_size: int

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K]."""
        g = self.g_idx.long()
        return self.scales[g].t() * (self.codes - self.zeros[g].t()).float()


def _grid(xmin: torch.Tensor, xmax: torch.Tensor, sym: bool):
    if sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = torch.where(xmin < 0, -xmax, xmin)
    empty = (xmin == 0) & (xmax == 0)
    xmin = torch.where(empty, -1.0, xmin)
    xmax = torch.where(empty, 1.0, xmax)
    scale = ((xmax - xmin) / MAXQ).half().float().clamp(min=1e-8)
    if sym:
        zero = torch.full_like(scale, (MAXQ + 1) // 2)
    else:
        zero = torch.round(-xmin / scale).clamp(1, MAXQ)
    return scale, zero.to(torch.int32)


def group_params(
    w: torch.Tensor, sym: bool, mse: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, g] -> (scale [N] float32 fp16-representable, zero [N] int32 in 1..15).

    ``mse``: shrink the range by factors 1.0, 0.98, ..., 0.80 and keep, per row, the grid with
    the smallest sum |w - dequant|^2.4 (the clipping search of GPTQ's reference quantizer).
    """
    w = w.float()
    xmin = w.min(dim=1).values.clamp(max=0)
    xmax = w.max(dim=1).values.clamp(min=0)
    scale, zero = _grid(xmin, xmax, sym)
    if not mse:
        return scale, zero
    best = torch.full_like(scale, float("inf"))
    for shrink in torch.linspace(1.0, 0.8, 11).tolist():
        s, z = _grid(xmin * shrink, xmax * shrink, sym)
        dq = s[:, None] * (quantize_codes(w, s, z) - z[:, None]).float()
        err = ((dq - w).abs() ** 2.4).sum(dim=1)
        better = err < best
        best = torch.where(better, err, best)
        scale = torch.where(better, s, scale)
        zero = torch.where(better, z, zero)
    return scale, zero


def quantize_codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """w [N, ...], scale/zero [N] -> codes int32, clamp(round(w / scale) + zero, 0, 15)."""
    shape = (-1,) + (1,) * (w.dim() - 1)
    q = torch.round(w.float() / scale.view(shape)) + zero.view(shape).float()
    return q.clamp(0, MAXQ).to(torch.int32)


def check_group_size(k: int, group_size: int) -> int:
    """-1 (per channel) -> K; else a positive multiple of 8 (ValueError if not). When it does not
    divide K the last group is shorter, as in GPTQ (g_idx = k // group_size)."""
    if group_size == -1 or group_size >= k:
        return k
    if group_size <= 0 or group_size % 8:
        raise ValueError(f"group_size must be -1 or a positive multiple of 8, got {group_size}")
    return group_size


def rtn_quantize(weight: torch.Tensor, group_size: int = 128, sym: bool = False) -> QuantizedWeight:
    """Round each group of weight [N, K] to its own 4-bit grid, no error compensation."""
    n, k = weight.shape
    g = check_group_size(k, group_size)
    scales, zeros, codes = [], [], []
    for start in range(0, k, g):
        group = weight[:, start : start + g].float()
        scale, zero = group_params(group, sym)
        scales.append(scale)
        zeros.append(zero)
        codes.append(quantize_codes(group, scale, zero))
    return QuantizedWeight(
        torch.cat(codes, dim=1),
        torch.stack(scales),
        torch.stack(zeros),
        (torch.arange(k) // g).to(torch.int32),
        g,
    )
