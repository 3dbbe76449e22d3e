"""Quantize every decoder linear layer of a model with GPTQ or RTN, layer by layer.

Each layer sees the outputs of the already-quantized layers before it (as in GPTQ's
reference implementation); the four linear sites of a layer are quantized from inputs
recorded in one pass. Weights are replaced by their dequantized values (fake quantization),
and the quantized form is returned for the checkpoint writer.
"""

from __future__ import annotations

import torch

from engine.quant.calibration import LINEAR_SITES, layer_forward
from engine.quant.gptq import gptq_quantize
from engine.quant.rtn import QuantizedWeight, rtn_quantize

METHODS = ("gptq", "rtn")


@torch.no_grad()
def quantize_model(
    model,
    sequences: list[torch.Tensor],
    method: str = "gptq",
    group_size: int = 128,
    act_order: bool = False,
    sym: bool = False,
    damp_percent: float = 0.01,
    mse: bool = False,
) -> dict[str, QuantizedWeight]:
    """Quantize model.layers[*] linears in place; returns {"layers.N.<site>": QuantizedWeight}.

    sequences: token id tensors [T] (calibration; unused by RTN).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    hidden = [model.embed_tokens(ids).float() for ids in sequences] if method == "gptq" else []
    out: dict[str, QuantizedWeight] = {}
    for index, layer in enumerate(model.layers):
        hessians: dict[str, torch.Tensor] = {}

        def record(site: str, x: torch.Tensor, hessians=hessians) -> None:
            x = x.double()
            h = hessians.get(site)
            hessians[site] = x.t() @ x if h is None else h + x.t() @ x

        for h in hidden:
            layer_forward(model, layer, h, record)
        for site in LINEAR_SITES:
            module = layer.get_submodule(site)
            weight = module.weight.data
            if method == "gptq":
                q = gptq_quantize(
                    weight, hessians[site], group_size, act_order, sym, damp_percent, mse=mse
                )
            else:
                q = rtn_quantize(weight, group_size, sym)
            weight.copy_(q.dequantize().to(weight.dtype))
            out[f"layers.{index}.{site}"] = q
        hidden = [layer_forward(model, layer, h) for h in hidden]
    return out
