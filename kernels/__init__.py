"""Triton kernels for tidal, each beside a pure-PyTorch reference with the same signature.

Each ``kernels/<op>.py`` holds ``_<op>_kernel`` (Triton), its launcher ``<op>`` and the
reference ``<op>_ref``. The engine picks the Triton launcher on CUDA and the reference on CPU.
This package never imports from ``engine``.
"""
