"""The KV cache's physical blocks: free list, reference counts and the prefix cache.

``BlockPool`` allocates and frees; it holds no policy. A full block is identified by a hash
that chains its predecessor's hash with its own token ids, so equal hashes mean equal
prefixes. A freed block keeps its hash and stays findable until it is reused: the free list
is ordered least recently freed first, so cached blocks are evicted LRU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(eq=False)
class KVCacheBlock:
    """One physical block: ``block_size`` token slots in every layer's cache."""

    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None


def hash_block_tokens(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """The prefix-cache key of a full block: its predecessor's key chained with its tokens."""
    return hash((parent_hash, tuple(token_ids)))


class BlockPool:
    """Free list, ref counts and hash -> block map over ``num_blocks`` blocks."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        # block_id -> block, least recently freed first (eviction order).
        self._free: OrderedDict[int, KVCacheBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks
        )
        self._cached: dict[int, KVCacheBlock] = {}
        self.num_cache_queries = 0  # blocks looked up
        self.num_cache_hits = 0  # blocks found

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by running requests (0..1)."""
        return 1.0 - len(self._free) / self.num_blocks

    def get_cached_block(self, block_hash: int) -> KVCacheBlock | None:
        return self._cached.get(block_hash) if self.enable_caching else None

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` blocks off the free list (evicting their cached hashes)."""
        if num_blocks > len(self._free):
            raise RuntimeError(f"asked for {num_blocks} blocks, {len(self._free)} free")
        out = []
        for _ in range(num_blocks):
            _, block = self._free.popitem(last=False)
            if block.block_hash is not None:
                if self._cached.get(block.block_hash) is block:
                    del self._cached[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits (a free cached block leaves the free list)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Drop a reference on each block; blocks reaching zero go to the end of the free list.

        Pass a request's blocks in reverse order so its tail (the least shareable part) is
        evicted before its head.
        """
        for block in blocks:
            assert block.ref_cnt > 0, f"block {block.block_id} freed twice"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block

    def cache_block(self, block: KVCacheBlock, block_hash: int) -> None:
        """Register a full, computed block under its hash (first writer wins)."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash not in self._cached:
            self._cached[block_hash] = block
            block.block_hash = block_hash

    def reset_prefix_cache(self) -> None:
        for block in self._cached.values():
            block.block_hash = None
        self._cached.clear()
