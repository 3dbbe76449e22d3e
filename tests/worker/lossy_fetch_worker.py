"""Launch the real ``tidal worker`` that SIGKILLs itself while fetching its Nth chunk message.

kombu's Redis transport pops a message with BRPOP and only then records it in the
``unacked`` hash (``QoS.append``). This script wraps ``QoS.append`` so that, for the Nth
``tidal.run_chunk`` message, the process kills itself with SIGKILL before that record is
written: the moment a ``kill -9`` (OOM, node loss) can land in by chance, made certain.
Nothing in the product code knows about it.

    python -m tests.worker.lossy_fetch_worker N worker [tidal worker options]
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from kombu.transport import redis as kombu_redis

from producer.cli import app
from producer.jobs import RUN_CHUNK_TASK

USAGE = "python -m tests.worker.lossy_fetch_worker N worker [OPTIONS]"


def die_fetching(nth: int) -> None:
    real_append = kombu_redis.QoS.append
    lock = threading.Lock()
    num_seen = [0]

    def append(self, message, delivery_tag):
        if (message.headers or {}).get("task") == RUN_CHUNK_TASK:
            with lock:
                num_seen[0] += 1
                if num_seen[0] == nth:
                    os.kill(os.getpid(), signal.SIGKILL)
        return real_append(self, message, delivery_tag)

    kombu_redis.QoS.append = append  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        raise SystemExit(f"usage: {USAGE}")
    die_fetching(int(argv[0]))
    app(argv[1:], prog_name="tidal")


if __name__ == "__main__":
    main(sys.argv[1:])
