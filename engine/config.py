"""The engine's configuration (frozen) and the values discovered at start-up."""

from __future__ import annotations

from dataclasses import dataclass

import torch

_DTYPES = {
    "auto": None,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


@dataclass(frozen=True)
class EngineConfig:
    """What the user asks of the engine; validated at construction (``ValueError``).

    ``model=None`` is the embedded default model. ``dtype="auto"`` is float32 on CPU and
    bfloat16 on CUDA. ``max_model_len=None`` takes the model's own limit. The KV cache size is
    ``kv_cache_memory_bytes`` when given, else ``gpu_memory_utilization`` of the GPU's memory
    on CUDA (minus what the model took), else 1 GiB on CPU. On CUDA, unless
    ``enforce_eager`` is set, decode steps replay from CUDA graphs and other steps of up to
    ``max_cudagraph_capture_size`` tokens from piecewise ones (``engine/cuda_graph.py``; 0:
    those run eagerly), on every tensor-parallel rank alike. With ``async_scheduling`` (on
    by default with CUDA) the host schedules and launches step n + 1 while the GPU still
    runs step n, feeding it step n's samples on the device (``LLMEngine.step``).
    """

    model: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    enforce_eager: bool = False
    max_cudagraph_capture_size: int = 2048  # as max_num_batched_tokens: every step
    tensor_parallel_size: int = 1
    load_format: str = "auto"  # "dummy": random weights, nothing read (benchmarks)
    # None: on with CUDA, off on CPU (where the forward runs on the calling thread anyway).
    async_scheduling: bool | None = None

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not supported; allowed: {sorted(_DTYPES)}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(
                f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}"
            )
        positive = {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "tensor_parallel_size": self.tensor_parallel_size,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.max_cudagraph_capture_size < 0:
            raise ValueError(
                f"max_cudagraph_capture_size must be >= 0 (0: steps with prefill tokens run "
                f"eagerly), got {self.max_cudagraph_capture_size}"
            )
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be 'auto' or 'dummy', got {self.load_format!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError(f"kv_cache_memory_bytes must be > 0, got {self.kv_cache_memory_bytes}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )

    def piecewise_capture_tokens(self) -> int:
        """The largest step (tokens) replayed from piecewise CUDA graphs: 0 with
        ``enforce_eager`` (steps stay eager), else ``max_cudagraph_capture_size`` up to
        ``max_num_batched_tokens`` (no step holds more)."""
        if self.enforce_eager:
            return 0
        return min(self.max_cudagraph_capture_size, self.max_num_batched_tokens)

    def resolve_async_scheduling(self, device: torch.device) -> bool:
        if self.async_scheduling is not None:
            return self.async_scheduling
        return device.type == "cuda"

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        dtype = _DTYPES[self.dtype]
        if dtype is not None:
            return dtype
        return torch.bfloat16 if device.type == "cuda" else torch.float32


@dataclass(frozen=True)
class RuntimeInfo:
    """Values found at start-up; nobody writes them back into the config."""

    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    num_kv_blocks: int
    block_size: int
    attention_backend: str  # "triton" | "torch-reference"
