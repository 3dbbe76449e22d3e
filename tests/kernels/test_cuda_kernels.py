"""Each Triton kernel compiled on CUDA against its PyTorch reference, bf16 included, at model
sizes (Llama-3-8B attention heads), plus a CUDA-graph capture of a decode-step attention."""

from __future__ import annotations

import pytest
import torch

from kernels.paged_attention import default_num_kv_splits, paged_attention, paged_attention_ref
from kernels.reshape_and_cache import reshape_and_cache, reshape_and_cache_ref
from kernels.rms_norm import rms_norm, rms_norm_ref
from kernels.rotary_embedding import rotary_embedding, rotary_embedding_ref
from kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref

pytestmark = pytest.mark.gpu
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# (atol, rtol) per dtype for outputs of size ~1.
TOLERANCE = {torch.float32: (2e-4, 2e-4), torch.float16: (5e-3, 5e-3), torch.bfloat16: (4e-2, 4e-2)}


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """Elementwise |out - ref| <= atol + rtol |ref|; on failure name where."""
    atol, rtol = TOLERANCE[dtype]
    out64, ref64 = out.double(), ref.double()
    assert torch.isfinite(out64).all(), f"{what}: non-finite output"
    bad = ((out64 - ref64).abs() > atol + rtol * ref64.abs()).nonzero()
    if len(bad):
        worst = int((out64 - ref64).abs().argmax())
        index = [int(i) for i in torch.unravel_index(torch.tensor(worst), out.shape)]
        raise AssertionError(
            f"{what}: {len(bad)} of {out.numel()} off; first {bad[:4].tolist()}; worst at "
            f"{index}: {float(out64.flatten()[worst]):.5f} vs {float(ref64.flatten()[worst]):.5f}"
        )


