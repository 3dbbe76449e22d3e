"""The worker's Celery app: JSON only, late acks, prefetch 1, threads pool, soft shutdown.

The engine is loaded once per process in ``worker_init`` (before any message is taken);
the lane controller attaches when the consumer is ready; a shutdown starts the soft-shutdown
clock after which running chunks are handed back.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import Any

from celery import Celery, signals
from celery.schedules import crontab, schedule
from celery.worker.consumer import Consumer

from producer.broker import celery_config
from producer.jobs import WARMUP_TASK
from producer.queues import queue_name
from worker.dead_letters import dead_letter
from worker.recovery import LostChunkSweeper
from worker.runtime import WorkerRuntime
from worker.settings import WorkerSettings
from worker.tasks import register_tasks

logger = logging.getLogger(__name__)

KOMBU_UNACKED_MUTEX_EXPIRE_S = 300  # kombu's default for the Redis transport


def create_app(settings: WorkerSettings) -> tuple[Celery, WorkerRuntime]:
    """A configured Celery app and the (not yet started) runtime its tasks use."""
    rt = WorkerRuntime(settings)
    app = Celery("tidal", set_as_current=True)
    transport = {
        "visibility_timeout": settings.visibility_timeout_s,
        "unacked_restore_interval": settings.unacked_restore_interval_s,
        "unacked_restore_throttle": settings.unacked_restore_throttle,
        # The restore scan holds a Redis lock for milliseconds, but one cut short by a Redis
        # restart cannot release it, and the lock (saved with the data) then blocks every
        # restore until it expires: kombu's 300 s, longer than a short visibility timeout.
        # A restore racing another is safe (each message moves in a WATCH transaction).
        "unacked_mutex_expire": min(KOMBU_UNACKED_MUTEX_EXPIRE_S, settings.visibility_timeout_s),
    }
    app.conf.update(celery_config(settings, **transport))
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        worker_pool="threads",
        worker_concurrency=settings.concurrency,
        worker_soft_shutdown_timeout=settings.soft_shutdown_timeout_s,
        worker_enable_soft_shutdown_on_idle=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        broker_connection_retry=True,
        broker_connection_max_retries=None,
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
        worker_consumer=_dead_lettering_consumer(rt),
        beat_schedule=beat_schedule(settings),
    )
    register_tasks(app, rt)
    _connect_signals(app, rt)
    app.Worker = _soft_shutdown_aware_worker(app.Worker, rt)  # type: ignore[method-assign]
    return app, rt


def _soft_shutdown_aware_worker(base: type, rt: WorkerRuntime) -> type:
    """Start the hand-back clock when the soft shutdown starts (Celery's shutting-down signal
    only fires after it, once the pool has been stopped, which waits for running chunks)."""

    class SoftShutdownAwareWorker(base):  # type: ignore[misc, valid-type]
        def wait_for_soft_shutdown(self) -> None:
            rt.metrics.worker_ready.set(0)
            rt.lanes.stop()
            # Leave a second to hand chunks back before the cold shutdown restores the rest.
            rt.abandon_after(max(0.0, self.app.conf.worker_soft_shutdown_timeout - 1.0))
            super().wait_for_soft_shutdown()

    return SoftShutdownAwareWorker


def beat_schedule(settings: WorkerSettings) -> dict[str, Any]:
    """Warm-up on ``warmup_cron`` or every ``warmup_interval_s`` (on the high lane, dropped
    if older than the expiry); empty when neither is set."""
    if settings.warmup_interval_s is not None:
        every: Any = schedule(timedelta(seconds=settings.warmup_interval_s))
    elif settings.warmup_cron:
        every = _crontab(settings.warmup_cron)
    else:
        return {}
    return {
        "tidal-warmup": {
            "task": WARMUP_TASK,
            "schedule": every,
            "options": {
                "queue": queue_name("high", settings.queue_prefix),
                "expires": settings.warmup_expires_s,
            },
        }
    }


def _crontab(cron: str) -> crontab:
    fields = cron.split()
    if len(fields) != 5:
        raise ValueError(
            f"warmup_cron must have 5 fields 'minute hour day month weekday', got {cron!r}"
        )
    minute, hour, day_of_month, month_of_year, day_of_week = fields
    return crontab(minute, hour, day_of_week, day_of_month, month_of_year)


def _dead_lettering_consumer(rt: WorkerRuntime) -> type[Consumer]:
    def record(reason: str, message: Any, exc: Any) -> None:
        dead_letter(rt.redis, rt.settings.queue_prefix, reason, repr(exc), message.body,
                    storage=None)  # fmt: skip

    class DeadLetteringConsumer(Consumer):
        """Celery drops poison messages (logged, acked or rejected); record them first."""

        def on_decode_error(self, message: Any, exc: Exception) -> None:
            record("undecodable", message, exc)
            super().on_decode_error(message, exc)

        def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
            record("undecodable", message, exc)  # pickle refused, broken JSON, bad envelope
            super().on_invalid_task(body, message, exc)

        def on_unknown_message(self, body: Any, message: Any) -> None:
            record("unknown_message", message, "not a task message")
            super().on_unknown_message(body, message)

        def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
            record("unknown_task", message, exc)
            super().on_unknown_task(body, message, exc)

        def on_connection_error_after_connected(self, exc: Exception) -> None:
            close_polling_channels(self.connection)
            super().on_connection_error_after_connected(exc)

    return DeadLetteringConsumer


def close_polling_channels(connection: Any) -> None:
    """Close the broken connection's channels that wait on a BRPOP, while it can still be done.

    kombu's Redis channel reads its outstanding BRPOP reply first thing in ``close()``; on a
    dead connection that read raises, and the channel is left open. Celery's reconnect then
    collects the connection (detaching its transport) and closes it again: that close reaches
    the channel's restore of its unacked messages, which needs the detached transport, and
    raises ``AttributeError``. Celery calls that an unrecoverable error and the worker stops
    consuming for good after a broker restart (it happens when the Redis restart is noticed
    on the pub/sub socket before the BRPOP socket). The failed close has given up the BRPOP,
    so a second close here, with the transport attached, completes.
    """
    transport = getattr(connection, "_transport", None) if connection is not None else None
    if transport is None:
        return
    errors = connection.connection_errors + connection.channel_errors
    for channel in list(getattr(transport, "channels", ())):
        if not getattr(channel, "_in_poll", None):
            continue
        try:
            channel.close()
        except errors:
            # The close stopped at the BRPOP read; the next one gets through (its restore
            # of unacked messages may fail too while Redis is away: they stay in Redis, and
            # the visibility timeout brings them back).
            with contextlib.suppress(*errors):
                channel.close()


def _connect_signals(app: Celery, rt: WorkerRuntime) -> None:
    # kombu loses a message popped by a worker killed before it recorded it as unacked; after
    # a worker death the sweeper finds such chunks and sends them again (worker/recovery.py).
    sweeper = LostChunkSweeper(
        rt,
        app.send_task,
        rt.settings.lost_chunk_sweep_interval_s,
        rt.settings.lost_chunk_full_check_interval_s,
    )
    # In-flight entries of workers killed outright expire with their lease; their chunks go
    # back to the queues at once (worker/inflight.py).
    rt.inflight.restore = _restorer(app)

    def on_init(sender: Any = None, **_: Any) -> None:
        if not _belongs_to(sender, app):
            return
        # Lease and registration before anything is consumed: a worker killed while fetching
        # its very first message is then a death the lost-chunk sweep sees.
        rt.inflight.heartbeat()
        rt.inflight.start()
        try:
            rt.start()
        except Exception as exc:  # no engine, no worker: exit so the pod restarts visibly
            logger.critical("cannot start the engine: %s: %s", type(exc).__name__, exc)
            rt.inflight.stop()
            raise SystemExit(1) from None

    def on_ready(sender: Any = None, **_: Any) -> None:
        if not _belongs_to(sender, app):
            return
        queues = set((app.amqp.queues.consume_from or {}).keys())
        normal = queue_name("normal", rt.settings.queue_prefix)
        rt.lanes.attach(app, sender, consumes_normal=normal in queues)
        sweeper.start()  # the in-flight leases run since worker_init
        rt.metrics.worker_ready.set(1)

    def on_shutting_down(**_: Any) -> None:  # warm shutdown (SIGTERM not remapped) too
        rt.metrics.worker_ready.set(0)
        rt.lanes.stop()
        sweeper.stop()

    def on_shutdown(**_: Any) -> None:  # the pool has stopped: stop the engine (and its ranks)
        rt.inflight.stop()  # no chunk runs any more; the lease goes
        if rt.loop is not None:
            rt.loop.shutdown()

    signals.worker_init.connect(on_init, weak=False)
    signals.worker_shutdown.connect(on_shutdown, weak=False)
    signals.worker_ready.connect(on_ready, weak=False)
    signals.worker_shutting_down.connect(on_shutting_down, weak=False)


def _restorer(app: Celery) -> Any:
    """Hand messages (delivery tags in kombu's ``unacked``) back to the front of their queues,
    with kombu's own restore, as the visibility timeout would (a WATCH transaction: a restore
    racing another moves each message once)."""

    def restore(tags: list[str]) -> None:
        with app.connection_for_write() as conn:
            qos = conn.default_channel.qos
            for tag in tags:
                qos.restore_by_tag(tag, leftmost=False)

    return restore


def _belongs_to(sender: Any, app: Celery) -> bool:
    """Signals are global; act only on this app's worker (tests may build several apps)."""
    return getattr(sender, "app", None) is app
