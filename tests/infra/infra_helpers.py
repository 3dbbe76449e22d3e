"""Helpers shared by the infra tests."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OVERLAYS = ("dev", "prod")


def find(objects: list[dict], kind: str, name: str) -> dict:
    """The one object of ``kind`` named ``name``."""
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]
