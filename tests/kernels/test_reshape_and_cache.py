"""reshape_and_cache (Triton; interpreter on CPU) against reshape_and_cache_ref and against
the slot arithmetic written out here."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernels' import (jit decoration)

from kernels.reshape_and_cache import reshape_and_cache, reshape_and_cache_ref  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_kv_heads, head_dim", [(3, 64), (1, 80), (2, 128)])
def test_matches_reference_and_slot_arithmetic(num_kv_heads, head_dim, dtype):
    num_blocks, block_size, num_tokens = 7, 16, 13
    # K and V strided: views of one fused [num_tokens, 2, heads, dim] buffer.
    kv = torch.randn(num_tokens, 2, num_kv_heads, head_dim, device=DEVICE).to(dtype)
    key, value = kv[:, 0], kv[:, 1]
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:num_tokens]
    slots[[2, 7]] = -1  # padding tokens: never written
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, device=DEVICE)
    key_cache = key_cache.to(dtype)
    value_cache = torch.randn_like(key_cache)
    ref_caches = key_cache.clone(), value_cache.clone()
    before = key_cache.clone(), value_cache.clone()

    reshape_and_cache(key, value, key_cache, value_cache, slots)
    reshape_and_cache_ref(key, value, *ref_caches, slots)

    for name, cache, ref_cache, old, new in (
        ("key", key_cache, ref_caches[0], before[0], key),
        ("value", value_cache, ref_caches[1], before[1], value),
    ):
        assert torch.equal(cache, ref_cache), f"{name} cache differs from the reference at " + str(
            (cache != ref_cache).nonzero()[:4].tolist()
        )
        flat, flat_old = cache.flatten(0, 1), old.flatten(0, 1)
        written = set()
        for t, slot in enumerate(slots.tolist()):
            if slot >= 0:
                assert torch.equal(flat[slot], new[t]), f"{name}: token {t} not at slot {slot}"
                written.add(slot)
        untouched = [s for s in range(flat.shape[0]) if s not in written]
        assert torch.equal(flat[untouched], flat_old[untouched]), f"{name}: stray writes"


def test_casts_to_cache_dtype():
    key = torch.randn(5, 2, 64, device=DEVICE)
    value = torch.randn(5, 2, 64, device=DEVICE)
    key_cache = torch.randn(3, 8, 2, 64, device=DEVICE).half()
    value_cache = torch.randn_like(key_cache)
    slots = torch.tensor([0, 9, 17, -1, 23], device=DEVICE)
    ref_k, ref_v = key_cache.clone(), value_cache.clone()
    reshape_and_cache(key, value, key_cache, value_cache, slots)
    reshape_and_cache_ref(key, value, ref_k, ref_v, slots)
    assert torch.equal(key_cache, ref_k) and torch.equal(value_cache, ref_v)


def test_rejects_bad_input():
    key = torch.randn(4, 2, 64, device=DEVICE)
    cache = torch.randn(3, 8, 2, 64, device=DEVICE)
    with pytest.raises(ValueError, match="slot_mapping"):
        reshape_and_cache(key, key, cache, cache.clone(), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="num_kv_heads, head_dim"):
        reshape_and_cache(key, key, cache[:, :, :1], cache[:, :, :1], torch.zeros(4).long())
