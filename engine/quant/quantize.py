"""``tidal quantize``: load a model, quantize it (GPTQ or RTN), write a GPTQ checkpoint."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from engine.quant.calibration import read_calibration_texts, token_chunks
from engine.quant.gptq_writer import write_gptq_checkpoint
from engine.quant.quantize_model import METHODS, quantize_model

# Used when no --calibration file is given: public-domain English (Lincoln, Gettysburg, 1863).
DEFAULT_CALIBRATION_TEXT = (
    "Four score and seven years ago our fathers brought forth on this continent, a new nation, "
    "conceived in Liberty, and dedicated to the proposition that all men are created equal. "
    "Now we are engaged in a great civil war, testing whether that nation, or any nation so "
    "conceived and so dedicated, can long endure. We are met on a great battle-field of that "
    "war. We have come to dedicate a portion of that field, as a final resting place for those "
    "who here gave their lives that that nation might live. It is altogether fitting and proper "
    "that we should do this. But, in a larger sense, we can not dedicate -- we can not "
    "consecrate -- we can not hallow -- this ground. The brave men, living and dead, who "
    "struggled here, have consecrated it, far above our poor power to add or detract. The world "
    "will little note, nor long remember what we say here, but it can never forget what they "
    "did here. It is for us the living, rather, to be dedicated here to the unfinished work "
    "which they who fought here have thus far so nobly advanced. It is rather for us to be here "
    "dedicated to the great task remaining before us -- that from these honored dead we take "
    "increased devotion to that cause for which they gave the last full measure of devotion -- "
    "that we here highly resolve that these dead shall not have died in vain -- that this "
    "nation, under God, shall have a new birth of freedom -- and that government of the people, "
    "by the people, for the people, shall not perish from the earth."
)


def load_dense_model(model_path: str | Path | None):
    """(engine LlamaForCausalLM in float32 on CPU, ModelFiles); GGUF weights are dequantized."""
    from engine.loader import load_model_files
    from engine.models.config import ModelConfig
    from engine.models.llama import LlamaForCausalLM

    files = load_model_files(model_path)
    if files.quantization_config:
        raise ValueError(f"{model_path} is already quantized; pass an unquantized model")
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        model = LlamaForCausalLM(ModelConfig.from_hf_config(files.hf_config))
    finally:
        torch.set_default_dtype(old)
    model.load_weights((name, t.float()) for name, t in files.weights())
    return model.eval(), files


def quantize_checkpoint(
    model_path: str | Path | None,
    out_dir: str | Path,
    method: str = "gptq",
    bits: int = 4,
    group_size: int = 128,
    act_order: bool = False,
    sym: bool = False,
    calibration: str | Path | None = None,
    seq_len: int = 512,
    max_sequences: int = 128,
    damp_percent: float = 0.1,
    mse: bool = True,
) -> Path:
    """Quantize ``model_path`` (HF directory or GGUF; None = default model) into ``out_dir``.

    GPTQ defaults (damping 10% of the mean Hessian diagonal, clipped-grid search) are the ones
    that kept the default model within 10% of its perplexity on little calibration text
    (tests/quant/test_perplexity.py); GPTQ's paper uses 1% damping with far more data. RTN
    keeps the plain min-max grid: it is the baseline.
    """
    if method not in METHODS:
        raise ValueError(f"--method must be one of {METHODS}, got {method!r}")
    if bits != 4:
        raise ValueError(f"only --bits 4 is supported, got {bits}")
    start = time.monotonic()
    model, files = load_dense_model(model_path)
    texts = read_calibration_texts(calibration) if calibration else [DEFAULT_CALIBRATION_TEXT]
    seq_len = min(seq_len, model.config.max_position_embeddings)
    sequences = token_chunks(files.tokenizer, texts, seq_len, max_sequences)
    quantized = quantize_model(
        model, sequences, method, group_size, act_order, sym, damp_percent, mse
    )
    source = files.path if files.source == "hf" else None
    out = write_gptq_checkpoint(
        out_dir,
        model,
        quantized,
        files.hf_config,
        files.tokenizer,
        source,
        act_order,
        sym,
        damp_percent,
    )
    print(
        f"quantized {len(quantized)} linear layers with {method} (group {group_size}, "
        f"act_order={act_order}) on {sum(len(s) for s in sequences)} calibration tokens "
        f"in {time.monotonic() - start:.1f} s -> {out}"
    )
    return out
