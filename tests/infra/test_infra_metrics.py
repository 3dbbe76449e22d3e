"""The dashboard and the alert rules parse as PromQL and name only metrics the worker exports
(read from worker.metrics' registry), plus the one KEDA metric the no-worker alert needs."""

from __future__ import annotations

import json

import promql_parser
import pytest
import yaml
from infra_helpers import REPO

from infra import dashboard

BASE = REPO / "infra" / "k8s" / "base"
# Exported by KEDA's operator, not the worker: the only source of queue depth at zero workers.
EXTERNAL_METRICS = {"keda_scaler_metrics_value"}


def exported_names() -> set[str]:
    """Every series name the worker's registry can produce (from metric metadata, so a labelled
    metric counts even before its first observation)."""
    from engine.llm_engine import EngineStats
    from worker.metrics import WorkerMetrics

    metrics = WorkerMetrics()
    # The engine gauges are read at scrape time from the engine loop; give the collector a
    # real (all-zero) EngineStats snapshot so that they are listed too.
    metrics.live.engine_stats = lambda: EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0)
    suffixes = {
        "counter": ["_total", "_created"],
        "gauge": [""],
        "histogram": ["_bucket", "_sum", "_count", "_created"],
        "summary": ["", "_sum", "_count", "_created"],
        "info": ["_info"],
    }
    names = set()
    for family in metrics.registry.collect():
        names.update(family.name + s for s in suffixes.get(family.type, [""]))
    return names


def selectors(expr) -> set[str]:
    """Metric names of all vector selectors in a parsed expression."""
    found: set[str] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, promql_parser.VectorSelector):
            found.add(node.name)
            continue
        for attr in ("lhs", "rhs", "expr", "vector_selector", "param"):
            child = getattr(node, attr, None)
            if child is not None and not isinstance(child, (str, int, float)):
                stack.append(child)
        stack.extend(getattr(node, "args", None) or [])
    return found


def alert_rules() -> list[dict]:
    rule = yaml.safe_load((BASE / "prometheusrule.yaml").read_text())
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def test_selectors_walks_the_whole_tree():
    expr = promql_parser.parse(
        "histogram_quantile(0.9, sum by (le) (rate(a_bucket[5m]))) / clamp_min(b, 1) > 0 "
        "unless on () count(c offset 5m)"
    )
    assert selectors(expr) == {"a_bucket", "b", "c"}
    with pytest.raises(ValueError):
        promql_parser.parse("sum(rate(a[5m])")


def test_committed_dashboard_is_fresh():
    committed = (BASE / "grafana" / "tidal-dashboard.json").read_text()
    assert committed == dashboard.render_text(), "run `python -m infra.dashboard` and commit"
    assert json.loads(committed)["panels"]


def test_dashboard_names_only_exported_metrics():
    exported = exported_names()
    used = set()
    for expr in dashboard.expressions(dashboard.build()):
        used |= selectors(promql_parser.parse(expr))
    assert used, "the dashboard queries nothing"
    assert used <= exported, f"not exported by the worker: {sorted(used - exported)}"


def test_alerts_parse_and_name_only_exported_metrics():
    exported = exported_names() | EXTERNAL_METRICS
    rules = alert_rules()
    assert {r["alert"] for r in rules} >= {
        "TidalHighLaneWaitTooLong",
        "TidalRequestErrorRateHigh",
        "TidalKVCacheSaturated",
        "TidalNoWorkersWhileWorkQueued",
    }
    for rule in rules:
        used = selectors(promql_parser.parse(rule["expr"]))
        assert used, rule["alert"]
        assert used <= exported, f"{rule['alert']}: unknown metrics {sorted(used - exported)}"
