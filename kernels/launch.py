"""Eager launches of a Triton (or Gluon) kernel without its full per-call binding work.

A ``JITFunction`` call binds every argument, specializes it, builds a cache key that hashes
the constexpr values (Gluon layouts hash their basis lists each time) and ``str``s the compile
options, and only then launches. On the H200 machine's host that came to 130-200 us per call
of the swapped INT4 kernel, against 15-27 us for ``F.linear``: an eager prefill step of an
8B model runs 128 such linears, so the host, not the GPU, set the pace up to about 1024
tokens per step (BENCHMARKS.md, "INT4 GEMM", eighth session of 2026-11-30).

``FastLaunch`` keeps each compiled kernel under a key made of the caller's own key (which
must determine every constexpr argument and compile option) and Triton's specialization of
the runtime integer and tensor arguments, computed by the same native function the binder
uses, with each parameter's ``do_not_specialize`` settings. A miss (and anything but a
``JITFunction``, such as the interpreter's ``InterpretedFunction``) goes through the normal
call, which compiles and launches; a hit launches the compiled kernel directly, as
``JITFunction.run`` does after its lookup. Tensor-descriptor arguments are not specialized
here: their type (dtype, block, layout) must follow from the caller's key.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

try:  # Triton >= 3.4
    from triton._C.libtriton import native_specialize_impl
except ImportError:  # pragma: no cover - older Triton: every call takes the normal path
    native_specialize_impl = None


class FastLaunch:
    """``launch(grid, key, args, **options)`` runs ``fn[grid](**args, **options)``.

    ``args`` maps every parameter of ``fn`` that has no default to its value (defaults are
    filled in; an option that is also a parameter, as a Gluon kernel's ``num_warps``, may
    come in ``options``); ``key`` must be hashable and determine the constexpr arguments,
    the compile options (``num_warps`` and the like) and the types of tensor-descriptor
    arguments.
    """

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.fast = isinstance(fn, JITFunction) and native_specialize_impl is not None
        self.kernels: dict[Hashable, Any] = {}
        if not self.fast:
            return
        self.names = list(fn.arg_names)
        self.defaults = {
            name: p.default
            for name, p in fn.signature.parameters.items()
            if p.default is not p.empty
        }
        # (name, is_const, specialize, align) of the parameters whose specialization is
        # computed per call: the runtime ones without a type annotation
        self.runtime = [
            (p.name, p.is_const, not p.do_not_specialize, not p.do_not_specialize_on_alignment)
            for p in fn.params
            if not p.is_constexpr and not p.annotation_type
        ]

    def __call__(self, grid: Sequence[int], key: Hashable, args: dict, **options: Any) -> None:
        if not self.fast:
            self.fn[tuple(grid)](**args, **options)
            return
        device = driver.active.get_current_device()
        backend = self.fn.device_caches[device][3]
        spec = []
        for name, is_const, specialize, align in self.runtime:
            value = args[name]
            if hasattr(value, "block_type") or hasattr(value, "block_shape"):
                continue  # a tensor descriptor: typed by the caller's key
            spec.append(native_specialize_impl(backend, value, is_const, specialize, align))
        full_key = (device, key, tuple(spec))
        kernel = self.kernels.get(full_key)
        if kernel is None:
            self.kernels[full_key] = self.fn[tuple(grid)](**args, **options)
            return
        # every parameter in order, as the binder's bound arguments: the call's arguments, then
        # options that are parameters too (a Gluon kernel's ``num_warps``), then defaults
        values = [
            args[n] if n in args else options[n] if n in options else self.defaults[n]
            for n in self.names
        ]
        stream = driver.active.get_current_stream(device)
        grid = (*grid, 1, 1)
        kernel.run(
            grid[0], grid[1], grid[2], stream, kernel.function, kernel.packed_metadata,
            kernel.launch_metadata(grid, stream, *values), knobs.runtime.launch_enter_hook,
            knobs.runtime.launch_exit_hook, *values,
        )  # fmt: skip
