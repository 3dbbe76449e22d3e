"""Kernel tests: without CUDA, Triton kernels run in its CPU interpreter.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a kernel, i.e. when a
``kernels.*`` module is imported. It is set here, before this directory's test modules import
them; a ``kernels.*`` module that an earlier test directory already imported in compiled mode is
reloaded so that its kernels are interpreted too.
"""

from __future__ import annotations

import importlib
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    from triton.runtime.jit import JITFunction

    for _name, _module in list(sys.modules.items()):
        if _name.startswith("kernels.") and any(
            isinstance(value, JITFunction) for value in vars(_module).values()
        ):
            importlib.reload(_module)
