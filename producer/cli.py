"""The ``tidal`` command line: run a batch locally, or submit and follow jobs on the queue.

Commands that need torch (``run``, ``worker``, ``beat``, ``quantize``) import it inside the
command, so the rest works in an app without torch. Add a command with ``@app.command()``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    name="tidal",
    help="Queue-driven batch LLM inference: tidal run locally, or submit to workers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

Priority = Annotated[str, typer.Option("--priority", "-p", help="high or normal lane")]


def _fail(message: str, code: int = 1) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@app.command()
def run(
    input_path: Annotated[Path, typer.Argument(help="OpenAI Batch input JSONL")],
    output: Annotated[Path, typer.Option("--output", "-o", help="output JSONL")],
    model: Annotated[str | None, typer.Option(help="HF directory or GGUF file")] = None,
    dtype: Annotated[str, typer.Option(help="auto, float32, float16, bfloat16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N")] = "auto",
    max_num_seqs: Annotated[int, typer.Option(help="sequences per step")] = 64,
    max_num_batched_tokens: Annotated[int, typer.Option(help="tokens per step")] = 2048,
    max_model_len: Annotated[int | None, typer.Option(help="context limit")] = None,
    kv_cache_memory_bytes: Annotated[int | None, typer.Option(help="KV cache size")] = None,
    enable_prefix_caching: Annotated[bool, typer.Option(help="reuse shared prefixes")] = True,
    seed: Annotated[int, typer.Option(help="engine seed")] = 0,
    progress: Annotated[bool, typer.Option(help="show the progress bar")] = True,
) -> None:
    """Run every line of INPUT_PATH through an in-process engine; write output lines in order."""
    from engine.config import EngineConfig
    from worker.local_run import RunError, run_file

    try:
        config = EngineConfig(
            model=model,
            dtype=dtype,
            device=device,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            enable_prefix_caching=enable_prefix_caching,
            seed=seed,
        )
        summary = run_file(input_path, output, config, show_progress=progress)
    except (RunError, ValueError) as exc:
        _fail(str(exc))
    typer.echo(summary.line())


def _client():
    from producer.client import Client

    return Client()


@app.command()
def submit(
    input_path: Annotated[str, typer.Argument(help="JSONL path or s3://bucket/key")],
    priority: Priority = "normal",
) -> None:
    """Upload INPUT_PATH and enqueue it as chunk tasks; prints the job id."""
    try:
        handle = _client().submit_batch(input_path, priority=priority)
    except (ValueError, OSError, RuntimeError) as exc:
        _fail(str(exc))
    typer.echo(handle.job_id)


@app.command()
def status(job_id: str) -> None:
    """Print a job's record (state, counts, timings) as JSON."""
    try:
        typer.echo(_client().status(job_id).model_dump_json(indent=2))
    except KeyError as exc:
        _fail(str(exc.args[0]))


@app.command()
def results(
    job_id: str,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="default: stdout")] = None,
) -> None:
    """Write a job's output lines, in input order."""
    try:
        lines = _client().results(job_id)
        out = open(output, "w", encoding="utf-8") if output else sys.stdout
        try:
            for line in lines:
                out.write(json.dumps(line, ensure_ascii=False) + "\n")
        finally:
            if output:
                out.close()
    except KeyError as exc:
        _fail(str(exc.args[0]))


@app.command()
def cancel(job_id: str) -> None:
    """Cancel a job: queued chunks are skipped, running requests aborted."""
    try:
        typer.echo(_client().cancel(job_id).state.value)
    except KeyError as exc:
        _fail(str(exc.args[0]))


@app.command()
def worker(
    queues: Annotated[str | None, typer.Option(help="comma-separated lanes (high,normal)")] = None,
    concurrency: Annotated[int | None, typer.Option(help="chunk threads")] = None,
    loglevel: Annotated[str, typer.Option(help="Celery log level")] = "INFO",
    hostname: Annotated[str | None, typer.Option(help="Celery node name")] = None,
) -> None:
    """Start a worker: one engine, Celery threads pool, both lanes by default."""
    # Celery reads this at import: SIGTERM becomes a cold shutdown with the soft timeout.
    os.environ.setdefault("REMAP_SIGTERM", "SIGQUIT")
    from worker.main import run_worker

    sys.exit(
        run_worker(queues=queues, concurrency=concurrency, loglevel=loglevel, hostname=hostname)
    )


@app.command()
def beat(
    loglevel: Annotated[str, typer.Option(help="Celery log level")] = "INFO",
    schedule_file: Annotated[
        str | None, typer.Option(help="beat's state file (default: ./celerybeat-schedule)")
    ] = None,
) -> None:
    """Start Celery beat: enqueues warm-up tasks on TIDAL_WARMUP_CRON or
    TIDAL_WARMUP_INTERVAL_S."""
    from worker.main import run_beat

    sys.exit(run_beat(loglevel=loglevel, schedule_file=schedule_file))


@app.command()
def quantize(
    model_dir: Annotated[str, typer.Argument(help="HF model directory or GGUF file")],
    out_dir: Annotated[Path, typer.Argument(help="where the GPTQ checkpoint is written")],
    method: Annotated[str, typer.Option(help="gptq or rtn (round to nearest)")] = "gptq",
    bits: Annotated[int, typer.Option(help="bits per weight (4)")] = 4,
    group_size: Annotated[int, typer.Option(help="weights per scale; -1 per channel")] = 128,
    act_order: Annotated[bool, typer.Option(help="GPTQ columns by decreasing activity")] = False,
    calibration: Annotated[
        Path | None, typer.Option(help="JSONL of {text|prompt|messages} lines")
    ] = None,
) -> None:
    """Quantize MODEL_DIR to 4 bits (GPTQ or RTN) and write a GPTQ-format checkpoint."""
    from engine.quant.quantize import quantize_checkpoint  # INT4 part: needs torch

    try:
        quantize_checkpoint(
            model_dir,
            out_dir,
            method=method,
            bits=bits,
            group_size=group_size,
            act_order=act_order,
            calibration=calibration,
        )
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))


if __name__ == "__main__":
    app()
