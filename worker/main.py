"""Entry points of ``tidal worker`` and ``tidal beat`` (settings from ``TIDAL_*``)."""

from __future__ import annotations

import logging

from producer.queues import LANES, queue_name
from worker.settings import WorkerSettings


def _queues(settings: WorkerSettings, lanes: str | None) -> list[str]:
    names = [lane.strip() for lane in (lanes or ",".join(LANES)).split(",") if lane.strip()]
    return [queue_name(lane, settings.queue_prefix) for lane in names]


def run_worker(
    queues: str | None = None,
    concurrency: int | None = None,
    loglevel: str = "INFO",
    hostname: str | None = None,
) -> int:
    """Run a Celery worker (threads pool, one engine) until it shuts down; its exit code."""
    from worker.celery_app import create_app

    logging.basicConfig(
        level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = WorkerSettings(concurrency=concurrency) if concurrency else WorkerSettings()
    app, _ = create_app(settings)
    argv = [
        "worker",
        "--pool=threads",
        f"--concurrency={settings.concurrency}",
        f"--queues={','.join(_queues(settings, queues))}",
        f"--loglevel={loglevel}",
        "--without-gossip",
        "--without-mingle",
    ]
    if hostname:
        argv.append(f"--hostname={hostname}")
    try:
        app.worker_main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def run_beat(loglevel: str = "INFO", schedule_file: str | None = None) -> int:
    """Run Celery beat with the warm-up schedule (``TIDAL_WARMUP_CRON`` or
    ``TIDAL_WARMUP_INTERVAL_S``); beat keeps its state in ``schedule_file``."""
    from worker.celery_app import create_app

    settings = WorkerSettings()
    if not settings.warmup_cron and settings.warmup_interval_s is None:
        raise SystemExit(
            "set TIDAL_WARMUP_CRON (e.g. '50 7 * * 1-5') or TIDAL_WARMUP_INTERVAL_S "
            "to schedule warm-ups"
        )
    app, _ = create_app(settings)
    argv = ["beat", f"--loglevel={loglevel}"]
    if schedule_file:
        argv.append(f"--schedule={schedule_file}")
    try:
        app.start(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
