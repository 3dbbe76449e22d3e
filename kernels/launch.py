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

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

try:  # Triton >= 3.4
    from triton._C.libtriton import native_specialize_impl
except ImportError:  # pragma: no cover - older Triton: every call takes the normal path
    native_specialize_impl = None


class FastLaunch:
    """``launch(grid, key, *args, **kwargs)`` runs ``fn[grid](*args, **kwargs)``.

    ``args`` and ``kwargs`` are what the plain call would take: the kernel's parameters
    (positionally, then by name; defaults are filled in) and its compile options
    (``num_warps`` and the like; an option that is also a parameter, as a Gluon kernel's
    ``num_warps``, counts as both). ``key`` must be hashable and determine the constexpr
    arguments, the compile options and the types of tensor-descriptor arguments; ``None``
    makes ``kwargs``' values the key, for callers that pass every constexpr argument and
    option by name and no tensor descriptors (``launch[grid](...)``).
    """

    enabled = True  # False: every launch takes the normal call (benchmarks compare the two)

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
        # (position, is_const, specialize, align) of the parameters whose specialization is
        # computed per call: the runtime ones without a type annotation
        self.runtime = [
            (p.num, p.is_const, not p.do_not_specialize, not p.do_not_specialize_on_alignment)
            for p in fn.params
            if not p.is_constexpr and not p.annotation_type
        ]
        # caller key -> positions of the tensor-descriptor arguments (typed by the key)
        self.descriptors: dict[Hashable, frozenset[int]] = {}

    def __getitem__(self, grid: Sequence[int]) -> Callable[..., None]:
        """``launch[grid](*args, **kwargs)``, as the kernel itself is called, for kernels whose
        constexpr arguments and compile options all come by name: their values are the key."""
        return functools.partial(self, grid, None)

    def __call__(
        self, grid: Sequence[int], key: Hashable | None, *args: Any, **kwargs: Any
    ) -> None:
        if key is None:
            key = tuple(kwargs.values())
        if not (self.fast and FastLaunch.enabled):
            self.fn[tuple(grid)](*args, **kwargs)
            return
        # every parameter in order, as the binder's bound arguments
        names = self.names
        values = [
            *args,
            *(kwargs[n] if n in kwargs else self.defaults[n] for n in names[len(args) :]),
        ]
        descriptors = self.descriptors.get(key)
        if descriptors is None:
            descriptors = frozenset(
                i
                for i, v in enumerate(values)
                if hasattr(v, "block_type") or hasattr(v, "block_shape")
            )
            self.descriptors[key] = descriptors
        device = driver.active.get_current_device()
        backend = self.fn.device_caches[device][3]
        spec = tuple(
            native_specialize_impl(backend, values[i], is_const, specialize, align)
            for i, is_const, specialize, align in self.runtime
            if i not in descriptors
        )
        full_key = (device, key, spec)
        kernel = self.kernels.get(full_key)
        if kernel is None:
            self.kernels[full_key] = self.fn[tuple(grid)](*args, **kwargs)
            return
        stream = driver.active.get_current_stream(device)
        grid = (*grid, 1, 1)
        kernel.run(
            grid[0], grid[1], grid[2], stream, kernel.function, kernel.packed_metadata,
            kernel.launch_metadata(grid, stream, *values), knobs.runtime.launch_enter_hook,
            knobs.runtime.launch_exit_hook, *values,
        )  # fmt: skip
