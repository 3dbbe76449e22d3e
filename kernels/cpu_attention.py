"""Paged attention on the CPU: decode rows read the cache blocks in place (C++), the rest SDPA.

The PyTorch reference (``paged_attention_ref``) copies every decode sequence's KV blocks out of
the paged cache before ``scaled_dot_product_attention``; on a CPU that copy, written and read
again each layer of each step, costs more than the attention itself. ``paged_attention_cpu``
has the reference's signature and sends every decode row (one new token) to a small C++ kernel
(``csrc/paged_decode_cpu.cpp``) that walks the block table and reads each K/V vector once;
sequences with longer query runs (prefill chunks), where the copy is amortized over many query
rows, still go through the reference.

The kernel is compiled on first use with the system C++ compiler (``$CXX``, else ``c++``) for
this CPU (``-march=native``) and cached under ``$TIDAL_KERNEL_CACHE`` (default
``~/.cache/tidal/kernels``), keyed by the source, the compiler and the CPU. Without a compiler
the op logs one warning and falls back to the reference, so results never depend on it.
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

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).parent / "csrc" / "paged_decode_cpu.cpp"
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC"]
_ABI_VERSION = 1
_ENTRIES = {torch.float32: "tidal_paged_decode_f32", torch.bfloat16: "tidal_paged_decode_bf16"}
_ARGTYPES = (
    [ctypes.c_void_p] * 8  # query, key_cache, value_cache, out, seq_index, qsl, lens, tables
    + [ctypes.c_int64] * 2  # table_stride, query_row_stride
    + [ctypes.c_int] * 5  # num_decode, num_heads, num_kv_heads, head_dim, block_size
    + [ctypes.c_float, ctypes.c_int, ctypes.c_int]  # scale, sliding_window, num_threads
)


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
    """The compiled decode kernel, building it on first use; None (with a warning) if it can't."""
    compiler = os.environ.get("CXX", "c++")
    parts = [_SOURCE.read_bytes(), compiler, " ".join(_FLAGS), _cpu_identity()]
    key = hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
    target = kernel_cache_dir() / f"paged_decode_cpu-{key}.so"
    try:
        if not target.exists():
            _build(compiler, target)
        lib = ctypes.CDLL(str(target))
        if lib.tidal_abi_version() != _ABI_VERSION:
            raise RuntimeError(f"{target} has ABI {lib.tidal_abi_version()}, want {_ABI_VERSION}")
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        log.warning(
            "the C++ CPU decode attention is unavailable (%s); using the PyTorch reference, "
            "which is slower. Install a C++ compiler with OpenMP (g++) to enable it.",
            exc,
        )
        return None
    for name in _ENTRIES.values():
        fn = getattr(lib, name)
        fn.argtypes = _ARGTYPES
        fn.restype = None
    return lib


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


def paged_decode_cpu(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    seq_index: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    out: torch.Tensor,
) -> None:
    """Attention of the sequences ``seq_index`` (one query row each) into ``out``, in C++.

    Shapes as in ``paged_attention_ref``; ``out`` must be contiguous, ``query`` contiguous
    within a row (rows may be strided, as the q slice of a fused qkv projection is).
    """
    lib = load_library()
    if lib is None:
        raise RuntimeError("the C++ CPU decode attention could not be built (see the log)")
    num_heads, head_dim = query.shape[1:]
    _, block_size, num_kv_heads, _ = key_cache.shape
    if query.stride(2) != 1 or query.stride(1) != head_dim or not out.is_contiguous():
        raise ValueError("query rows must be [num_heads, head_dim] contiguous and out contiguous")
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("the KV caches must be contiguous")
    dtype = query.dtype
    if {key_cache.dtype, value_cache.dtype, out.dtype} != {dtype} or dtype not in _ENTRIES:
        raise ValueError(
            f"query, caches and out must share one dtype of {sorted(map(str, _ENTRIES))}, got "
            f"{query.dtype}, {key_cache.dtype}, {value_cache.dtype}, {out.dtype}"
        )
    int32 = [t.to(torch.int32).contiguous() for t in (seq_index, query_start_loc, seq_lens)]
    tables = block_tables.to(torch.int32).contiguous()
    getattr(lib, _ENTRIES[dtype])(
        _ptr(query), _ptr(key_cache), _ptr(value_cache), _ptr(out),
        *(_ptr(t) for t in int32), _ptr(tables),
        tables.stride(0), query.stride(0),
        seq_index.numel(), num_heads, num_kv_heads, head_dim, block_size,
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
    """``paged_attention_ref``'s contract; decode rows in C++, longer query runs by reference."""
    args = (scale, max_query_len, max_seq_len, sliding_window)
    if query.device.type != "cpu" or query.dtype not in _ENTRIES or load_library() is None:
        return paged_attention_ref(
            query, key_cache, value_cache, query_start_loc, seq_lens, block_tables, *args, out=out
        )
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype)
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    if max_query_len == 1:
        decode = torch.arange(q_lens.numel(), dtype=torch.int32)
        others = []
    else:
        decode = (q_lens == 1).nonzero().flatten()
        others = (q_lens > 1).nonzero().flatten().tolist()
    if decode.numel():
        paged_decode_cpu(
            query, key_cache, value_cache, query_start_loc, seq_lens, block_tables, decode,
            scale, sliding_window, out,
        )  # fmt: skip
    if others:
        starts = query_start_loc.tolist()
        rows = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in others])
        sub_starts = torch.zeros(len(others) + 1, dtype=torch.int32)
        sub_starts[1:] = torch.cumsum(q_lens[others], 0)
        out[rows] = paged_attention_ref(
            query[rows], key_cache, value_cache, sub_starts, seq_lens[others],
            block_tables[others], *args,
        )  # fmt: skip
    return out
