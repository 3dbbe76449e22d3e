"""C++ versions of the layer ops where, on a CPU, PyTorch's composition costs more than the math.

Each ``*_cpu`` function has its reference's signature (``kernels/<op>.py``) and computes the
same formula in fp32 (fp32 or bf16 storage):

- ``paged_attention_cpu``: the reference copies every sequence's KV blocks out of the paged
  cache before ``scaled_dot_product_attention``; that copy (and, for prefill chunks, the
  causal mask it builds), redone each layer of each step, costs more than the attention
  itself at these sizes. The kernel takes every query row (decode and prefill alike) with the
  number of positions it sees, walks the block table and reads the K/V rows in place.
- ``rotary_embedding_cpu``, ``rms_norm_cpu`` (with the residual add fused),
  ``silu_and_mul_cpu`` and ``reshape_and_cache_cpu``: one pass over the rows instead of
  several small tensor ops, whose overhead dominates at decode batch sizes.

The kernels (``csrc/cpu_kernels.cpp``) are compiled on first use with the system C++ compiler
(``$CXX``, else ``c++``) for this CPU (``-march=native``) and cached under
``$TIDAL_KERNEL_CACHE`` (default ``~/.cache/tidal/kernels``), keyed by the source, the
compiler and the CPU. Without a compiler the ops log one warning and fall back to the
references, so results never depend on it; inputs they do not cover (other dtypes, other
devices, layouts the kernels do not take) go to the references too.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch

from kernels.paged_attention import paged_attention_ref
from kernels.reshape_and_cache import reshape_and_cache_ref
from kernels.rms_norm import rms_norm_ref
from kernels.rotary_embedding import rotary_embedding_ref
from kernels.silu_and_mul import silu_and_mul_ref

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).parent / "csrc" / "cpu_kernels.cpp"
_FLAGS = [
    "-O3",
    "-march=native",
    "-fno-trapping-math",
    "-fopenmp",
    "-std=c++17",
    "-shared",
    "-fPIC",
]
_ABI_VERSION = 5
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_ARGTYPES = {
    "tidal_paged_attention": (
        [ctypes.c_void_p] * 8  # query, key_cache, value_cache, out, row token/seq/len, tables
        + [ctypes.c_int64] * 2  # table_stride, query_row_stride
        + [ctypes.c_int] * 5  # num_rows, num_heads, num_kv_heads, head_dim, block_size
        + [ctypes.c_float, ctypes.c_int, ctypes.c_int]  # scale, sliding_window, num_threads
    ),
    "tidal_rotary": (
        [ctypes.c_void_p] * 4  # positions, query, key, cos_sin
        + [ctypes.c_int] * 5  # num_tokens, num_heads, num_kv_heads, head_dim, rotary_dim
        + [ctypes.c_int64] * 2  # query_row_stride, key_row_stride
        + [ctypes.c_int]  # num_threads
    ),
    "tidal_rms_norm": (
        [ctypes.c_void_p] * 5  # x, residual, weight, out, residual_out
        + [ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_int]  # tokens, hidden, eps, thr
    ),
    "tidal_silu_and_mul": (
        [ctypes.c_void_p] * 2  # x, out
        + [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int]  # tokens, d, stride, thr
    ),
    "tidal_reshape_and_cache": (
        [ctypes.c_void_p] * 5  # key, value, key_cache, value_cache, slots
        + [ctypes.c_int]  # num_tokens
        + [ctypes.c_int64] * 3  # row width, key and value row strides
    ),
}


def kernel_cache_dir() -> Path:
    """Where compiled CPU kernels are kept (``$TIDAL_KERNEL_CACHE`` or ``~/.cache/tidal``)."""
    if env := os.environ.get("TIDAL_KERNEL_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tidal" / "kernels"


def _cpu_identity() -> str:
    """The CPU model and its feature flags: ``-march=native`` builds are only valid there."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({ln for ln in lines if ln.startswith(wanted)}))


def _build(compiler: str, target: Path) -> None:
    """Compile the kernel to ``target`` atomically (parallel workers may build at once)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        cmd = [compiler, *_FLAGS, str(_SOURCE), "-o", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def load_library() -> ctypes.CDLL | None:
    """The compiled CPU kernels, building them on first use; None (with a warning) if they can't."""
    compiler = os.environ.get("CXX", "c++")
    parts = [_SOURCE.read_bytes(), compiler, " ".join(_FLAGS), _cpu_identity()]
    key = hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
    target = kernel_cache_dir() / f"cpu_kernels-{key}.so"
    try:
        if not target.exists():
            _build(compiler, target)
        lib = ctypes.CDLL(str(target))
        if lib.tidal_abi_version() != _ABI_VERSION:
            raise RuntimeError(f"{target} has ABI {lib.tidal_abi_version()}, want {_ABI_VERSION}")
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        log.warning(
            "tidal's C++ CPU kernels are unavailable (%s); using the PyTorch references, "
            "which are slower. Install a C++ compiler with OpenMP (g++) to enable them.",
            exc,
        )
        return None
    for prefix, argtypes in _ARGTYPES.items():
        for suffix in _SUFFIX.values():
            fn = getattr(lib, f"{prefix}_{suffix}")
            fn.argtypes = argtypes
            fn.restype = None
    return lib


