"""What one worker process holds: the engine and its loop, storage clients, the job store,
the lane controller and the metrics. Built once per process, started before consuming."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from producer.jobs import JobStore
from producer.queues import queue_name
from producer.storage import Storage, open_storage
from worker.inflight import InflightLeases
from worker.lanes import LaneController
from worker.metrics import WorkerMetrics
from worker.settings import WorkerSettings

logger = logging.getLogger(__name__)

HIGH_PRIORITY = 0  # engine priority of high-lane requests (lower runs first, as in vLLM)
NORMAL_PRIORITY = 10


class WorkerRuntime:
    """The engine, its loop and everything a chunk task needs, one per process."""

    def __init__(self, settings: WorkerSettings) -> None:
        import redis

        self.settings = settings
        self.metrics = WorkerMetrics()
        self.redis = redis.Redis.from_url(
            settings.broker_url, socket_timeout=30, socket_connect_timeout=10
        )
        self.jobs = JobStore(self.redis, settings.queue_prefix, settings.job_ttl_s)
        # tidal.inflight entries (KEDA counts them), owned under a lease (worker/inflight.py)
        self.inflight = InflightLeases(
            self.redis, settings.queue_prefix, settings.inflight_lease_s, self.metrics
        )
        self.engine: Any = None
        self.loop: Any = None
        self.lanes = LaneController(
            queue_name("normal", settings.queue_prefix),
            settings.normal_chunk_limit(),
            settings.engine_backlog_limit(),
            engine_backlog=lambda: self.loop.num_unfinished if self.loop is not None else 0,
        )
        self.is_abandoning = False  # soft shutdown ran out: hand chunks back, write nothing
        self._storages: dict[str, Storage] = {}
        self._storage_lock = threading.Lock()
        self._start_lock = threading.Lock()

    def storage(self, url: str | None = None) -> Storage:
        url = url or self.settings.storage_url
        with self._storage_lock:
            if url not in self._storages:
                self._storages[url] = open_storage(self.settings, url)
            return self._storages[url]

    def start(self) -> float:
        """Load the engine and run one short generation; returns the seconds it took."""
        with self._start_lock:
            if self.loop is not None:
                return 0.0
            from engine.engine_loop import EngineLoop
            from engine.llm_engine import LLMEngine

            start = time.monotonic()
            if self.settings.metrics_port:  # up before the (long) load: the startup probe
                self.metrics.serve(self.settings.metrics_port, self.is_alive, self.is_ready)
            self.engine = LLMEngine(self.settings.engine_config())
            self.loop = EngineLoop(self.engine)
            self.generate_once()
            duration_s = time.monotonic() - start
            self.metrics.warmup_duration.set(duration_s)
            live = self.metrics.live
            live.redis, live.prefix = self.redis, self.settings.queue_prefix
            live.engine_stats = self.loop.stats
            live.chunks_in_flight = lambda: len(self.lanes.in_flight)
            logger.info("engine ready in %.1f s (max_model_len %d)", duration_s,
                        self.engine.max_model_len)  # fmt: skip
            return duration_s

    def is_alive(self) -> bool:
        """False once the engine loop has died (the process is about to exit non-zero)."""
        return self.loop is None or not self.loop.is_dead

    def is_ready(self) -> bool:
        return (
            self.loop is not None
            and not self.loop.is_dead
            and bool(self.metrics.value("tidal_worker_ready"))
        )

    def generate_once(self) -> float:
        """One short greedy generation through the loop (warm-up); returns its seconds."""
        from engine.sampling_params import SamplingParams

        start = time.monotonic()
        request_id = f"warmup-{time.time_ns()}"
        self.loop.submit(request_id, "Hello", SamplingParams(max_tokens=4, temperature=0)).result()
        return time.monotonic() - start

    def chunk_started(self, task_id: str, lane: str) -> None:
        self.lanes.started(task_id, lane)
        self.inflight.started(task_id, lane)

    def chunk_finished(self, task_id: str) -> None:
        self.lanes.finished(task_id)
        self.inflight.finished(task_id)

    def abandon_after(self, delay_s: float) -> None:
        """Soft shutdown: after ``delay_s`` abort running chunks and hand them back."""

        def abandon() -> None:
            self.is_abandoning = True
            logger.warning("soft shutdown timeout: handing back %d chunk(s)",
                           len(self.lanes.in_flight))  # fmt: skip

        timer = threading.Timer(max(0.0, delay_s), abandon)
        timer.daemon = True
        timer.start()
