"""Shared test setup.

Without CUDA, Triton kernels can only run in Triton's CPU interpreter. ``TRITON_INTERPRET`` is
read when ``@triton.jit`` decorates a kernel, i.e. when a ``kernels.*`` module is first
imported, so it is set here, before any test module imports one. GPU tests are skipped where
CUDA is absent (always in CI).
"""

from __future__ import annotations

import importlib.metadata
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_configure(config):
    """Refuse to run beside Hugging Face's ``kernels`` distribution: its import name is that of
    this project's kernels/ package, so transformers (the tests' reference) would import ours
    in its place and fail. transformers >= 5.25 requires it; pyproject keeps it below."""
    try:
        found = importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        return
    raise pytest.UsageError(
        f"Hugging Face's `kernels` {found} is installed; its import name clashes with this "
        "project's kernels/ package (transformers would import ours). Uninstall it (`pip "
        "uninstall kernels`) and keep transformers < 5.25, as pyproject.toml's dev extra does."
    )


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
