"""RMSNorm with an optional fused residual add."""

from __future__ import annotations

import torch


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dimension, computed in fp32.

    x: [num_tokens, hidden]; weight: [hidden]; residual: [num_tokens, hidden] or None.
    Without ``residual``: returns ``norm(x) * weight``.
    With ``residual``: ``h = x + residual``; returns ``(norm(h) * weight, h)``, the second being
    the new residual stream (what the next layer adds to).
    """
    if residual is not None:
        h = x.float() + residual.float()
        new_residual = h.to(x.dtype)
    else:
        h = x.float()
    var = h.pow(2).mean(dim=-1, keepdim=True)
    y = (h * torch.rsqrt(var + eps)).to(x.dtype) * weight
    if residual is not None:
        return y, new_residual
    return y
