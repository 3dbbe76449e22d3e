"""The canonical packed INT4 weight of ``kernels.int4_gemm`` (layout in that module's docstring).

Concatenation along N (fused ``qkv_proj``, ``gate_up_proj``) and slicing on group boundaries
(tensor parallelism) are plain tensor operations on its fields.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Int4Weight:
    """A packed INT4 weight in the kernel's canonical layout (see the module docstring).

    Shapes: qweight int32 [N, K // 8]; scales, offsets [K // group_size, N]; in_perm int64 [K]
    or None.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor
    group_size: int
    in_perm: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.qweight.dtype != torch.int32 or self.qweight.dim() != 2:
            raise ValueError(
                f"qweight must be int32 [N, K // 8], got {self.qweight.dtype} "
                f"{tuple(self.qweight.shape)}"
            )
        n, k = self.out_features, self.in_features
        if self.group_size <= 0 or self.group_size % 8 or k % self.group_size:
            raise ValueError(
                f"group_size must be a positive multiple of 8 dividing K={k}, got {self.group_size}"
            )
        expected = (k // self.group_size, n)
        for name in ("scales", "offsets"):
            t = getattr(self, name)
            if tuple(t.shape) != expected:
                raise ValueError(f"{name} must have shape {expected}, got {tuple(t.shape)}")
            if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
                raise ValueError(f"{name} must be fp16, bf16 or fp32, got {t.dtype}")
        if self.in_perm is not None and tuple(self.in_perm.shape) != (k,):
            raise ValueError(f"in_perm must have shape ({k},), got {tuple(self.in_perm.shape)}")

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1] * 8

    @property
    def num_bytes(self) -> int:
        """Bytes held on the device by all tensors of this weight."""
        tensors = [self.qweight, self.scales, self.offsets]
        if self.in_perm is not None:
            tensors.append(self.in_perm)
        return sum(t.numel() * t.element_size() for t in tensors)

    def to(self, device: torch.device | str) -> Int4Weight:
        """A copy on ``device`` (dtypes unchanged)."""
        perm = None if self.in_perm is None else self.in_perm.to(device)
        return Int4Weight(
            self.qweight.to(device),
            self.scales.to(device),
            self.offsets.to(device),
            self.group_size,
            perm,
        )

    @staticmethod
    def cat_n(weights: list[Int4Weight]) -> Int4Weight:
        """Concatenate along N (output features), in order; K, group size and in_perm agree."""
        first = weights[0]
        for w in weights[1:]:
            if w.in_features != first.in_features or w.group_size != first.group_size:
                raise ValueError(
                    "cat_n needs equal K and group_size, got "
                    f"{(w.in_features, w.group_size)} vs "
                    f"{(first.in_features, first.group_size)}"
                )
            same_perm = (w.in_perm is None and first.in_perm is None) or (
                w.in_perm is not None
                and first.in_perm is not None
                and torch.equal(w.in_perm, first.in_perm)
            )
            if not same_perm:
                raise ValueError("cat_n needs identical in_perm (act-order permutation)")
        return Int4Weight(
            torch.cat([w.qweight for w in weights], 0),
            torch.cat([w.scales for w in weights], 1),
            torch.cat([w.offsets for w in weights], 1),
            first.group_size,
            first.in_perm,
        )

    def narrow_n(self, start: int, length: int) -> Int4Weight:
        """Output features ``start .. start+length`` (a tensor-parallel column shard)."""
        return Int4Weight(
            self.qweight[start : start + length].contiguous(),
            self.scales[:, start : start + length].contiguous(),
            self.offsets[:, start : start + length].contiguous(),
            self.group_size,
            self.in_perm,
        )

    def narrow_k(self, start: int, length: int) -> Int4Weight:
        """Input features ``start .. start+length`` on group boundaries (a row shard)."""
        g = self.group_size
        if self.in_perm is not None:
            raise ValueError("narrow_k of an act-order (permuted) weight is not supported")
        if start % g or length % g:
            raise ValueError(
                f"narrow_k needs start and length multiples of group_size={g}, "
                f"got {start}, {length}"
            )
        return Int4Weight(
            self.qweight[:, start // 8 : (start + length) // 8].contiguous(),
            self.scales[start // g : (start + length) // g].contiguous(),
            self.offsets[start // g : (start + length) // g].contiguous(),
            g,
            None,
        )


def tma_tiles_ok(x: torch.Tensor, weight: Int4Weight, block_k: int) -> bool:
    """Whether x [M, K] and the weight's words can be read in K tiles of ``block_k`` by TMA
    (Hopper's tensor memory accelerator) with one scale row per tile: 16-bit x on an sm_90+
    GPU, tiles within one quantization group, and rows TMA can address (unit inner stride,
    16-byte aligned bases and row strides)."""
    return (
        x.device.type == "cuda"
        and x.dtype in (torch.float16, torch.bfloat16)
        and torch.cuda.get_device_capability(x.device)[0] >= 9
        and weight.group_size % block_k == 0
        and x.stride(1) == 1
        and weight.qweight.stride(1) == 1
        and all(
            t.data_ptr() % 16 == 0 and t.stride(0) * t.element_size() % 16 == 0
            for t in (x, weight.qweight)
        )
    )
