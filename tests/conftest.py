"""Shared test setup.

Without CUDA, Triton kernels can only run in Triton's CPU interpreter. ``TRITON_INTERPRET`` is
read when ``@triton.jit`` decorates a kernel, i.e. when a ``kernels.*`` module is first
imported, so it is set here, before any test module imports one. GPU tests are skipped where
CUDA is absent (always in CI).
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
