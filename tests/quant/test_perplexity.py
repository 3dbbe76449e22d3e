"""The default model (GGUF Q4_1, dequantized to fp32) re-quantized to 4 bits with group 128:
GPTQ stays within 10% of the unquantized perplexity and below round-to-nearest's.

Calibration on one public-domain text, evaluation on another (tests/data); a few hundred
tokens each way to keep the test fast.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from engine.quant.calibration import perplexity, token_chunks
from engine.quant.quantize import DEFAULT_CALIBRATION_TEXT, load_dense_model
from engine.quant.quantize_model import quantize_model

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.slow
def test_gptq_g128_perplexity_within_10_percent_and_below_rtn():
    model, files = load_dense_model(None)
    calibration_texts = [
        (DATA / "declaration_of_independence.txt").read_text(),
        DEFAULT_CALIBRATION_TEXT,
    ]
    calibration = token_chunks(files.tokenizer, calibration_texts, 256, 8)
    evaluation = token_chunks(
        files.tokenizer, [(DATA / "lincoln_second_inaugural.txt").read_text()], 256, 2
    )
    state = copy.deepcopy(model.state_dict())
    ppl_fp32 = perplexity(model, evaluation)
    quantize_model(model, calibration, "rtn", group_size=128)
    ppl_rtn = perplexity(model, evaluation)
    model.load_state_dict(state)
    quantize_model(
        model, calibration, "gptq", group_size=128, act_order=True, damp_percent=0.01, mse=True
    )
    ppl_gptq = perplexity(model, evaluation)
    summary = f"fp32 {ppl_fp32:.2f}, RTN {ppl_rtn:.2f}, GPTQ {ppl_gptq:.2f}"
    assert 5 < ppl_fp32 < 200, summary  # the unquantized model reads English
    assert ppl_gptq <= 1.10 * ppl_fp32, summary
    assert ppl_gptq < ppl_rtn, summary
