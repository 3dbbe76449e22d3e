"""Worker settings (``TIDAL_*`` env vars), mapped explicitly to the engine and Celery."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from producer.settings import ProducerSettings


class WorkerSettings(ProducerSettings):
    """Everything one worker process needs: engine shape, delivery timing, metrics, warm-up.

    ``visibility_timeout_s`` must exceed the longest a chunk can spend reserved + running +
    uploading, or a second copy is delivered while the first still runs (duplicates are safe,
    but wasteful). ``soft_shutdown_timeout_s`` must stay below the pod's grace period.
    """

    # engine
    model: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    enforce_eager: bool = False  # True: no CUDA graphs (every step launches eagerly)
    # None: on with CUDA; True/False forces it (engine.config.EngineConfig.async_scheduling)
    async_scheduling: bool | None = None
    max_cudagraph_capture_size: int = Field(
        default=2048, ge=0, description="steps with prefill tokens up to this many tokens "
        "replay piecewise CUDA graphs (0: eager)"
    )  # fmt: skip
    seed: int = 0
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs of one model (ranks)")
    # Celery and delivery
    # Chunk threads only wait on the engine, so they are cheap: the ones normal chunks may
    # not take serve the high lane, many at a time.
    concurrency: int = Field(default=16, ge=2, description="chunk threads (both lanes)")
    max_normal_chunks: int | None = Field(
        default=None, ge=1, description="normal chunks in flight before pausing (3)"
    )
    max_engine_backlog: int | None = Field(
        default=None, ge=1, description="unfinished engine requests before pausing normal"
    )
    visibility_timeout_s: int = Field(default=4 * 3600, ge=1)
    unacked_restore_interval_s: int = Field(default=10, ge=1)
    unacked_restore_throttle: int = Field(default=10, ge=1)
    soft_shutdown_timeout_s: float = Field(default=20.0, ge=0)
    # A chunk whose message a dying worker had popped but not yet recorded as unacked is in
    # no queue and no unacked hash. One worker per interval looks for worker deaths (expired
    # leases); after one, it checks for such chunks (a paged read of the queues) and sends
    # them again once missing in two checks in a row. Without a death, a full check runs
    # only every full-check interval (a safety net: a Redis failover can drop a BRPOP reply
    # too) (worker/recovery.py).
    lost_chunk_sweep_interval_s: float = Field(default=60.0, gt=0)
    lost_chunk_full_check_interval_s: float = Field(default=6 * 3600.0, gt=0)
    # Each worker's in-flight entries (counted by KEDA) live under a lease it refreshes every
    # lease/4; every lease one worker removes the entries of workers whose lease expired (a
    # SIGKILL) and hands their chunks back to the queues (worker/inflight.py).
    inflight_lease_s: float = Field(default=60.0, gt=0)
    chunk_max_retries: int = Field(default=5, ge=0)
    chunk_retry_backoff_s: float = Field(default=2.0, ge=0)
    chunk_retry_backoff_max_s: float = Field(default=120.0, ge=0)
    # warm-up and metrics: beat sends a warm-up on a crontab or every N seconds (not both)
    warmup_cron: str | None = Field(default=None, description="crontab 'm h dom mon dow'")
    warmup_interval_s: float | None = Field(
        default=None, gt=0, description="seconds between warm-ups (instead of a crontab)"
    )
    warmup_expires_s: float = Field(default=600.0, gt=0)
    metrics_port: int | None = Field(default=9100, description="None or 0 turns it off")
    metrics_interval_s: float = Field(default=5.0, gt=0)

    @model_validator(mode="after")
    def _one_warmup_schedule(self) -> WorkerSettings:
        if self.warmup_cron and self.warmup_interval_s is not None:
            raise ValueError(
                "set either warmup_cron (TIDAL_WARMUP_CRON) or warmup_interval_s "
                "(TIDAL_WARMUP_INTERVAL_S), not both"
            )
        return self

    def engine_config(self) -> Any:
        """The ``EngineConfig`` these settings describe."""
        from engine.config import EngineConfig

        return EngineConfig(
            model=self.model,
            dtype=self.dtype,
            device=self.device,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            gpu_memory_utilization=self.gpu_memory_utilization,
            enable_prefix_caching=self.enable_prefix_caching,
            enforce_eager=self.enforce_eager,
            async_scheduling=self.async_scheduling,
            max_cudagraph_capture_size=self.max_cudagraph_capture_size,
            seed=self.seed,
            tensor_parallel_size=self.tensor_parallel_size,
        )

    def normal_chunk_limit(self) -> int:
        """Normal chunks in flight at most; at least one thread always stays for high."""
        limit = self.max_normal_chunks or min(3, self.concurrency - 1)
        if limit >= self.concurrency:
            raise ValueError(
                f"max_normal_chunks ({limit}) must be below concurrency ({self.concurrency}) "
                "so that the high lane always has a thread"
            )
        return limit

    def engine_backlog_limit(self) -> int:
        return self.max_engine_backlog or 2 * self.max_num_seqs
