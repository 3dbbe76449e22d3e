"""Kernel tests: without CUDA the Triton kernels run in its CPU interpreter.

The root ``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` before any kernel module is imported
(the flag is read when ``@triton.jit`` decorates a kernel).
"""
