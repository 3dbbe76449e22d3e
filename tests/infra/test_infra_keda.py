"""The KEDA ScaledObject reads exactly the Redis keys producer.queues names, and its formula
does what infra/keda.py promises (sum, separate activation for the high lane and in-flight)."""

from __future__ import annotations

import math
import re

import pytest
from infra_helpers import REPO, find

from infra import keda
from producer import queues


def test_committed_scaledobject_is_fresh():
    committed = (REPO / "infra" / "k8s" / "base" / "scaledobject.yaml").read_text()
    assert committed == keda.render_text(), "run `python -m infra.keda` and commit the result"


def test_list_names_match_producer_queues(overlay):
    _, objects = overlay
    scaled = find(objects, "ScaledObject", "tidal-worker")
    listed = [t["metadata"]["listName"] for t in scaled["spec"]["triggers"]]
    expected = [
        key for lane in queues.LANES for key in queues.redis_list_keys(queues.queue_name(lane))
    ]
    # written independently of producer.queues: kombu's priority sub-list names
    assert expected == [
        "tidal.high", "tidal.high\x06\x163", "tidal.high\x06\x166", "tidal.high\x06\x169",
        "tidal.normal", "tidal.normal\x06\x163", "tidal.normal\x06\x166", "tidal.normal\x06\x169",
    ]  # fmt: skip
    assert listed == expected + [queues.inflight_key(queues.DEFAULT_QUEUE_PREFIX)]
    assert listed[-1] == "tidal.inflight"
    worker = find(objects, "Deployment", "tidal-worker")
    assert scaled["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    config = find(objects, "ConfigMap", "tidal-config")["data"]
    assert config["TIDAL_QUEUE_PREFIX"] == queues.DEFAULT_QUEUE_PREFIX


def test_scaling_shape(overlay):
    _, objects = overlay
    spec = find(objects, "ScaledObject", "tidal-worker")["spec"]
    assert spec["minReplicaCount"] == 0
    assert spec["maxReplicaCount"] >= 1
    assert spec["cooldownPeriod"] > 0
    config = find(objects, "ConfigMap", "tidal-config")["data"]
    assert spec["advanced"]["scalingModifiers"]["target"] == config["TIDAL_CONCURRENCY"]
    names = [t["name"] for t in spec["triggers"]]
    assert set(re.findall(r"[a-z_]+\d*", spec["advanced"]["scalingModifiers"]["formula"])) == set(
        names
    )


def evaluate(formula: str, values: dict[str, int]) -> int:
    """Evaluate the formula's expr-lang form, parsed independently of infra/keda.py."""
    match = re.fullmatch(r"\((.+) > 0 && (.+) <= (\d+)\) \? (\d+) : (.+)", formula)
    assert match, formula

    def total(expr: str) -> int:
        return sum(values[name.strip()] for name in expr.split("+"))

    urgent, everything, limit, bump, otherwise = match.groups()
    if total(urgent) > 0 and total(everything) <= int(limit):
        return int(bump)
    return total(otherwise)


@pytest.mark.parametrize(
    ("queued", "active", "replicas"),
    [
        ({}, False, 0),
        ({"normal_p0": 1}, False, 0),  # a trickle on the normal lane waits
        ({"normal_p0": 2}, False, 0),
        ({"normal_p0": 3}, True, 1),  # ... until the backlog passes the activation
        ({"high_p0": 1}, True, 1),  # one urgent message wakes the fleet from zero
        ({"high_p9": 1}, True, 1),  # on any priority sub-list
        ({"inflight": 1}, True, 1),  # never scale to zero under a running chunk
        ({"normal_p6": 20, "high_p3": 5, "inflight": 7}, True, 8),  # sum of everything / 4
        ({"normal_p0": 400}, True, 100),  # capped later by maxReplicaCount
    ],
)
def test_formula_semantics(queued, active, replicas):
    settings = keda.ScalingSettings(normal_activation=2)
    values = dict.fromkeys(keda.trigger_names(), 0) | queued
    composite = evaluate(keda.formula(settings), values)
    assert (composite > settings.normal_activation) == active
    desired = math.ceil(composite / settings.target_per_replica) if active else 0
    assert desired == replicas


def test_default_wakes_on_any_message():
    settings = keda.ScalingSettings()
    zero = dict.fromkeys(keda.trigger_names(), 0)
    for name in zero:
        composite = evaluate(keda.formula(settings), zero | {name: 1})
        assert composite > settings.normal_activation and composite == 1


def test_settings_reject_bad_values():
    with pytest.raises(ValueError, match="normal_activation"):
        keda.ScalingSettings(normal_activation=4, target_per_replica=4)
    with pytest.raises(ValueError, match="target_per_replica"):
        keda.ScalingSettings(target_per_replica=0)
