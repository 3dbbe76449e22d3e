"""Per-request block accounting on top of ``BlockPool``: prefix hits, slot allocation, caching."""

from __future__ import annotations

from collections.abc import Sequence

from engine.block_pool import BlockPool, KVCacheBlock, hash_block_tokens
from engine.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Maps requests to blocks. Every call is made by the scheduler, which holds the policy."""

    def __init__(self, pool: BlockPool, block_size: int) -> None:
        self.pool = pool
        self.block_size = block_size

    def _extend_hashes(self, req: Request, num_full_blocks: int) -> None:
        bs = self.block_size
        while len(req.block_hashes) < num_full_blocks:
            i = len(req.block_hashes)
            parent = req.block_hashes[-1] if i else None
            req.block_hashes.append(hash_block_tokens(parent, req.token_ids(i * bs, (i + 1) * bs)))

    def get_computed_blocks(self, req: Request) -> list[KVCacheBlock]:
        """The longest run of the request's leading full blocks already in the prefix cache.

        At least the last token is always left to compute, so the step has logits to sample.
        """
        if not self.pool.enable_caching:
            return []
        num_full = (req.num_tokens - 1) // self.block_size
        self._extend_hashes(req, num_full)
        hits: list[KVCacheBlock] = []
        for block_hash in req.block_hashes[:num_full]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        self.pool.num_cache_queries += num_full
        self.pool.num_cache_hits += len(hits)
        return hits

    def can_fit(
        self, req: Request, num_new_tokens: int, computed: Sequence[KVCacheBlock] = ()
    ) -> bool:
        return self._num_blocks_needed(req, num_new_tokens, computed) <= self.pool.num_free_blocks

    def _num_blocks_needed(
        self, req: Request, num_new_tokens: int, computed: Sequence[KVCacheBlock]
    ) -> int:
        num_tokens = req.num_computed_tokens + len(computed) * self.block_size + num_new_tokens
        new_blocks = max(0, cdiv(num_tokens, self.block_size) - len(req.blocks) - len(computed))
        # Hits sitting on the free list stop being free once taken.
        return new_blocks + sum(1 for b in computed if b.ref_cnt == 0)

    def allocate_slots(
        self, req: Request, num_new_tokens: int, computed: Sequence[KVCacheBlock] = ()
    ) -> bool:
        """Give the request blocks for ``num_new_tokens`` more tokens (after ``computed`` hits).

        Returns False, changing nothing, when the pool has too few free blocks.
        """
        if not self.can_fit(req, num_new_tokens, computed):
            return False
        self.pool.touch(computed)
        req.blocks.extend(computed)
        req.block_ids.extend(b.block_id for b in computed)
        req.num_registered_blocks = len(req.blocks) if computed else req.num_registered_blocks
        num_tokens = req.num_computed_tokens + len(computed) * self.block_size + num_new_tokens
        num_new_blocks = cdiv(num_tokens, self.block_size) - len(req.blocks)
        if num_new_blocks > 0:
            new = self.pool.allocate(num_new_blocks)
            req.blocks.extend(new)
            req.block_ids.extend(b.block_id for b in new)
        return True

    def cache_full_blocks(self, req: Request) -> None:
        """Register the request's newly computed full blocks in the prefix cache."""
        num_full = req.num_computed_tokens // self.block_size
        if num_full <= req.num_registered_blocks or not self.pool.enable_caching:
            return
        self._extend_hashes(req, num_full)
        for i in range(req.num_registered_blocks, num_full):
            self.pool.cache_block(req.blocks[i], req.block_hashes[i])
        req.num_registered_blocks = num_full

    def free(self, req: Request) -> None:
        """Return the request's blocks, tail first (evicted before the shareable head)."""
        self.pool.free(list(reversed(req.blocks)))
        req.blocks = []
        req.block_ids = []
        req.num_registered_blocks = 0
