"""Build the Grafana dashboard JSON for the worker's metrics (worker/metrics.py).

The committed ``infra/k8s/base/grafana/tidal-dashboard.json`` is this module's output; a test
re-renders it and checks that every metric it names is one the worker exports. Regenerate with
``python -m infra.dashboard``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUTPUT_PATH = Path(__file__).parent / "k8s" / "base" / "grafana" / "tidal-dashboard.json"
UID = "tidal-worker"


def _q(metric: str, rate: str = "5m") -> str:
    return f"histogram_quantile({{q}}, sum by (le) (rate({metric}_bucket[{rate}])))"


# (title, unit, [(legend, expr)]): one time-series panel each, in reading order.
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Queue depth by lane", "short", [("{{lane}}", "sum by (lane) (tidal_queue_depth)")]),
    (
        "Chunks in flight and ready workers",
        "short",
        [
            ("chunks in flight", "sum(tidal_chunks_in_flight)"),
            ("ready workers", "sum(tidal_worker_ready)"),
        ],
    ),
    (
        "Generated tokens/s",
        "short",
        [
            ("generation", "sum(rate(tidal_generation_tokens_total[5m]))"),
            ("prompt", "sum(rate(tidal_prompt_tokens_total[5m]))"),
        ],
    ),
    (
        "Requests/s",
        "reqps",
        [
            ("completed", "sum(rate(tidal_requests_completed_total[5m]))"),
            ("failed {{reason}}", "sum by (reason) (rate(tidal_requests_failed_total[5m]))"),
        ],
    ),
    (
        "Jobs",
        "short",
        [
            ("completed", "sum(increase(tidal_jobs_completed_total[1h]))"),
            ("failed {{reason}}", "sum by (reason) (increase(tidal_jobs_failed_total[1h]))"),
        ],
    ),
    (
        "Queue wait p50 / p95 by lane",
        "s",
        [
            (
                "p50 {{lane}}",
                "histogram_quantile(0.5, sum by (le, lane) "
                "(rate(tidal_queue_wait_seconds_bucket[5m])))",
            ),
            (
                "p95 {{lane}}",
                "histogram_quantile(0.95, sum by (le, lane) "
                "(rate(tidal_queue_wait_seconds_bucket[5m])))",
            ),
        ],
    ),
    (
        "Time to first token",
        "s",
        [
            ("p50", _q("tidal_time_to_first_token_seconds").format(q=0.5)),
            ("p99", _q("tidal_time_to_first_token_seconds").format(q=0.99)),
        ],
    ),
    (
        "Request latency",
        "s",
        [
            ("p50", _q("tidal_request_latency_seconds").format(q=0.5)),
            ("p99", _q("tidal_request_latency_seconds").format(q=0.99)),
        ],
    ),
    (
        "Engine batch",
        "short",
        [
            ("running", "sum(tidal_engine_requests_running)"),
            ("waiting", "sum(tidal_engine_requests_waiting)"),
        ],
    ),
    (
        "KV cache usage and preemptions",
        "percentunit",
        [
            ("usage {{pod}}", "max by (pod) (tidal_kv_cache_usage_ratio)"),
            ("preemptions/s", "sum(rate(tidal_preemptions_total[5m]))"),
        ],
    ),
    (
        "Prefix cache hit ratio",
        "percentunit",
        [
            (
                "hits / queries",
                "sum(rate(tidal_prefix_cache_hits_total[5m])) "
                "/ clamp_min(sum(rate(tidal_prefix_cache_queries_total[5m])), 1e-9)",
            )
        ],
    ),
    (
        "Duplicate chunk executions and warm-up time",
        "short",
        [
            ("duplicates/h", "sum(increase(tidal_chunk_duplicates_total[1h]))"),
            ("warm-up s {{pod}}", "max by (pod) (tidal_warmup_duration_seconds)"),
        ],
    ),
]


def build() -> dict[str, Any]:
    """The dashboard as a dict (Grafana schema 39, a Prometheus datasource variable)."""
    panels = []
    for index, (title, unit, targets) in enumerate(PANELS):
        panels.append(
            {
                "id": index + 1,
                "type": "timeseries",
                "title": title,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [
                    {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
                    for i, (legend, expr) in enumerate(targets)
                ],
            }
        )
    return {
        "uid": UID,
        "title": "tidal workers",
        "tags": ["tidal"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-24h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Prometheus",
                }
            ]
        },
        "panels": panels,
    }


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard dict."""
    return [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]


def render_text() -> str:
    """The JSON file text."""
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    """Write the dashboard JSON (``--check``: only compare, exit 1 if stale)."""
    text = render_text()
    if argv == ["--check"]:
        return 0 if OUTPUT_PATH.read_text() == text else 1
    OUTPUT_PATH.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
