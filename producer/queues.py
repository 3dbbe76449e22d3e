"""Queue names: the one source of truth for producer, worker and the KEDA manifests."""

from __future__ import annotations

DEFAULT_QUEUE_PREFIX = "tidal"
LANES = ("high", "normal")

# kombu's Redis transport emulates message priorities with one list per priority step;
# the base list holds priority 0 and the others are named f"{queue}\x06\x16{step}".
KOMBU_PRIORITY_SEP = "\x06\x16"
KOMBU_PRIORITY_STEPS = (0, 3, 6, 9)


def queue_name(lane: str, prefix: str = DEFAULT_QUEUE_PREFIX) -> str:
    """The Celery queue of a lane: ``tidal.high`` or ``tidal.normal`` by default."""
    if lane not in LANES:
        raise ValueError(f"unknown lane {lane!r}; allowed: {', '.join(LANES)}")
    return f"{prefix}.{lane}"


def redis_list_keys(queue: str) -> list[str]:
    """Every Redis list that holds messages of ``queue`` (all priority sub-lists)."""
    return [queue if step == 0 else f"{queue}{KOMBU_PRIORITY_SEP}{step}" for step in KOMBU_PRIORITY_STEPS]
