"""Launch the real ``tidal worker`` with an engine whose step raises after N steps.

The fault is the test's own: this script wraps ``LLMEngine.step`` (the way a CUDA fault
would surface, as an exception out of a step) and then hands the command line to the real
``tidal`` CLI. Nothing in the product code knows about it.

    python -m tests.worker.faulty_engine_worker NUM_STEPS worker [tidal worker options]

NUM_STEPS counts every step of the process, the start-up warm-up generation included.
"""

from __future__ import annotations

import sys
import threading

from engine.llm_engine import LLMEngine
from producer.cli import app

USAGE = "python -m tests.worker.faulty_engine_worker NUM_STEPS worker [OPTIONS]"
FAULT_MESSAGE = "injected fault: CUDA error: an illegal memory access was encountered"


def fail_after(num_steps: int) -> None:
    """Make ``LLMEngine.step`` raise ``RuntimeError`` on every call after the first N."""
    real_step = LLMEngine.step
    lock = threading.Lock()
    num_done = [0]

    def faulty_step(self: LLMEngine):
        with lock:
            num_done[0] += 1
            is_faulty = num_done[0] > num_steps
        if is_faulty:
            raise RuntimeError(FAULT_MESSAGE)
        return real_step(self)

    LLMEngine.step = faulty_step  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        raise SystemExit(f"usage: {USAGE}")
    fail_after(int(argv[0]))
    app(argv[1:], prog_name="tidal")


if __name__ == "__main__":
    main(sys.argv[1:])
