"""Tests in tests/quant run the Triton kernels under the CPU interpreter when there is no GPU."""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
