"""The Celery configuration both sides share: JSON only, the two lanes, Redis transport."""

from __future__ import annotations

from typing import Any

from kombu import Exchange, Queue

from producer.queues import LANES, queue_name
from producer.settings import ProducerSettings


def celery_config(settings: ProducerSettings, **transport: Any) -> dict[str, Any]:
    """Celery settings common to producer and worker (JSON, never pickle; lanes as queues)."""
    return {
        "broker_url": settings.broker_url,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "event_serializer": "json",
        # Each lane its own direct exchange and routing key: a Queue without them would be
        # bound to the default exchange under the default routing key, and on Redis every
        # message would then land in both lanes.
        "task_queues": [
            Queue(name, Exchange(name, type="direct"), routing_key=name)
            for name in (queue_name(lane, settings.queue_prefix) for lane in LANES)
        ],
        "task_default_queue": queue_name("normal", settings.queue_prefix),
        "task_ignore_result": True,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {
            "socket_timeout": 30,
            "socket_connect_timeout": 10,
            **transport,
        },
    }


def make_sender(settings: ProducerSettings) -> Any:
    """A Celery app that only sends (the producer side); never the current app."""
    from celery import Celery

    app = Celery("tidal-producer", set_as_current=False)
    app.conf.update(celery_config(settings))
    return app
