"""A memory bounds checker for Triton kernels run under the interpreter (TRITON_INTERPRET=1).

While :func:`checking` is active, every ``tl.load``, ``tl.store`` and ``tl.atomic_*`` that an
interpreted kernel executes is checked before it happens: each unmasked lane's element
[address, address + itemsize) must lie inside one of the byte ranges of that launch's tensor
arguments. A lane outside all of them raises :class:`BoundsViolation` (the access is not made, so a
wild store corrupts nothing and a wild load cannot segfault the process), naming the kernel, the
op, the source line, the first bad address and the argument nearest to it. The violation is also
kept in :attr:`Checker.violations`, so a caller that swallows the exception still sees it.

Extents (``extent=``):
  * ``"storage"``: [storage start, storage start + nbytes) of each tensor's storage: the memory a
    stray access may touch without faulting on a GPU allocation of that size.
  * ``"view"``: the bytes from the tensor's lowest element to the end of its highest one (holes of
    a strided view included). A view inside a larger buffer (the sentinel buffers of the guard
    tests) gets its own range, so a read of the buffer around it is caught too.

How it hooks the interpreter (``triton/runtime/interpreter.py``, written against triton 3.9):

  GridExecutor.__call__          one launch: the kernel's name, a context for its accesses
  GridExecutor._init_args_hst    returns the host tensors whose addresses the kernel's pointer
                                 arguments hold (the tensors themselves on the CPU, host copies
                                 of device tensors): their ranges are the launch's
  interpreter_builder.
    create_masked_load           every load: tl.load, masked or not (create_load), the atomic
                                 load and poll, tensor-descriptor loads
    create_masked_store          every store, likewise
    create_atomic_rmw / _cas     tl.atomic_add/max/min/and/or/xor/xchg, tl.atomic_cas

Each check is a few numpy reductions over the op's masked-in addresses (min and max against the
merged ranges; a per-lane search only when they straddle ranges). :func:`unavailable` says why the
checker cannot run (kernels compiled, or interpreter internals other than the ones above).
"""
import contextlib
import inspect
import os
import sys
from typing import List, NamedTuple, Optional

import numpy as np

# The interpreter internals hooked, with the parameters the wrappers pass through by position.
_BUILDER_OPS = {
    "create_masked_load": ("ptrs", "mask", "other", "cache_policy", "is_volatile"),
    "create_masked_store": ("ptrs", "value", "mask", "cache_policy"),
    "create_atomic_rmw": ("rmwOp", "ptr", "val", "mask", "sem", "scope"),
    "create_atomic_cas": ("ptr", "cmp", "val", "sem", "scope"),
}
_EXECUTOR = {"__call__": None, "_init_args_hst": ("args_dev", "kwargs")}
_HERE = os.path.abspath(__file__)


class BoundsViolation(AssertionError):
    """An interpreted kernel's access outside every tensor argument of its launch."""


class Extent(NamedTuple):
    name: str  # the kernel argument ("k_cache_ptr", "ptrs[1]" for a tuple element)
    lo: int  # first byte
    hi: int  # one past the last byte


class Violation(NamedTuple):
    kernel: str
    op: str
    where: str  # file:line of the op in the kernel's source
    lanes: int  # unmasked lanes outside every extent
    total: int  # unmasked lanes of the op
    address: int  # the first bad lane's address
    itemsize: int
    nearest: str  # the extent nearest to it, and how far

    def __str__(self):
        return (f"{self.kernel}: {self.op} at {self.where}: {self.lanes} of {self.total} unmasked "
                f"lanes outside every tensor argument; first at {self.address:#x} "
                f"({self.itemsize}-byte element), {self.nearest}")


def _interpreted() -> bool:
    try:
        from triton import knobs
        return bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def unavailable() -> Optional[str]:
    """None when the checker can run here, else why not (kernels compiled, or this triton's
    interpreter lacks the internals it hooks)."""
    try:
        import triton
        from triton.runtime import interpreter as interp
    except ImportError as e:
        return f"triton's interpreter does not import: {e}"
    if not _interpreted():
        return "kernels are compiled (TRITON_INTERPRET unset): nothing to hook"
    where = f"triton {triton.__version__} interpreter"
    builder = getattr(interp, "interpreter_builder", None)
    executor = getattr(interp, "GridExecutor", None)
    if builder is None or executor is None:
        return f"{where}: no interpreter_builder or GridExecutor"
    for owner, label, ops in ((builder, "interpreter_builder", _BUILDER_OPS),
                              (executor, "GridExecutor", _EXECUTOR)):
        for name, params in ops.items():
            fn = getattr(owner, name, None)
            if fn is None:
                return f"{where}: no {label}.{name}"
            if params is not None:
                got = tuple(inspect.signature(fn).parameters)
                if got[-len(params):] != params or len(got) > len(params) + 1:
                    return f"{where}: {name}{got}, the checker wraps {name}{params}"
    return None


