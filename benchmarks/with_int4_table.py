"""Run a benchmark with the INT4 table (``choose_config``) of another revision, to time an
old table against the current one in the same device session.

    git show REV:kernels/int4_gemm_config.py > /tmp/old_config.py
    python3 benchmarks/with_int4_table.py [--no-pad] /tmp/old_config.py \\
        benchmarks/bench_int4_decode.py --batches 1 --prefill 16 --prefill-len 1024

The old module's configs are rebuilt as the current ``Int4GemmConfig`` (fields it lacks keep
their defaults); the kernels are the current ones. ``--no-pad``: the launcher does not pad x
to whole tiles of the swapped kernel (``pad_rows``), as before the fifteenth session.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.int4_gemm as int4_gemm  # noqa: E402


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["--no-pad"]:
        argv = argv[1:]
        int4_gemm.pad_rows = lambda m, cfg: 0
    if len(argv) < 2:
        raise SystemExit(__doc__)
    config_file, script, *args = argv
    spec = importlib.util.spec_from_file_location("old_int4_gemm_config", config_file)
    old = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = old  # dataclasses look their module up
    spec.loader.exec_module(old)

    def choose_config(*a, **kw):
        return int4_gemm.Int4GemmConfig(**dataclasses.asdict(old.choose_config(*a, **kw)))

    int4_gemm.choose_config = choose_config
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
