"""The worker's Prometheus metrics: one registry object, the names dashboards and alerts use.

Counters and histograms are updated by the chunk task; queue depth, in-flight chunks and the
engine's gauges and totals are read at scrape time (``_LiveCollector``), so they are never
stale. Queue depth counts every Redis priority sub-list of a lane (``redis_list_keys``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer

from producer.queues import LANES, inflight_key, queue_name, redis_list_keys

logger = logging.getLogger(__name__)

# Seconds: sub-second to hours (a bulk job may wait behind others for a long time).
LATENCY_BUCKETS_S = (
    0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800,
)  # fmt: skip
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class WorkerMetrics:
    """All of a worker's metrics in ``self.registry`` (tests read it with ``value()``)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.jobs_completed = Counter("tidal_jobs_completed_total", "Jobs finished", registry=r)
        self.jobs_failed = Counter(
            "tidal_jobs_failed_total", "Jobs failed or cancelled", ["reason"], registry=r
        )
        self.requests_completed = Counter(
            "tidal_requests_completed_total", "Requests answered", registry=r
        )
        self.requests_failed = Counter(
            "tidal_requests_failed_total", "Requests given an error line", ["reason"], registry=r
        )
        self.prompt_tokens = Counter("tidal_prompt_tokens_total", "Prompt tokens", registry=r)
        self.generation_tokens = Counter(
            "tidal_generation_tokens_total", "Generated tokens", registry=r
        )
        self.time_to_first_token = Histogram(
            "tidal_time_to_first_token_seconds",
            "Engine arrival to first token",
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.request_latency = Histogram(
            "tidal_request_latency_seconds",
            "Engine arrival to finish",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.queue_wait = Histogram(
            "tidal_queue_wait_seconds",
            "Submission to chunk start",
            ["lane"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.chunk_duplicates = Counter(
            "tidal_chunk_duplicates_total", "Chunks delivered again after their result existed",
            registry=r,
        )  # fmt: skip
        self.chunks_resent = Counter(
            "tidal_chunks_resent_total",
            "Chunk messages sent again: no queue and no worker held them (worker/recovery.py)",
            registry=r,
        )  # fmt: skip
        self.lost_chunk_checks = Counter(
            "tidal_lost_chunk_checks_total",
            "Lost-chunk checks (paged read of every queue list) by what asked for one: "
            "worker_death, confirmation (suspects of the last check) or safety_net",
            ["reason"],
            registry=r,
        )
        for reason in ("worker_death", "confirmation", "safety_net"):
            self.lost_chunk_checks.labels(reason)
        self.chunks_reclaimed = Counter(
            "tidal_chunks_reclaimed_total",
            "Chunk messages handed back to their queue: their worker's lease expired "
            "(worker/inflight.py)",
            registry=r,
        )  # fmt: skip
        self.worker_ready = Gauge("tidal_worker_ready", "1 once warm and consuming", registry=r)
        self.warmup_duration = Gauge(
            "tidal_warmup_duration_seconds", "Load + compile + first generation", registry=r
        )
        self.live = _LiveCollector()
        r.register(self.live)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """A sample's current value (``name`` as exposed, e.g. ``..._total``)."""
        return self.registry.get_sample_value(name, labels or {})

    def serve(self, port: int, is_alive: Callable[[], bool], is_ready: Callable[[], bool]) -> None:
        """Serve on ``port`` (a daemon thread): ``/metrics``; ``/healthz`` 200 while the
        process and its engine loop live (also while loading), else 503; ``/ready`` 200 once
        warm and consuming, else 503."""
        metrics_app = make_wsgi_app(self.registry)

        def app(environ, start_response):
            path = environ.get("PATH_INFO", "/")
            if path in ("/healthz", "/ready"):
                is_ok = is_alive() if path == "/healthz" else is_ready()
                status = "200 OK" if is_ok else "503 Service Unavailable"
                start_response(status, [("Content-Type", "text/plain")])
                return [b"ok\n" if is_ok else b"not ok\n"]
            return metrics_app(environ, start_response)

        server = make_server("", port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
        threading.Thread(target=server.serve_forever, name="tidal-metrics", daemon=True).start()
        logger.info("metrics on :%d/metrics (probes /healthz, /ready)", port)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes every few seconds
        return None


class _LiveCollector:
    """Values read at scrape time: queue depth from Redis, engine stats, chunks in flight."""

    def __init__(self) -> None:
        self.redis: Any = None
        self.prefix = "tidal"
        self.engine_stats: Callable[[], Any] | None = None
        self.chunks_in_flight: Callable[[], int] = lambda: 0

    def collect(self):
        depth = GaugeMetricFamily("tidal_queue_depth", "Messages waiting per lane", labels=["lane"])
        if self.redis is not None:
            for lane in LANES:
                try:
                    pipe = self.redis.pipeline()
                    for key in redis_list_keys(queue_name(lane, self.prefix)):
                        pipe.llen(key)
                    depth.add_metric([lane], float(sum(pipe.execute())))
                except Exception as exc:  # a scrape must not fail because Redis blinked
                    logger.warning("queue depth unavailable: %s", exc)
        yield depth
        yield GaugeMetricFamily(
            "tidal_chunks_in_flight", "Chunk tasks running here", value=self.chunks_in_flight()
        )
        stats = self.engine_stats() if self.engine_stats is not None else None
        if stats is None:
            return
        gauges = {
            "tidal_engine_requests_running": ("Requests in the running batch", stats.num_running),
            "tidal_engine_requests_waiting": ("Requests queued in the engine", stats.num_waiting),
            "tidal_kv_cache_usage_ratio": ("Used KV cache blocks (0-1)", stats.kv_cache_usage),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=float(value))
        counters = {
            "tidal_preemptions_total": ("Preemptions", stats.num_preemptions_total),
            "tidal_prefix_cache_queries_total": (
                "Prompt tokens looked up in the prefix cache",
                stats.prefix_cache_queries_total,
            ),
            "tidal_prefix_cache_hits_total": (
                "Prompt tokens found in the prefix cache",
                stats.prefix_cache_hits_total,
            ),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name.removesuffix("_total"), doc, value=float(value))

    def inflight_hash(self) -> str:
        return inflight_key(self.prefix)