def _tensors(name, value):
    """(name, torch tensor) for every tensor in a launch argument (tuples and descriptors
    walked; a TensorWrapper's base)."""
    if isinstance(value, tuple):
        for i, v in enumerate(value):
            yield from _tensors(f"{name}[{i}]", v)
    elif hasattr(value, "untyped_storage"):
        yield name, value
    elif hasattr(value, "data_ptr") and hasattr(value, "base"):  # a TensorWrapper (reinterpret)
        yield from _tensors(name, value.base)
    elif hasattr(value, "base") and hasattr(value, "block_shape"):  # a TensorDescriptor
        yield from _tensors(f"{name}.base", value.base)


def _extent(name, t, mode) -> Extent:
    if mode == "storage":
        s = t.untyped_storage()
        return Extent(name, s.data_ptr(), s.data_ptr() + s.nbytes())
    if t.numel() == 0:
        return Extent(name, t.data_ptr(), t.data_ptr())
    lo = hi = 0
    for size, stride in zip(t.shape, t.stride()):
        span = (size - 1) * stride
        lo, hi = (lo + span, hi) if span < 0 else (lo, hi + span)
    esize = t.element_size()
    return Extent(name, t.data_ptr() + lo * esize, t.data_ptr() + (hi + 1) * esize)


class _Launch:
    def __init__(self, kernel):
        self.kernel = kernel
        self.extents: List[Extent] = []
        self.starts = self.ends = np.zeros(0, np.uint64)

    def set_extents(self, extents):
        """The launch's extents, merged where they overlap or touch (views of one buffer)."""
        self.extents = extents
        merged = []
        for e in sorted((e for e in extents if e.hi > e.lo), key=lambda e: e.lo):
            if merged and e.lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e.hi)
            else:
                merged.append([e.lo, e.hi])
        self.starts = np.array([m[0] for m in merged], np.uint64)
        self.ends = np.array([m[1] for m in merged], np.uint64)

    def outside(self, addr, itemsize):
        """bool per address in addr (uint64, 1-D): its element is outside every merged extent.
        Wrapped (negative) offsets are huge uint64 addresses: outside too."""
        last = self.ends - np.minimum(self.ends, np.uint64(itemsize))  # last element start
        idx = np.searchsorted(self.starts, addr, side="right").astype(np.int64) - 1
        inside = (idx >= 0) & (addr <= last[np.maximum(idx, 0)])
        return ~inside

    def fits(self, lo, hi, itemsize):
        """Whether [lo, hi] (first and last element addresses) lies in one merged extent."""
        i = int(np.searchsorted(self.starts, lo, side="right")) - 1
        return i >= 0 and int(hi) + itemsize <= int(self.ends[i])

    def nearest(self, addr, itemsize):
        if not self.extents:
            return "and the launch has no tensor argument"

        def gap(e):
            return e.lo - addr if addr < e.lo else max(addr - e.hi, 0)
        e = min(self.extents, key=gap)
        span = f"{e.name} [{e.lo:#x}, {e.hi:#x}) ({e.hi - e.lo} bytes)"
        if addr >= 2 ** 63:  # a negative offset from some argument, wrapped
            return f"a negative address (-{2 ** 64 - addr:#x}); nearest argument {span}"
        if addr < e.lo:
            return f"{e.lo - addr} bytes before {span}"
        if addr < e.hi:
            return f"its last {addr + itemsize - e.hi} bytes past the end of {span}"
        return f"{addr - e.hi} bytes past the end of {span}"


def _source_line():
    """file:line of the innermost frame outside triton and this file: the op in the kernel."""
    import triton
    pkg = os.path.dirname(os.path.abspath(triton.__file__))
    f = sys._getframe(1)
    while f is not None:
        fname = os.path.abspath(f.f_code.co_filename)
        if fname != _HERE and not fname.startswith(pkg + os.sep):
            return f"{os.path.basename(fname)}:{f.f_lineno}"
        f = f.f_back
    return "?"