def _rows_of_heads(*tensors: torch.Tensor) -> bool:
    """Each [num_tokens, heads, head_dim] tensor has contiguous rows (the rows may be strided)."""
    return all(t.stride(2) == 1 and t.stride(1) == t.shape[2] for t in tensors)


def _kernel(prefix: str, dtype: torch.dtype):
    """The compiled ``prefix`` kernel for ``dtype``, or None (no library, or a dtype it lacks)."""
    lib = load_library()
    if lib is None or dtype not in _SUFFIX:
        return None
    return getattr(lib, f"{prefix}_{_SUFFIX[dtype]}")


def paged_attention_rows_cpu(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    row_token: torch.Tensor,
    row_seq: torch.Tensor,
    row_len: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    out: torch.Tensor,
) -> None:
    """Attention of the query rows ``row_token`` into the same rows of ``out``, in C++.

    Row ``i`` is token ``row_token[i]`` of sequence ``row_seq[i]`` (its row of
    ``block_tables``) and attends to that sequence's first ``row_len[i]`` cached positions
    (the last ``sliding_window`` of them when set). Shapes as in ``paged_attention_ref``;
    ``out`` must be contiguous, ``query`` contiguous within a row (rows may be strided, as the
    q slice of a fused qkv projection is).
    """
    if load_library() is None:
        raise RuntimeError("tidal's C++ CPU kernels could not be built (see the log)")
    num_heads, head_dim = query.shape[1:]
    _, block_size, num_kv_heads, _ = key_cache.shape
    if not _rows_of_heads(query) or not out.is_contiguous():
        raise ValueError("query rows must be [num_heads, head_dim] contiguous and out contiguous")
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("the KV caches must be contiguous")
    dtype = query.dtype
    if {key_cache.dtype, value_cache.dtype, out.dtype} != {dtype} or dtype not in _SUFFIX:
        raise ValueError(
            f"query, caches and out must share one dtype of {sorted(map(str, _SUFFIX))}, got "
            f"{query.dtype}, {key_cache.dtype}, {value_cache.dtype}, {out.dtype}"
        )
    rows = [t.to(torch.int32).contiguous() for t in (row_token, row_seq, row_len)]
    if len({t.numel() for t in rows}) != 1:
        raise ValueError("row_token, row_seq and row_len must have one entry per row")
    tables = block_tables.to(torch.int32).contiguous()
    if rows[0].numel():
        capacity = tables.shape[1] * block_size
        if int(rows[2].max()) > capacity or int(rows[0].max()) >= query.shape[0]:
            raise ValueError(
                f"a row sees more positions than its block table holds ({capacity}) or names "
                f"a token beyond the query's {query.shape[0]}"
            )
    _kernel("tidal_paged_attention", dtype)(
        query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), out.data_ptr(),
        *(t.data_ptr() for t in rows), tables.data_ptr(),
        tables.stride(0), query.stride(0),
        rows[0].numel(), num_heads, num_kv_heads, head_dim, block_size,
        scale, sliding_window or 0, torch.get_num_threads(),
    )  # fmt: skip


def paged_attention_cpu(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``paged_attention_ref``'s contract, every query row in C++ (other inputs: reference)."""
    args = (scale, max_query_len, max_seq_len, sliding_window)
    if query.device.type != "cpu" or _kernel("tidal_paged_attention", query.dtype) is None:
        return paged_attention_ref(
            query, key_cache, value_cache, query_start_loc, seq_lens, block_tables, *args, out=out
        )
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype)
    paged_attention_rows_cpu(
        query, key_cache, value_cache, block_tables, *_query_rows(query_start_loc, seq_lens),
        scale, sliding_window, out,
    )  # fmt: skip
    return out


# Every layer of a step passes the same metadata: its rows are worked out once. One tuple
# (copies of the metadata, the rows), replaced whole, so threads never see half of it.
_last_rows: tuple | None = None


