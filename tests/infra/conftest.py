"""Fixtures of the infra tests: the rendered manifests of each overlay."""

from __future__ import annotations

import pytest
from infra_helpers import OVERLAYS, REPO

from infra.render import render

# The worker tests' real components (redis-server, moto's S3 server, a tiny random Llama),
# for test_infra_probes.py.
from tests.worker.conftest import aws_env, redis_server, s3_endpoint, tiny_model_dir  # noqa: F401


@pytest.fixture(scope="session", params=OVERLAYS)
def overlay(request) -> tuple[str, list[dict]]:
    """(overlay name, rendered objects) for dev and prod."""
    return request.param, render(REPO / "infra" / "k8s" / "overlays" / request.param)
