"""The Gluon INT4 kernel (``kernels/int4_wgmma.py``) timed with a stage left out, to see which
stage bounds it: variants of the kernel's source with the decode, the wgmma, the weight's TMA
or the CTA barrier removed (their outputs are wrong; only the time is read). Same harness as
bench_int4_gemm.py; one H200.

    python3 benchmarks/probe_int4_wgmma.py [--shapes 4096x4096,4096x28672] [--rows 1024]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_int4_gemm import Peers, graph_time_us  # noqa: E402

DECODE = "        w = _decode_k_order(q, s, o, dtype == gl.bfloat16)"
STORE = "        w_buf.store(w)\n"
LOAD_WORDS = "        q = q_bufs.index(slot).load(q_layout)\n"
MMA = "        acc = warpgroup_mma(x_bufs.index(slot), w_buf.permute((1, 0)), acc, is_async=True)\n"
BARRIER = "        gl.thread_barrier()"
WORDS_TMA = """    tma.async_copy_global_to_shared(
        qw_desc, [off_n, kt * (BLOCK_K // 8)], bar, q_bufs.index(slot), pred
    )
"""
# (block_m, block_n, block_k, stages, warps)
TILES = [(128, 256, 64, 5, 8), (256, 128, 64, 4, 8), (128, 128, 64, 6, 8)]


def _drop(src: str, *pieces: str) -> str:
    """``src`` without each piece (a whole line or block, or a line starting with it)."""
    for piece in pieces:
        if piece.endswith("\n"):
            assert piece in src, piece
            src = src.replace(piece, "")
        else:
            lines = src.splitlines(keepends=True)
            kept = [ln for ln in lines if not ln.startswith(piece)]
            assert len(kept) == len(lines) - 1, piece
            src = "".join(kept)
    return src


def variants(src: str) -> dict[str, str]:
    no_decode = _drop(src, DECODE, STORE, LOAD_WORDS)
    assert MMA in src
    no_mma = src.replace(MMA, "        acc = warpgroup_mma_init(acc)\n")
    neither = _drop(no_mma, DECODE, STORE, LOAD_WORDS)
    no_words = "x_desc.block_type.nbytes + qw_desc.block_type.nbytes"
    assert no_words in src
    return {
        "full": src,
        "no decode": no_decode,
        "no wgmma": no_mma,
        "neither": neither,
        "neither, no weight TMA": _drop(neither, WORDS_TMA).replace(
            no_words, "x_desc.block_type.nbytes"
        ),
        "full, no CTA barrier": _drop(src, BARRIER),
    }


def load(name: str, text: str, folder: Path):
    """Import ``text`` as a module (Gluon reads a kernel's source from its file)."""
    path = folder / f"int4_wgmma_{name.replace(' ', '_').replace(',', '')}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4096x4096,4096x28672", help="K x N list")
    parser.add_argument("--rows", default="1024", help="M values")
    args = parser.parse_args()
    src = (ROOT / "kernels" / "int4_wgmma.py").read_text()
    with tempfile.TemporaryDirectory() as folder:
        mods = {name: load(name, text, Path(folder)) for name, text in variants(src).items()}
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
        print("| K x N | M | tiles | bf16 (us) | " + " | ".join(mods) + " |")
        print("|---|---|---|---|" + "---|" * len(mods))
        for shape in args.shapes.split(","):
            k, n = (int(v) for v in shape.split("x"))
            peers = Peers(k, n, with_torch=False, engine_order=False)
            for m in (int(r) for r in args.rows.split(",")):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                t_bf16 = peers.time_bf16(x)
                for tiles in TILES:
                    times = [
                        graph_time_us(
                            lambda i, mod=mod, tiles=tiles, x=x, w=peers.int4: mod.int4_wgmma(
                                x, w[i], *tiles
                            ),
                            peers.num_int4,
                        )
                        for mod in mods.values()
                    ]
                    cells = " | ".join(f"{t:.1f}" for t in times)
                    print(f"| {k} x {n} | {m} | {tiles} | {t_bf16:.1f} | {cells} |", flush=True)
            del peers
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