def _query_rows(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token, sequence, positions seen) of every query row, as int32."""
    global _last_rows
    last = _last_rows
    if last is not None and torch.equal(last[0], query_start_loc):
        if torch.equal(last[1], seq_lens):
            return last[2]
    starts = query_start_loc.to(torch.int64)
    q_lens = starts[1:] - starts[:-1]
    row_seq = torch.repeat_interleave(torch.arange(q_lens.numel()), q_lens)
    row_token = torch.arange(int(starts[-1]))
    # A chunk's row i of q sees its sequence's cached prefix plus rows 0..i of the chunk.
    row_len = seq_lens.to(torch.int64)[row_seq] - (starts[1:][row_seq] - row_token) + 1
    rows = tuple(t.to(torch.int32) for t in (row_token, row_seq, row_len))
    _last_rows = (query_start_loc.clone(), seq_lens.clone(), rows)
    return rows


def rotary_embedding_cpu(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> None:
    """``rotary_embedding_ref``'s contract (in place); one C++ pass over the tokens."""
    fn = _kernel("tidal_rotary", query.dtype)
    rows_ok = _rows_of_heads(query, key)
    if (
        fn is None
        or query.device.type != "cpu"
        or key.dtype != query.dtype
        or not rows_ok
        or cos_sin_cache.dtype != torch.float32
        or not cos_sin_cache.is_contiguous()
    ):
        rotary_embedding_ref(positions, query, key, cos_sin_cache)
        return
    num_tokens, num_heads, head_dim = query.shape
    pos = positions.to(torch.int64).contiguous()
    fn(
        pos.data_ptr(), query.data_ptr(), key.data_ptr(), cos_sin_cache.data_ptr(),
        num_tokens, num_heads, key.shape[1], head_dim, cos_sin_cache.shape[1],
        query.stride(0), key.stride(0), torch.get_num_threads(),
    )  # fmt: skip


def rms_norm_cpu(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``rms_norm_ref``'s contract; the residual add, the norm and the weight in one C++ pass."""
    fn = _kernel("tidal_rms_norm", x.dtype)
    same = weight.dtype == x.dtype and (residual is None or residual.dtype == x.dtype)
    tensors = (x, weight) if residual is None else (x, weight, residual)
    if (
        fn is None
        or x.device.type != "cpu"
        or not same
        or not all(t.is_contiguous() for t in tensors)
        or (residual is not None and residual.shape != x.shape)
    ):
        return rms_norm_ref(x, weight, eps, residual)
    hidden = x.shape[-1]
    out = torch.empty_like(x)
    new_residual = torch.empty_like(x) if residual is not None else None
    fn(
        x.data_ptr(), 0 if residual is None else residual.data_ptr(), weight.data_ptr(),
        out.data_ptr(), 0 if new_residual is None else new_residual.data_ptr(),
        x.numel() // hidden, hidden, eps, torch.get_num_threads(),
    )  # fmt: skip
    return out if new_residual is None else (out, new_residual)


def silu_and_mul_cpu(x: torch.Tensor) -> torch.Tensor:
    """``silu_and_mul_ref``'s contract in one C++ pass (no silu temporary, no slicing copies)."""
    fn = _kernel("tidal_silu_and_mul", x.dtype)
    if fn is None or x.device.type != "cpu" or x.shape[-1] % 2:
        return silu_and_mul_ref(x)
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)  # a view for 2-D input, strided rows included
    if x2.stride(-1) != 1:
        return silu_and_mul_ref(x)
    out = torch.empty((x2.shape[0], d), dtype=x.dtype)
    fn(x2.data_ptr(), out.data_ptr(), x2.shape[0], d, x2.stride(0), torch.get_num_threads())
    return out.view(*x.shape[:-1], d)


def reshape_and_cache_cpu(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """``reshape_and_cache_ref``'s contract: new K/V rows into their cache slots, in place."""
    fn = _kernel("tidal_reshape_and_cache", key.dtype)
    rows_ok = _rows_of_heads(key, value)
    if (
        fn is None
        or key.device.type != "cpu"
        or {value.dtype, key_cache.dtype, value_cache.dtype} != {key.dtype}
        or not rows_ok
        or not (key_cache.is_contiguous() and value_cache.is_contiguous())
        or key_cache.shape[2:] != key.shape[1:]
        or value.shape != key.shape
    ):
        reshape_and_cache_ref(key, value, key_cache, value_cache, slot_mapping)
        return
    slots = slot_mapping.to(torch.int64).contiguous()
    num_slots = key_cache.shape[0] * key_cache.shape[1]
    if slots.numel() and int(slots.max()) >= num_slots:
        raise ValueError(f"slot_mapping has a slot beyond the cache's {num_slots}")
    fn(
        key.data_ptr(), value.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
        slots.data_ptr(), key.shape[0], key.shape[1] * key.shape[2], key.stride(0),
        value.stride(0),
    )  # fmt: skip
