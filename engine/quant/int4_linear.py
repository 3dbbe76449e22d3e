"""``Int4Linear``: a linear layer over canonical INT4 weights (kernels.int4_gemm)."""

from __future__ import annotations

import torch
from torch import nn

import kernels.int4_gemm as int4_kernels
from kernels.int4_gemm import Int4Weight


def _order_name(frag: bool, tiled: bool) -> str:
    return "tiled" if tiled else "fragment" if frag else "canonical"


def _same_perm(a: Int4Weight, b: Int4Weight) -> bool:
    if a.in_perm is None or b.in_perm is None:
        return a.in_perm is None and b.in_perm is None
    return torch.equal(a.in_perm, b.in_perm)


class Int4Linear(nn.Module):
    """``y = x @ dequant(W)^T + b`` on the Triton kernel (CUDA) or the reference (CPU).

    ``parts`` are the weights of the checkpoint modules fused into this one (q, k, v or gate,
    up), outputs concatenated in that order. They are concatenated into one weight when their
    act-order permutations agree (always, for a fused module quantized on one input), else
    run one after another. ``bias`` is a parameter so the model's own loader fills it.
    """

    def __init__(
        self, parts: list[Int4Weight], has_bias: bool = False, bias_dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        if not parts:
            raise ValueError("Int4Linear needs at least one weight")
        if all(_same_perm(parts[0], p) for p in parts[1:]):
            parts = [Int4Weight.cat_n(parts)] if len(parts) > 1 else parts
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.group_size = parts[0].group_size
        self._num_parts = len(parts)
        # word order of each part's buffer: weights with groups of 128 or more on Hopper are
        # put in fragment order once, when they reach the GPU (``_rebuild``)
        self._order = [(p.frag, p.tiled) for p in parts]
        for i, part in enumerate(parts):
            self.register_buffer(f"qweight_{i}", part.qweight)
            self.register_buffer(f"scales_{i}", part.scales)
            self.register_buffer(f"offsets_{i}", part.offsets)
            self.register_buffer(f"in_perm_{i}", part.in_perm)
        device = parts[0].qweight.device
        self.bias = (
            nn.Parameter(
                torch.empty(self.out_features, dtype=bias_dtype, device=device), requires_grad=False
            )
            if has_bias
            else None
        )
        self._rebuild()

    def _rebuild(self) -> None:
        """Rebuild the ``Int4Weight`` views of the buffers; a part that ``frag_preferred``
        picks (groups of 128 or more, on an sm_90 GPU) has its words put in fragment order
        (and tile order: ``int4_gemm.device_form``) here, in place of the canonical ones, so
        its buffer holds the kernels' layout from then on."""
        self.parts = []
        for i in range(self._num_parts):
            frag, tiled = self._order[i]
            part = Int4Weight(
                getattr(self, f"qweight_{i}"),
                getattr(self, f"scales_{i}"),
                getattr(self, f"offsets_{i}"),
                self.group_size,
                getattr(self, f"in_perm_{i}"),
                frag,
                tiled,
            )
            held = int4_kernels.device_form(part)
            if held is not part:
                part = held
                setattr(self, f"qweight_{i}", part.qweight)
                self._order[i] = (part.frag, part.tiled)
            self.parts.append(part)

    def _apply(self, fn, recurse=True):  # keep the cached Int4Weight views in step with .to()
        out = super()._apply(fn, recurse)
        self._rebuild()
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Looked up at call time: tests reload kernels.int4_gemm under the interpreter.
        gemm = int4_kernels.int4_gemm if x.is_cuda else int4_kernels.int4_gemm_ref
        if len(self.parts) == 1:
            return gemm(x, self.parts[0], self.bias)
        y = torch.cat([gemm(x, p) for p in self.parts], dim=-1)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"group_size={self.group_size}, parts={self._num_parts}, "
            f"word_order={[_order_name(*o) for o in self._order]}"
        )
