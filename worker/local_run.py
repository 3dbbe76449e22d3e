"""``tidal run``: a whole batch file through one in-process engine, no broker, no S3.

Same code path as the Celery chunk task (``worker.batch.run_lines``) with a local file in
place of S3 objects. Bad lines become error lines and the run goes on; only an unreadable
input file or a model that cannot load ends the run (``RunError``).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from engine.outputs import RequestOutput


class RunError(RuntimeError):
    """The run could not start: unreadable input, unwritable output, or an unloadable model."""


@dataclass
class RunSummary:
    """What a run did, for the one-line summary."""

    num_requests: int
    num_succeeded: int
    num_failed: int
    num_prompt_tokens: int
    num_generated_tokens: int
    elapsed_s: float
    output_path: Path

    def line(self) -> str:
        rate = self.num_generated_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return (
            f"{self.num_requests} requests: {self.num_succeeded} ok, {self.num_failed} failed; "
            f"{self.num_prompt_tokens} prompt + {self.num_generated_tokens} generated tokens "
            f"in {self.elapsed_s:.1f} s ({rate:.1f} tok/s) -> {self.output_path}"
        )


def read_input_lines(path: Path) -> list[str]:
    """The non-blank lines of a JSONL file. Raises ``RunError`` when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return [line.rstrip("\n") for line in f if line.strip()]
    except OSError as exc:
        raise RunError(f"cannot read input file {path}: {exc.strerror or exc}") from None


def load_engine(config: Any):
    """An ``LLMEngine`` for ``config``; ``RunError`` with the reason when it cannot load."""
    from engine.llm_engine import LLMEngine

    try:
        return LLMEngine(config)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        name = config.model or "the default model"
        raise RunError(f"cannot load model {name}: {type(exc).__name__}: {exc}") from None


def run_file(
    input_path: Path, output_path: Path, config: Any, show_progress: bool = True
) -> RunSummary:
    """Run every line of ``input_path``; write output lines in input order to ``output_path``."""
    from engine.engine_loop import EngineLoop
    from worker.batch import num_generated_tokens, run_lines

    raw_lines = read_input_lines(input_path)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    if not os.access(output_path.parent, os.W_OK):
        raise RunError(f"cannot write output file {output_path}: directory is not writable")
    engine = load_engine(config)
    loop = EngineLoop(engine)
    counts = {"ok": 0, "failed": 0, "prompt": 0, "generated": 0}
    start = time.monotonic()
    bar = tqdm(total=len(raw_lines), unit="req", disable=not show_progress, dynamic_ncols=True)

    def on_done(line: dict[str, Any], output: RequestOutput | None) -> None:
        if output is None:
            counts["failed"] += 1
        else:
            counts["ok"] += 1
            counts["prompt"] += len(output.prompt_token_ids)
            counts["generated"] += num_generated_tokens(output)
        elapsed_s = max(time.monotonic() - start, 1e-9)
        bar.set_postfix_str(f"{counts['generated'] / elapsed_s:.1f} tok/s", refresh=False)
        bar.update(1)

    try:
        lines = run_lines(
            raw_lines,
            first_index=0,
            loop=loop,
            tokenizer=engine.tokenizer,
            max_model_len=engine.max_model_len,
            model_name=_model_name(config),
            run_id=uuid.uuid4().hex[:12],
            on_done=on_done,
        )
    finally:
        bar.close()
        loop.shutdown()
    tmp_path = output_path.with_name(output_path.name + ".tmp")
    with open(tmp_path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    os.replace(tmp_path, output_path)
    return RunSummary(
        num_requests=len(lines),
        num_succeeded=counts["ok"],
        num_failed=counts["failed"],
        num_prompt_tokens=counts["prompt"],
        num_generated_tokens=counts["generated"],
        elapsed_s=time.monotonic() - start,
        output_path=output_path,
    )


def _model_name(config: Any) -> str:
    if config.model is None:
        from engine.default_model import DEFAULT_MODEL_NAME

        return DEFAULT_MODEL_NAME
    return Path(config.model).name
