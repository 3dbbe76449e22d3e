"""Fixtures of the infra tests: the rendered manifests of each overlay."""

from __future__ import annotations

import pytest
from infra_helpers import OVERLAYS, REPO

from infra.render import render


@pytest.fixture(scope="session", params=OVERLAYS)
def overlay(request) -> tuple[str, list[dict]]:
    """(overlay name, rendered objects) for dev and prod."""
    return request.param, render(REPO / "infra" / "k8s" / "overlays" / request.param)