def make_batch(seqs, num_heads, num_kv_heads, head_dim, dtype, block_size=16):
    """Random cache with randomly placed blocks for ``(seq_len, q_len)`` sequences."""
    blocks_per_seq = [-(-seq_len // block_size) for seq_len, _ in seqs]
    num_blocks = sum(blocks_per_seq) + 5
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, device="cuda").to(dtype)
    value_cache = torch.randn(shape, device="cuda").to(dtype)
    perm = torch.randperm(num_blocks, device="cuda", dtype=torch.int32)
    block_tables = torch.randint(0, num_blocks, (len(seqs), max(blocks_per_seq) + 1))
    block_tables = block_tables.to(device="cuda", dtype=torch.int32)
    start = 0
    for i, n in enumerate(blocks_per_seq):
        block_tables[i, :n] = perm[start : start + n]
        start += n
    q_lens = [q for _, q in seqs]
    query_start_loc = torch.tensor([0] + q_lens).cumsum(0).to(device="cuda", dtype=torch.int32)
    seq_lens = torch.tensor([s for s, _ in seqs], device="cuda", dtype=torch.int32)
    query = torch.randn(sum(q_lens), num_heads, head_dim, device="cuda").to(dtype)
    return (query, key_cache, value_cache, query_start_loc, seq_lens, block_tables,
            head_dim**-0.5, max(q_lens), max(s for s, _ in seqs))  # fmt: skip


DECODE_SEQS = [(1, 1), (17, 1), (2047, 1), (3001, 1), (512, 1), (90, 1), (1300, 1)]
MIXED_SEQS = [(300, 300), (900, 200), (2000, 1), (1, 1), (64, 1), (777, 13), (40, 40)]


# (num_heads, num_kv_heads, head_dim, dtype): Llama-3-8B heads in each dtype, then a group of 3
# with head size 80, and no grouping with head size 64.
HEADS_AND_DTYPES = [(32, 8, 128, dtype) for dtype in DTYPES] + [
    (12, 3, 80, torch.bfloat16),
    (16, 16, 64, torch.float16),
]


@pytest.mark.parametrize("heads_dtype", HEADS_AND_DTYPES, ids=str)
@pytest.mark.parametrize("seqs", [DECODE_SEQS, MIXED_SEQS], ids=["decode", "mixed"])
@pytest.mark.parametrize("num_kv_splits", [None, 1, 5])
def test_paged_attention(seqs, heads_dtype, num_kv_splits):
    *heads, dtype = heads_dtype
    args = make_batch(seqs, *heads, dtype)
    out = paged_attention(*args, num_kv_splits=num_kv_splits)
    assert_close(out, paged_attention_ref(*args), dtype, f"{heads} splits {num_kv_splits}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("seqs", [DECODE_SEQS, MIXED_SEQS], ids=["decode", "mixed"])
def test_paged_attention_sliding_window(seqs, dtype):
    args = make_batch(seqs, 32, 8, 128, dtype)
    out = paged_attention(*args, sliding_window=100)
    assert_close(out, paged_attention_ref(*args, sliding_window=100), dtype, "window 100")


def test_default_splits_fill_the_gpu_only_for_small_decode():
    device = torch.device("cuda")
    assert default_num_kv_splits(1, 8, 1, 8192, device) > 1
    assert default_num_kv_splits(256, 8, 1, 8192, device) == 1
    assert default_num_kv_splits(1, 8, 512, 8192, device) == 1


def test_paged_attention_in_cuda_graph():
    """A captured decode step replays correctly after the metadata tensors change in place."""
    args = list(make_batch([(3000, 1), (100, 1)], 32, 8, 128, torch.bfloat16))
    seq_lens = args[4]
    out = torch.empty_like(args[0])
    paged_attention(*args, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_attention(*args, out=out)
    for new_lens in ([2500, 7], [3000, 100], [1, 64]):
        seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        graph.replay()
        assert_close(out, paged_attention_ref(*args), torch.bfloat16, f"graph {new_lens}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reshape_and_cache(dtype):
    key = torch.randn(300, 8, 128, device="cuda").to(dtype)
    value = torch.randn(300, 8, 128, device="cuda").to(dtype)
    key_cache = torch.randn(64, 16, 8, 128, device="cuda").to(dtype)
    value_cache = torch.randn_like(key_cache)
    slots = torch.randperm(64 * 16, device="cuda")[:300]
    slots[::7] = -1
    ref_k, ref_v = key_cache.clone(), value_cache.clone()
    reshape_and_cache(key, value, key_cache, value_cache, slots)
    reshape_and_cache_ref(key, value, ref_k, ref_v, slots)
    assert torch.equal(key_cache, ref_k) and torch.equal(value_cache, ref_v)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("has_residual", [False, True])
def test_rms_norm(dtype, has_residual):
    x = torch.randn(257, 4096, device="cuda").to(dtype)
    weight = (1 + 0.1 * torch.randn(4096, device="cuda")).to(dtype)
    residual = torch.randn_like(x) if has_residual else None
    out, ref = rms_norm(x, weight, 1e-5, residual), rms_norm_ref(x, weight, 1e-5, residual)
    if has_residual:
        assert_close(out[1], ref[1], dtype, "new residual")
        out, ref = out[0], ref[0]
    assert_close(out, ref, dtype, "rms_norm")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim, rotary_dim", [(128, 128), (80, 40)])
def test_rotary_embedding(dtype, head_dim, rotary_dim):
    qkv = torch.randn(333, 48 * head_dim, device="cuda").to(dtype)
    query = qkv[:, : 32 * head_dim].unflatten(-1, (32, head_dim))
    key = qkv[:, 32 * head_dim : 40 * head_dim].unflatten(-1, (8, head_dim))
    positions = torch.randint(0, 8192, (333,), device="cuda")
    angles = torch.rand(8192, rotary_dim // 2, device="cuda") * 6.3
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    ref_qkv = qkv.clone()
    ref_q = ref_qkv[:, : 32 * head_dim].unflatten(-1, (32, head_dim))
    ref_k = ref_qkv[:, 32 * head_dim : 40 * head_dim].unflatten(-1, (8, head_dim))
    rotary_embedding(positions, query, key, cache)
    rotary_embedding_ref(positions, ref_q, ref_k, cache)
    assert_close(qkv, ref_qkv, dtype, "rotary")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_and_mul(dtype):
    x = (3 * torch.randn(129, 2 * 14336, device="cuda")).to(dtype)
    assert_close(silu_and_mul(x), silu_and_mul_ref(x), dtype, "silu_and_mul")


@pytest.mark.parametrize(
    "op", ["rms_norm", "silu_and_mul", "rotary_embedding", "reshape_and_cache"]
)
def test_chained_kernel_waits_for_a_write_that_lands_late(op):
    """The per-layer kernels run as programmatic dependents (``kernels.pdl.chain_launch``):
    each launched after a kernel that lets its dependents start at once and writes the op's
    input only after a long spin must still compute from the new input, eagerly and replayed
    from a CUDA graph."""
    import triton

    from kernels.pdl import chain_launch
    from tests.kernels.test_int4_gemm import assert_eager_and_replayed, late_copy_kernel

    if not chain_launch(torch.device("cuda")):
        pytest.skip("the chain needs sm_90+ and is off under TIDAL_PDL_CHAIN=0")
    dtype = torch.bfloat16
    late_copy = late_copy_kernel()
    spin = torch.empty(8192, device="cuda")
    if op in ("rms_norm", "silu_and_mul"):
        target = torch.empty(5, 4096, device="cuda", dtype=dtype)
    elif op == "rotary_embedding":
        target = torch.empty(5, 48 * 128, device="cuda", dtype=dtype)  # fused q, k, v rows
    else:  # the key rows written into the cache
        target = torch.empty(5, 8, 128, device="cuda", dtype=dtype)
    old, new = torch.randn_like(target), torch.randn_like(target)
    weight = (1 + 0.1 * torch.randn(4096, device="cuda")).to(dtype)
    positions = torch.tensor([0, 7, 300, 4095, 12], device="cuda")
    cos_sin = torch.rand(4096, 64, device="cuda") * 6.3
    cos_sin = torch.cat([cos_sin.cos(), cos_sin.sin()], dim=-1)
    value = torch.randn(5, 8, 128, device="cuda", dtype=dtype)
    slots = torch.tensor([3, 17, 40, -1, 62], device="cuda")
    key_cache = torch.zeros(4, 16, 8, 128, device="cuda", dtype=dtype)

    def run(x, reference=False):  # the op on x (the kernel, or its reference)
        if op == "rms_norm":
            return (rms_norm_ref if reference else rms_norm)(x, weight, 1e-5)
        if op == "silu_and_mul":
            return (silu_and_mul_ref if reference else silu_and_mul)(x)
        if op == "rotary_embedding":
            rows = x.unflatten(-1, (48, 128))
            rotate = rotary_embedding_ref if reference else rotary_embedding
            rotate(positions, rows[:, :32], rows[:, 32:40], cos_sin)
            return x
        cache = reshape_and_cache_ref if reference else reshape_and_cache
        cache(x, value, key_cache, torch.zeros_like(key_cache), slots)
        return key_cache

    ref = run(new.clone(), reference=True).clone()

    def step():
        key_cache.zero_()
        target.copy_(old)
        late_copy[(triton.cdiv(target.numel(), 4096),)](
            new, target, spin, target.numel(), SPIN=20000, BLOCK=4096
        )
        return run(target)

    assert_eager_and_replayed(step, ref, f"{op} after a late write")