class Checker:
    """The hooks of one :func:`checking` block; ``violations``: every access it refused."""

    def __init__(self, extent="storage"):
        if extent not in ("storage", "view"):
            raise ValueError(f"extent: 'storage' or 'view', got {extent!r}")
        self.extent = extent
        self.violations: List[Violation] = []
        self.launches = 0  # interpreted launches seen
        self.accesses = 0  # memory ops checked
        self._stack: List[_Launch] = []

    # ---- the hooks --------------------------------------------------------------------------

    def _call(self, orig):
        checker = self

        def __call__(executor, *args, **kwargs):
            checker._stack.append(_Launch(getattr(executor.fn, "__name__", "kernel")))
            checker.launches += 1
            try:
                return orig(executor, *args, **kwargs)
            finally:
                checker._stack.pop()
        return __call__

    def _init_args(self, orig):
        checker = self

        def _init_args_hst(executor, args_dev, kwargs):
            args_hst, kwargs_hst = orig(executor, args_dev, kwargs)
            named = list(zip(executor.arg_names, args_hst)) + list(kwargs_hst.items())
            if checker._stack:
                checker._stack[-1].set_extents([_extent(n, t, checker.extent)
                                                for name, v in named
                                                for n, t in _tensors(name, v)])
            return args_hst, kwargs_hst
        return _init_args_hst

    def _op(self, orig, op, ptr_at, mask_at):
        checker = self

        def wrapper(*args):
            mask = args[mask_at] if mask_at is not None else None
            name = op(args) if callable(op) else op
            checker.check(name, args[ptr_at], mask)
            return orig(*args)
        return wrapper

    # ---- the check --------------------------------------------------------------------------

    def check(self, op, ptrs, mask):
        """Raise BoundsViolation when an unmasked lane of ptrs (a TensorHandle of addresses)
        addresses an element outside the current launch's extents."""
        if not self._stack:  # not inside a launch (a device function called directly)
            return
        launch = self._stack[-1]
        self.accesses += 1
        addr = np.asarray(ptrs.data, dtype=np.uint64)
        if mask is not None:
            m = np.asarray(mask.data, dtype=bool)
            if not m.all():
                addr = np.broadcast_to(addr, np.broadcast_shapes(addr.shape, m.shape))
                addr = addr[np.broadcast_to(m, addr.shape)]
        addr = addr.reshape(-1)
        if addr.size == 0:
            return
        itemsize = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        if launch.fits(addr.min(), addr.max(), itemsize):
            return
        bad = addr[launch.outside(addr, itemsize)]
        if bad.size == 0:
            return
        first = int(bad[0])
        v = Violation(launch.kernel, op, _source_line(), int(bad.size), int(addr.size), first,
                      itemsize, launch.nearest(first, itemsize))
        self.violations.append(v)
        raise BoundsViolation(str(v))

    def report(self) -> str:
        return "\n".join(str(v) for v in self.violations)


def _rmw_name(args):
    return f"tl.atomic_rmw({str(args[0]).rsplit('.', 1)[-1]})"


@contextlib.contextmanager
def checking(extent="storage", raise_at_exit=True):
    """Check every memory op of the interpreted kernels launched inside the block (see the
    module docstring); yields the :class:`Checker`. ``raise_at_exit``: raise BoundsViolation at
    the end of the block when any access was refused, even if the block swallowed the raise.
    Raises RuntimeError when :func:`unavailable` gives a reason."""
    reason = unavailable()
    if reason is not None:
        raise RuntimeError(f"bounds checker unavailable: {reason}")
    from triton.runtime import interpreter as interp
    checker = Checker(extent)
    builder, executor = interp.interpreter_builder, interp.GridExecutor
    saved_builder = {name: builder.__dict__.get(name) for name in _BUILDER_OPS}
    saved_executor = {name: executor.__dict__[name] for name in _EXECUTOR}
    hooks = {
        "create_masked_load": checker._op(builder.create_masked_load, "tl.load", 0, 1),
        "create_masked_store": checker._op(builder.create_masked_store, "tl.store", 0, 2),
        "create_atomic_rmw": checker._op(builder.create_atomic_rmw, _rmw_name, 1, 3),
        "create_atomic_cas": checker._op(builder.create_atomic_cas, "tl.atomic_cas", 0, None),
    }
    try:
        for name, fn in hooks.items():
            setattr(builder, name, fn)
        executor.__call__ = checker._call(saved_executor["__call__"])
        executor._init_args_hst = checker._init_args(saved_executor["_init_args_hst"])
        yield checker
    except Exception as e:
        if checker.violations and not isinstance(e, BoundsViolation):
            # the interpreter wraps the kernel's raise in an InterpreterError: raise the cause
            raise BoundsViolation(checker.report()) from e
        raise
    finally:
        for name, fn in saved_builder.items():
            if fn is None:
                delattr(builder, name)
            else:
                setattr(builder, name, fn)
        for name, fn in saved_executor.items():
            setattr(executor, name, fn)
    if raise_at_exit and checker.violations:
        raise BoundsViolation(f"{len(checker.violations)} access(es) outside the launch's "
                              f"tensors, the exception swallowed:\n{checker.report()}")
