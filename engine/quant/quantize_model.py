"""Quantize every decoder linear layer of a model with GPTQ or RTN, layer by layer.

Each layer sees the outputs of the already-quantized layers before it (as in GPTQ's
reference implementation). Within a layer, ``true_sequential`` (the default, as AutoGPTQ's)
quantizes the four linear sites in order, each from inputs recorded after the sites before it
were quantized, so o_proj and the MLP compensate for the attention's quantization error;
without it all four are quantized from inputs recorded in one pass. Weights are replaced by
their dequantized values (fake quantization), and the quantized form is returned for the
checkpoint writer.
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
    true_sequential: bool = True,
) -> dict[str, QuantizedWeight]:
    """Quantize model.layers[*] linears in place; returns {"layers.N.<site>": QuantizedWeight}.

    sequences: token id tensors [T] (calibration; unused by RTN).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    # Calibration runs in float64, one layer at a time (see gptq.py: GPTQ's rounding decisions
    # cascade, so float32 noise made the result depend on the machine).
    hidden = [model.embed_tokens(ids).double() for ids in sequences] if method == "gptq" else []
    steps = [(site,) for site in LINEAR_SITES] if true_sequential else [LINEAR_SITES]
    out: dict[str, QuantizedWeight] = {}
    cos_sin_cache = model.cos_sin_cache
    if method == "gptq":
        model.cos_sin_cache = cos_sin_cache.double()  # rotary of the float64 q/k in float64
    try:
        for index, layer in enumerate(model.layers):
            dtype = next(layer.parameters()).dtype
            if method == "gptq":
                layer.double()
            for sites in steps:
                hessians = _input_hessians(model, layer, hidden, sites)
                for site in sites:
                    module = layer.get_submodule(site)
                    weight = module.weight.data
                    if method == "gptq":
                        q = gptq_quantize(weight, hessians[site], group_size, act_order, sym,
                                          damp_percent, mse=mse)  # fmt: skip
                    else:
                        q = rtn_quantize(weight, group_size, sym)
                    weight.copy_(q.dequantize().to(weight.dtype))
                    out[f"layers.{index}.{site}"] = q
            hidden = [layer_forward(model, layer, h) for h in hidden]
            layer.to(dtype)
    finally:
        model.cos_sin_cache = cos_sin_cache
    return out


def _input_hessians(model, layer, hidden: list[torch.Tensor], sites) -> dict[str, torch.Tensor]:
    """sum of x^T x (float64) over the calibration inputs x of each linear site in ``sites``."""
    hessians: dict[str, torch.Tensor] = {}

    def record(site: str, x: torch.Tensor) -> None:
        if site in sites:
            x = x.double()
            h = hessians.get(site)
            hessians[site] = x.t() @ x if h is None else h + x.t() @ x

    for h in hidden:
        layer_forward(model, layer, h, record)
    return hessians
