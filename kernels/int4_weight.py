"""The canonical packed INT4 weight of ``kernels.int4_gemm`` (layout in that module's docstring).

Concatenation along N (fused ``qkv_proj``, ``gate_up_proj``) and slicing on group boundaries
(tensor parallelism) are plain tensor operations on its fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from kernels.pdl import is_sm90

FRAG_TILE_K = 128  # K columns per tile of the fragment order (``frag_order``)


def frag_shape_ok(k: int, group_size: int) -> bool:
    """Whether a weight with K inputs and this group size can be held in fragment order (and
    read by the Gluon small-M kernels): K and the group size multiples of ``FRAG_TILE_K``, or
    one group per row."""
    return k % FRAG_TILE_K == 0 and (group_size % FRAG_TILE_K == 0 or group_size == k)


@dataclass(frozen=True)
class Int4Weight:
    """A packed INT4 weight in the kernel's canonical layout (see the module docstring).

    Shapes: qweight int32 [N, K // 8]; scales, offsets [K // group_size, N]; in_perm int64 [K]
    or None. ``frag``: the words are in fragment order (``frag_order``), the layout of the
    Hopper kernel for small M; then K and the group size are multiples of 128 (or the group is
    K), and only that kernel and the dequantizers read them (``to_frag``, ``to_canonical``).
    ``tiled`` (with ``frag``, N a multiple of 16): the fragment-ordered words are also in
    ``tile_order`` (every 16 rows by 128 K one contiguous 1 KB run), as the engine holds them
    on Hopper (``kernels.int4_gemm.device_form``); qweight is then contiguous.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor
    group_size: int
    in_perm: torch.Tensor | None = None
    frag: bool = False
    tiled: bool = False
    # Launchers' per-weight memo (TMA descriptors and checks of its tensors, by tile): built
    # on the first eager call of a tiling, so later calls skip it; a new weight starts empty.
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

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
        if self.frag and not frag_shape_ok(k, self.group_size):
            raise ValueError(
                f"fragment order needs K and the group size multiples of {FRAG_TILE_K} (or one "
                f"group), got K={k}, group_size={self.group_size}"
            )
        if self.tiled and not (self.frag and n % 16 == 0 and self.qweight.is_contiguous()):
            raise ValueError(
                "tile order (tiled) needs fragment-ordered (frag), contiguous words and N a "
                f"multiple of 16, got frag={self.frag}, N={n}, "
                f"contiguous={self.qweight.is_contiguous()}"
            )

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
        """A copy on ``device`` (dtypes and word order unchanged)."""
        perm = None if self.in_perm is None else self.in_perm.to(device)
        return Int4Weight(
            self.qweight.to(device),
            self.scales.to(device),
            self.offsets.to(device),
            self.group_size,
            perm,
            self.frag,
            self.tiled,
        )

    def to_frag(self, tiled: bool = False) -> Int4Weight:
        """The same weight with its words in fragment order, with ``tiled`` also in
        ``tile_order`` (itself if they already are so)."""
        if self.frag and self.tiled == tiled:
            return self
        q = self.qweight
        if self.tiled:
            q = tile_unorder(q)
        elif not self.frag:
            q = frag_order(q)
        return replace(self, qweight=tile_order(q) if tiled else q, frag=True, tiled=tiled)

    def to_canonical(self) -> Int4Weight:
        """The same weight with its words in canonical order (itself if they already are)."""
        if not self.frag:
            return self
        q = tile_unorder(self.qweight) if self.tiled else self.qweight
        return replace(self, qweight=frag_unorder(q), frag=False, tiled=False)

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
            if (w.frag, w.tiled) != (first.frag, first.tiled):
                raise ValueError(
                    "cat_n needs the same word order (all fragment-ordered or none, all in tile "
                    "order or none)"
                )
        # in tile order each 16 rows hold the same span of words as row-major: rows concatenate
        return Int4Weight(
            torch.cat([w.qweight for w in weights], 0),
            torch.cat([w.scales for w in weights], 1),
            torch.cat([w.offsets for w in weights], 1),
            first.group_size,
            first.in_perm,
            first.frag,
            first.tiled,
        )

    def narrow_n(self, start: int, length: int) -> Int4Weight:
        """Output features ``start .. start+length`` (a tensor-parallel column shard; in tile
        order on multiples of 16 rows)."""
        if self.tiled and (start % 16 or length % 16):
            raise ValueError(
                f"narrow_n of a weight in tile order needs start and length multiples of 16, "
                f"got {start}, {length}"
            )
        return Int4Weight(
            self.qweight[start : start + length].contiguous(),
            self.scales[:, start : start + length].contiguous(),
            self.offsets[:, start : start + length].contiguous(),
            self.group_size,
            self.in_perm,
            self.frag,
            self.tiled,
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
        if self.tiled:  # K tiles are not contiguous per row there
            return self.to_frag().narrow_k(start, length).to_frag(tiled=True)
        return Int4Weight(
            self.qweight[:, start // 8 : (start + length) // 8].contiguous(),
            self.scales[start // g : (start + length) // g].contiguous(),
            self.offsets[start // g : (start + length) // g].contiguous(),
            g,
            None,
            self.frag,
        )


def tma_tiles_ok(x: torch.Tensor, weight: Int4Weight, block_k: int) -> bool:
    """Whether x [M, K] and the weight's words can be read in K tiles of ``block_k`` by TMA
    (Hopper's tensor memory accelerator) with one scale row per tile: 16-bit x on an sm_90+
    GPU, tiles within one quantization group, and rows TMA can address (unit inner stride,
    16-byte aligned bases and row strides)."""
    return tma_rows_ok(x) and weight_tiles_ok(weight, block_k)


def tma_rows_ok(x: torch.Tensor) -> bool:
    """x's part of ``tma_tiles_ok``: 16-bit, on an sm_90+ GPU, rows TMA can address."""
    return (
        (x.dtype is torch.bfloat16 or x.dtype is torch.float16)
        and x.stride(1) == 1
        and x.data_ptr() % 16 == 0
        and x.stride(0) * x.element_size() % 16 == 0
        and is_sm90(x.device)
    )


def weight_tiles_ok(weight: Int4Weight, block_k: int) -> bool:
    """The weight's part of ``tma_tiles_ok`` (K tiles within one group, word rows TMA can
    address), looked up once per weight and tile (``Int4Weight.memo``)."""
    ok = weight.memo.get(("tiles_ok", block_k))
    if ok is None:
        q = weight.qweight
        ok = (
            weight.group_size % block_k == 0
            and q.stride(1) == 1
            and q.data_ptr() % 16 == 0
            and q.stride(0) * q.element_size() % 16 == 0
        )
        weight.memo["tiles_ok", block_k] = ok
    return ok


def _frag_source_k(device: torch.device | str = "cpu") -> torch.Tensor:
    """[16, 8] int64: the K offset (within a 128-column tile) of nibble j of word w of a tile
    in fragment order. Word w = 4t + b carries what the lane with t = lane % 4 of a wgmma A
    fragment needs from the tile's 32-column block b: its register j % 4 = 2c + e (columns
    16c + 8e + 2t and + 1) as nibbles j % 4 (the first column) and j % 4 + 4 (the second)."""
    w = torch.arange(16, device=device).unsqueeze(1)
    j = torch.arange(8, device=device).unsqueeze(0)
    t, b = w // 4, w % 4
    c, e, h = (j % 4) // 2, j % 2, j // 4
    return 32 * b + 16 * c + 8 * e + 2 * t + h


def unpack_words(qweight: torch.Tensor) -> torch.Tensor:
    """int32 words [N, W] -> their codes int32 [N, W, 8] (code j in bits 4j .. 4j + 3)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=qweight.device)
    return (qweight.unsqueeze(-1) >> shifts) & 0xF


def pack_words(codes: torch.Tensor) -> torch.Tensor:
    """Codes [N, W, 8] (0..15) -> int32 words [N, W] (inverse of ``unpack_words``; int32 wraps
    for the top nibble as intended)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=codes.device)
    return (codes.to(torch.int32) << shifts).sum(dim=-1, dtype=torch.int32)


def frag_order(qweight: torch.Tensor) -> torch.Tensor:
    """Canonical words int32 [N, K // 8] -> the same codes in fragment order (K a multiple of
    128): within each 128-column tile of a row, word 4t + b holds the 8 codes the lane t of a
    Hopper wgmma A fragment decodes for the tile's block b (``_frag_source_k``), so that lane
    loads its 16 bytes and no others, and every register is one nibble pair (j, j + 4)."""
    n, words = qweight.shape
    if words % 16:
        raise ValueError(f"fragment order needs K a multiple of 128, got K={words * 8}")
    codes = unpack_words(qweight).reshape(n, words // 16, 128)
    src = _frag_source_k(qweight.device).reshape(-1)
    return pack_words(codes[:, :, src].reshape(n, words, 8))


def frag_unorder(qweight: torch.Tensor) -> torch.Tensor:
    """Inverse of ``frag_order``: fragment-ordered words -> canonical words."""
    n, words = qweight.shape
    codes = unpack_words(qweight).reshape(n, words // 16, 128)
    out = torch.empty_like(codes)
    out[:, :, _frag_source_k(qweight.device).reshape(-1)] = codes
    return pack_words(out.reshape(n, words, 8))


def tile_order(qweight: torch.Tensor) -> torch.Tensor:
    """Words int32 [N, K // 8] (N a multiple of 16, K of 128) -> the same words with every 16
    rows by 128 K (16 rows of 16 words) one contiguous run of 256, the K tiles of a row block
    consecutive: [N // 16, K // 128, 16, 16] stored as [N, K // 8]. The word order within a
    row's tile is kept (fragment order for the Hopper kernels). So a warp's loads of a K tile
    read 1 KB in one run instead of 16 runs of 64 bytes K / 2 bytes apart, and a program's
    rows over its K range are one run; a TMA box of 16 k rows by one K tile is read as 16
    rows of 16 words, the same bytes in shared memory as row-major words give."""
    n, words = qweight.shape
    if n % 16 or words % 16:
        raise ValueError(f"tile order needs N a multiple of 16 and K of 128, got N={n}, "
                         f"K={words * 8}")  # fmt: skip
    tiles = qweight.reshape(n // 16, 16, words // 16, 16).permute(0, 2, 1, 3)
    return tiles.contiguous().reshape(n, words)


def tile_unorder(qweight: torch.Tensor) -> torch.Tensor:
    """Inverse of ``tile_order``: row-major words [N, K // 8] again."""
    n, words = qweight.shape
    tiles = qweight.reshape(n // 16, words // 16, 16, 16).permute(0, 2, 1, 3)
    return tiles.contiguous().reshape(n, words)
