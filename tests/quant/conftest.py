"""Without CUDA the Triton kernels run in the CPU interpreter.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a kernel; if an earlier test
directory already imported ``kernels.int4_gemm`` in compiled mode, it is reloaded here.
"""

import importlib
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    if "kernels.int4_gemm" in sys.modules:
        importlib.reload(sys.modules["kernels.int4_gemm"])
