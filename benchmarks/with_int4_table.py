"""Run a benchmark with the INT4 table (``choose_config``) of another revision, to time an
old table against the current one in the same device session.

    git show REV:kernels/int4_gemm_config.py > /tmp/old_config.py
    python3 benchmarks/with_int4_table.py [--no-pad] /tmp/old_config.py \\
        benchmarks/bench_int4_decode.py --batches 1 --prefill 16 --prefill-len 1024

The old module's configs are rebuilt as the current ``Int4GemmConfig`` (fields it lacks keep
their defaults); the kernels are the current ones, and the launcher pads x to whole tiles of
the swapped kernel by the old module's ``pad_rows``. ``--no-pad``: it does not pad x at all,
as before the fifteenth session.

A candidate table: the current one (``current`` for the file) with options set on every
config of the register mma kernel that takes them (``--mma``, fields of ``Int4GemmConfig``;
``num_stages`` counts the words' tiles ahead):

    python3 benchmarks/with_int4_table.py --mma s_ahead=1 current \
        benchmarks/bench_int4_gemm.py --rows 1,8,16 --no-model
    python3 benchmarks/with_int4_table.py --mma s_ahead=1,w_ring=1,num_stages=2 current \
        benchmarks/bench_int4_decode.py --batches 1,8,16
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_gemm import config_changes  # noqa: E402

import kernels.int4_gemm as int4_gemm  # noqa: E402


def mma_options(text: str) -> dict:
    """``--mma``'s ``key=value,...`` as ``Int4GemmConfig`` fields (``config_changes``)."""
    return config_changes(text, "--mma")


def with_mma_options(cfg, options: dict):
    """``cfg`` with ``options`` where it is a register mma config that takes them (``x_smem``
    for ``w_ring``, not ``scaled`` for ``s_ahead``), else ``cfg``."""
    if cfg.strategy != "mma":
        return cfg
    wanted = dict(options)
    if not cfg.x_smem:  # the words' tiles ahead are those of the ring
        wanted.pop("w_ring", None)
        wanted.pop("num_stages", None)
    if cfg.scaled:
        wanted.pop("s_ahead", None)
    return dataclasses.replace(cfg, **wanted)


def load_table(config_file: str):
    """The ``int4_gemm_config`` module at ``config_file`` (``current``: this checkout's)."""
    if config_file == "current":
        import kernels.int4_gemm_config as table

        return table
    spec = importlib.util.spec_from_file_location("old_int4_gemm_config", config_file)
    table = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = table  # dataclasses look their module up
    spec.loader.exec_module(table)
    return table


def as_current(cfg) -> int4_gemm.Int4GemmConfig:
    """Another table's config rebuilt as the current ``Int4GemmConfig`` (fields its module
    lacks keep their defaults), so configs of two tables compare field by field."""
    return int4_gemm.Int4GemmConfig(**dataclasses.asdict(cfg))


def padding_rule(table):
    """``table``'s ``pad_rows`` as the launcher calls it, ``(m, cfg, k)``: before the
    thirty-fifth session the rule took no ``k``; a table without one (or None) pads nothing."""
    rule = getattr(table, "pad_rows", None)
    if rule is None:
        return lambda m, cfg, k: 0
    if len(inspect.signature(rule).parameters) == 2:
        return lambda m, cfg, k: rule(m, cfg)
    return rule


def main() -> None:
    argv = sys.argv[1:]
    options, no_pad = {}, False
    while argv[:1] in (["--no-pad"], ["--mma"]):
        if argv[0] == "--no-pad":
            argv, no_pad = argv[1:], True
        else:
            options, argv = mma_options(argv[1]), argv[2:]
    if len(argv) < 2:
        raise SystemExit(__doc__)
    config_file, script, *args = argv
    table = load_table(config_file)
    chosen = table.choose_config
    # the launcher pads x by the same module's rule (tables before the fifteenth session had
    # none: no padding)
    int4_gemm.pad_rows = padding_rule(None if no_pad else table)

    def choose_config(*a, **kw):
        cfg = as_current(chosen(*a, **kw))
        return with_mma_options(cfg, options) if options else cfg

    int4_gemm.choose_config = choose_config
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
