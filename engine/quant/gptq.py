"""GPTQ (Frantar et al., 2022): 4-bit quantization with Hessian-based error compensation.

For a linear layer with inputs X, the layer error ||W X - Q X||^2 has Hessian H = 2 X X^T.
Columns are quantized one at a time; each column's rounding error is spread over the columns
not yet quantized through the inverse Hessian (its upper Cholesky factor), in blocks so the
updates are matrix products. With ``act_order`` columns go in order of decreasing H diagonal
(the most active inputs first); groups are then formed in that order and recorded in g_idx.
"""

from __future__ import annotations

import torch

from engine.quant.rtn import QuantizedWeight, check_group_size, group_params, quantize_codes


def gptq_quantize(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    group_size: int = 128,
    act_order: bool = False,
    sym: bool = False,
    damp_percent: float = 0.01,
    block_size: int = 128,
    mse: bool = False,
) -> QuantizedWeight:
    """Quantize weight [N, K] given the input Hessian [K, K] (sum of x x^T, any scale).

    ``mse`` searches a clipped grid per group (see ``rtn.group_params``). Runs on one CPU
    thread for its duration (restored after): the column loop is many small ops, and extra
    threads only add synchronization (measured 2-20x slower with two on a loaded 2-core box).
    """
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _gptq(weight, hessian, group_size, act_order, sym, damp_percent, block_size, mse)
    finally:
        torch.set_num_threads(num_threads)


def _gptq(weight, hessian, group_size, act_order, sym, damp_percent, block_size, mse):
    n, k = weight.shape
    if tuple(hessian.shape) != (k, k):
        raise ValueError(f"hessian must be [{k}, {k}], got {tuple(hessian.shape)}")
    g = check_group_size(k, group_size)
    if g < k and block_size % g:
        block_size = g * max(1, block_size // g)
    w = weight.detach().double().clone()
    h = hessian.detach().double().clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(k)
    w, h = w[:, perm], h[perm][:, perm]
    h += damp_percent * torch.mean(torch.diag(h)) * torch.eye(k, dtype=h.dtype)
    h_inv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    # float64 throughout, the column loop too (GPTQ's reference runs it in float32): each
    # column's rounding error is pushed onto the columns after it, so one rounding decision
    # that flips with float32 noise changes everything after it, and the result then depended
    # on the CPU (the same calibration gave 8% and 10.6% perplexity loss on two machines).

    codes = torch.zeros(n, k, dtype=torch.int32)
    scales, zeros = [], []
    scale = zero = None
    if g == k:
        scale, zero = group_params(w, sym, mse)
        scales.append(scale)
        zeros.append(zero)
    for i1 in range(0, k, block_size):
        i2 = min(i1 + block_size, k)
        w1 = w[:, i1:i2].clone()
        err1 = torch.zeros_like(w1)
        h1 = h_inv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if g < k and col % g == 0:
                # the group's weights as updated so far
                scale, zero = group_params(w1[:, i : i + g], sym, mse)
                scales.append(scale)
                zeros.append(zero)
            q = quantize_codes(w1[:, i], scale, zero)
            codes[:, col] = q
            dq = scale * (q - zero).float()
            err = (w1[:, i] - dq) / h1[i, i]
            w1[:, i:] -= err.unsqueeze(1) @ h1[i, i:].unsqueeze(0)
            err1[:, i] = err
        w[:, i2:] -= err1 @ h_inv[i1:i2, i2:]

    # Back to the original column order; g_idx says which group each original column is in.
    inverse = torch.argsort(perm)
    g_idx = (torch.arange(k) // g).to(torch.int32)[inverse]
    return QuantizedWeight(codes[:, inverse], torch.stack(scales), torch.stack(zeros), g_idx, g)
