"""Launch the real ``tidal worker`` whose chunks wait, once started, until a file exists.

The chunk task has recorded the chunk in flight (``tidal.inflight``) before it calls
``run_chunk``; this script wraps ``run_chunk`` so that it waits for RELEASE_FILE first. The
worker then holds its chunks for as long as a test needs, alive (heartbeat, consumer) or
killed with SIGKILL. Nothing in the product code knows about it.

    python -m tests.worker.held_chunk_worker RELEASE_FILE worker [tidal worker options]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import worker.tasks
from producer.cli import app

USAGE = "python -m tests.worker.held_chunk_worker RELEASE_FILE worker [OPTIONS]"


def hold_until(release: Path) -> None:
    real_run_chunk = worker.tasks.run_chunk

    def held_run_chunk(*args, **kwargs):
        while not release.exists():
            time.sleep(0.05)
        return real_run_chunk(*args, **kwargs)

    worker.tasks.run_chunk = held_run_chunk  # type: ignore[assignment]


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(f"usage: {USAGE}")
    hold_until(Path(argv[0]))
    app(argv[1:], prog_name="tidal")


if __name__ == "__main__":
    main(sys.argv[1:])
