"""Every rendered manifest validates: built-in kinds against Kubernetes' schemas (offline,
kubernetes-validate, strict), CRDs against the CRD schemas shipped in infra/schemas/."""

from __future__ import annotations

import copy
import json

import jsonschema
import kubernetes_validate
import pytest
from infra_helpers import REPO, find

K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda-scaledobject.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheus-prometheusrule.json",
}
# CRDs whose schema is not shipped; checked field by field in test_unshipped_crds below.
UNSHIPPED_CRDS = {
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
}


def strict_crd_schema(name: str) -> dict:
    """The shipped schema, with unknown fields rejected: the API server would silently prune
    them (a typo like ``minReplicas`` would vanish), so CI fails on them instead."""

    def close(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node.setdefault("additionalProperties", False)
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    schema = json.loads((REPO / "infra" / "schemas" / name).read_text())
    close(schema)
    return schema


def validate_crd(obj: dict) -> None:
    name = CRD_SCHEMAS[(obj["apiVersion"], obj["kind"])]
    jsonschema.validate(obj, strict_crd_schema(name))


def test_builtin_kinds_validate_against_kubernetes_schemas(overlay):
    _, objects = overlay
    num_builtin = 0
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        if key in CRD_SCHEMAS or key in UNSHIPPED_CRDS:
            continue
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
        num_builtin += 1
    assert num_builtin >= 6


def test_crds_validate_against_shipped_schemas(overlay):
    _, objects = overlay
    kinds = set()
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        if key in CRD_SCHEMAS:
            validate_crd(obj)
            kinds.add(key)
    assert kinds == set(CRD_SCHEMAS)


def test_crd_validation_can_fail(overlay):
    _, objects = overlay
    scaled = copy.deepcopy(find(objects, "ScaledObject", "tidal-worker"))
    scaled["spec"]["minReplicas"] = 0  # the real field is minReplicaCount
    with pytest.raises(jsonschema.ValidationError):
        validate_crd(scaled)
    scaled = copy.deepcopy(find(objects, "ScaledObject", "tidal-worker"))
    scaled["spec"]["triggers"][0]["metadata"]["listLength"] = 4  # metadata values are strings
    with pytest.raises(jsonschema.ValidationError):
        validate_crd(scaled)
    rule = copy.deepcopy(find(objects, "PrometheusRule", "tidal"))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "ten minutes"
    with pytest.raises(jsonschema.ValidationError):
        validate_crd(rule)


def test_builtin_validation_can_fail(overlay):
    _, objects = overlay
    worker = copy.deepcopy(find(objects, "Deployment", "tidal-worker"))
    worker["spec"]["template"]["spec"]["terminationGracePeriod"] = 90
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(worker, K8S_VERSIONS[0], strict=True)


def test_unshipped_crds(overlay):
    _, objects = overlay
    auth = find(objects, "TriggerAuthentication", "tidal-redis")
    refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
    assert set(refs) == {"address", "password"}
    assert all(set(r) == {"parameter", "name", "key"} for r in refs.values())
    assert {r["name"] for r in refs.values()} == {"tidal-secrets"}

    monitor = find(objects, "PodMonitor", "tidal-worker")
    worker = find(objects, "Deployment", "tidal-worker")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        worker["spec"]["template"]["metadata"]["labels"].items()
    )
    containers = worker["spec"]["template"]["spec"]["containers"]
    port_names = {p["name"] for c in containers for p in c["ports"]}
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint["path"] == "/metrics"
    kinds = {(o["apiVersion"], o["kind"]) for o in objects}
    assert kinds & UNSHIPPED_CRDS == UNSHIPPED_CRDS
