"""A background thread that runs the engine's step loop for other threads (futures API)."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future

from engine.llm_engine import EngineStats, LLMEngine, PreparedRequest
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine's step raised; the process should exit and let its work be redelivered."""


class EngineLoop:
    """Owns an ``LLMEngine`` and steps it on one background thread.

    Any thread may ``submit`` (returns a ``Future`` resolved with the finished
    ``RequestOutput``) or ``abort``. The thread sleeps on a condition while there is no work.
    If a step raises, the loop is dead: pending futures fail with ``EngineDeadError`` and so do
    later submits.
    """

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._cond = threading.Condition()
        self._adds: list[tuple[PreparedRequest, Future]] = []
        self._aborts: list[str] = []
        self._futures: dict[str, Future] = {}
        self._stopping = False
        self.error: BaseException | None = None
        self._stats = engine.stats()
        self._thread = threading.Thread(target=self._run, name="tidal-engine", daemon=True)
        self._thread.start()

    @property
    def is_dead(self) -> bool:
        return self.error is not None

    @property
    def num_unfinished(self) -> int:
        """Requests submitted and not yet finished (queued here or inside the engine)."""
        with self._cond:
            return len(self._futures)

    def submit(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        add_special_tokens: bool = True,
    ) -> Future[RequestOutput]:
        """Queue a request; ``ValueError`` at once if it can never run."""
        prep = self.engine.prepare_request(request_id, prompt, params, priority, add_special_tokens)
        fut: Future[RequestOutput] = Future()
        with self._cond:
            if self.error is not None:
                raise EngineDeadError(f"the engine died: {self.error!r}")
            if self._stopping:
                raise RuntimeError("the engine loop is shut down")
            if request_id in self._futures:
                raise ValueError(f"request id {request_id!r} is already in flight")
            self._futures[request_id] = fut
            self._adds.append((prep, fut))
            self._cond.notify()
        return fut

    def abort(self, request_id: str) -> None:
        """Abort a request; its future resolves with what it produced (finish_reason 'abort')."""
        with self._cond:
            self._aborts.append(request_id)
            self._cond.notify()

    def stats(self) -> EngineStats:
        """The engine's counters as of the last step (no locking of the engine)."""
        return self._stats

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the loop thread, then the engine's tensor-parallel ranks (if any)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout_s)
        self.engine.shutdown()

    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                with self._cond:
                    while not (self._adds or self._aborts or self._stopping) and (
                        not engine.has_unfinished_requests()
                    ):
                        self._cond.wait()
                    if self._stopping:
                        break
                    adds, self._adds = self._adds, []
                    aborts, self._aborts = self._aborts, []
                for prep, _fut in adds:
                    try:
                        engine.add_prepared(prep)
                    except ValueError as exc:
                        self._resolve(prep.request_id, exc=exc)
                for request_id in aborts:
                    out = engine.abort(request_id)
                    if out is not None:
                        self._resolve(request_id, out=out)
                for out in engine.step():
                    self._resolve(out.request_id, out=out)
                self._stats = engine.stats()
        except BaseException as exc:  # noqa: BLE001 - any failure kills the loop, loudly
            logger.exception("engine step failed; the engine loop is dead")
            with self._cond:
                self.error = exc
                pending = list(self._futures.items())
                self._futures.clear()
            for _, fut in pending:
                fut.set_exception(EngineDeadError(f"the engine died: {exc!r}"))
            return
        with self._cond:
            pending = list(self._futures.items())
            self._futures.clear()
        for _, fut in pending:
            fut.cancel()

    def _resolve(
        self, request_id: str, out: RequestOutput | None = None, exc: BaseException | None = None
    ) -> None:
        with self._cond:
            fut = self._futures.pop(request_id, None)
        if fut is None:
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(out)
