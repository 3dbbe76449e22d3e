"""Lane flow control: the high lane is always consumed; the normal lane pauses when full.

"Full" means the normal chunks running here reached their limit (one thread is kept for the
high lane) or the engine's backlog of unfinished requests reached its limit. Pausing uses
Celery's own ``cancel_consumer`` / ``add_consumer`` control commands addressed to this worker,
so the change runs on the consumer's thread. A normal chunk that slips in before the pause
takes effect is handed back to the front of its queue (``should_hand_back``). Only the
watcher thread sends commands (a command may block while the broker is away), and it compares
the wish with what the consumer really does, so a resume lost in a reconnect is sent again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class LaneController:
    """Counts chunks per lane and pauses / resumes consuming the normal queue."""

    def __init__(
        self,
        normal_queue: str,
        normal_limit: int,
        backlog_limit: int,
        engine_backlog: Callable[[], int],
        interval_s: float = 0.2,
    ) -> None:
        self.normal_queue = normal_queue
        self.normal_limit = normal_limit
        self.backlog_limit = backlog_limit
        self.engine_backlog = engine_backlog
        self.interval_s = interval_s
        self.in_flight: dict[str, str] = {}  # task id -> lane
        self.is_normal_paused = False
        self._lock = threading.Lock()
        self._control: Callable[[str, str], None] | None = None
        self._consumer: Any = None
        self._last_command_at = 0.0
        self.resend_s = 1.0  # a command not yet applied is sent again after this
        self._consumes_normal = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def attach(self, app: Any, consumer: Any, consumes_normal: bool) -> None:
        """Start steering this worker's consumer (called once it is ready)."""
        hostname = consumer.hostname

        def control(command: str, queue: str) -> None:
            getattr(app.control, command)(queue, destination=[hostname], reply=False)

        self._control = control
        self._consumer = consumer
        self._consumes_normal = consumes_normal
        self._thread = threading.Thread(target=self._watch, name="tidal-lanes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def num_normal(self) -> int:
        with self._lock:
            return sum(1 for lane in self.in_flight.values() if lane == "normal")

    def is_full(self) -> bool:
        return self.num_normal() >= self.normal_limit or self.engine_backlog() >= self.backlog_limit

    def should_hand_back(self, lane: str) -> bool:
        """True for a normal chunk arriving while normal chunks are already at their limit."""
        return lane == "normal" and self.num_normal() >= self.normal_limit

    def started(self, task_id: str, lane: str) -> None:
        with self._lock:
            self.in_flight[task_id] = lane
        self._wake.set()  # react now, not at the next tick: prefetch is fast

    def finished(self, task_id: str) -> None:
        with self._lock:
            self.in_flight.pop(task_id, None)
        self._wake.set()

    def is_consuming_normal(self) -> bool:
        """What the consumer really does (it forgets a resume across a broker reconnect)."""
        task_consumer = getattr(self._consumer, "task_consumer", None)
        return task_consumer is not None and task_consumer.consuming_from(self.normal_queue)

    def check(self) -> None:
        """Pause or resume the normal lane to match the current load."""
        if self._control is None or not self._consumes_normal:
            return
        is_full = self.is_full()
        is_paused = not self.is_consuming_normal()
        now = time.monotonic()
        with self._lock:
            self.is_normal_paused = is_paused
            if is_full == is_paused or now - self._last_command_at < self.resend_s:
                if is_full == is_paused:
                    self._last_command_at = 0.0
                return
            self._last_command_at = now
        command = "cancel_consumer" if is_full else "add_consumer"
        logger.info("%s %s (normal chunks %d, engine backlog %d)", command, self.normal_queue,
                    self.num_normal(), self.engine_backlog())  # fmt: skip
        try:
            self._control(command, self.normal_queue)
        except Exception as exc:  # the broker may be restarting; the watcher tries again
            logger.warning("lane control %s failed: %s", command, exc)

    def _watch(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if not self._stop.is_set():
                self.check()
