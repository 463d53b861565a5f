"""The bounds checker itself (tests/bounds_check.py): a tiny kernel whose every memory op reaches
one element past its tensor is refused, naming the kernel, the op and the tensor; the same
kernel in range, or with the stray lane masked off, runs and writes what it should."""
import os
import subprocess
import sys

import pytest
import torch

import bounds_check as BC
from pagedattn._triton import triton_available

pytestmark = pytest.mark.interp
if not triton_available():
    pytest.skip("needs triton", allow_module_level=True)
REASON = BC.unavailable()
if REASON is not None:
    pytest.skip(f"bounds checker: {REASON}", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

N = 8  # elements of each tensor; one program of N lanes


@triton.jit
def _touch(x_ptr, y_ptr, shift, limit, OP: tl.constexpr, N: tl.constexpr):
    """Lane i reaches element i + shift of x (masked to lanes with i + shift < limit): loads it
    into y, stores to it, or updates it atomically."""
    i = tl.arange(0, N)
    j = i + shift
    m = j < limit
    if OP == "load":
        tl.store(y_ptr + i, tl.load(x_ptr + j, mask=m, other=-1.0), mask=i < N)
    elif OP == "unmasked_load":
        tl.store(y_ptr + i, tl.load(x_ptr + j))
    elif OP == "scalar_load":  # one address: x[shift]
        tl.store(y_ptr, tl.load(x_ptr + shift))
    elif OP == "store":
        tl.store(x_ptr + j, tl.load(y_ptr + i), mask=m)
    elif OP == "atomic_add":
        tl.atomic_add(x_ptr + j, tl.load(y_ptr + i), mask=m)
    elif OP == "atomic_cas":  # x[shift] == 0 -> 5
        tl.atomic_cas(x_ptr + shift, 0.0, 5.0)


OPS = {  # OP: the op name the checker reports
    "load": "tl.load", "unmasked_load": "tl.load", "scalar_load": "tl.load",
    "store": "tl.store", "atomic_add": "tl.atomic_rmw(FADD)", "atomic_cas": "tl.atomic_cas",
}


def _launch(op, shift, limit, buf_extra=0):
    """x: N floats, the first N of a buffer of N + buf_extra (x's view ends before the rest);
    y: N floats."""
    buf = torch.zeros(N + buf_extra)
    x = buf[:N]
    y = torch.arange(N, dtype=torch.float32) + 1
    _touch[(1,)](x_ptr=x, y_ptr=y, shift=shift, limit=limit, OP=op, N=N)
    return x, y


def _expected(op, shift, limit):
    """x and y after the launch, computed in torch."""
    x = torch.zeros(N)
    y = torch.arange(N, dtype=torch.float32) + 1
    i = torch.arange(N)
    j = i + shift
    m = j < min(limit, N)
    if op in ("load", "unmasked_load"):
        y = torch.where(m, x[j.clamp(max=N - 1)], -1.0)
    elif op == "scalar_load":
        y[0] = x[shift]
    elif op in ("store", "atomic_add"):
        x[j[m]] = y[m]
    elif op == "atomic_cas":
        x[shift] = 5.0
    return x, y


@pytest.mark.parametrize("op", list(OPS))
def test_one_element_past_the_tensor_is_refused(op):
    # lane N - 1 reaches x[N] (the mask lets it through): the first byte past x's storage
    shift, limit = (N, N + 1) if op in ("scalar_load", "atomic_cas") else (1, N + 1)
    with pytest.raises(BC.BoundsViolation) as info:
        with BC.checking() as chk:
            _launch(op, shift, limit)
    assert len(chk.violations) == 1
    v = chk.violations[0]
    assert (v.kernel, v.op, v.lanes, v.itemsize) == ("_touch", OPS[op], 1, 4)
    assert v.total == (1 if op in ("scalar_load", "atomic_cas") else N)
    assert v.where.startswith("test_bounds_check.py:")
    assert "0 bytes past the end of x_ptr" in v.nearest
    assert "_touch" in str(info.value) and OPS[op] in str(info.value)


IN_RANGE = {  # OP: (shift, limit) launches that stay inside x
    "load": [(0, N), (1, N)],  # (1, N): lane N - 1 would reach x[N], masked off
    "unmasked_load": [(0, N)],
    "scalar_load": [(N - 1, N)],
    "store": [(0, N), (1, N)],
    "atomic_add": [(0, N), (1, N)],
    "atomic_cas": [(N - 1, N)],
}


@pytest.mark.parametrize("op", list(OPS))
def test_in_range_and_masked_off_lanes_pass(op):
    with BC.checking() as chk:
        for shift, limit in IN_RANGE[op]:
            x, y = _launch(op, shift, limit)
            want_x, want_y = _expected(op, shift, limit)
            assert torch.equal(x, want_x) and torch.equal(y, want_y), (shift, limit)
    assert chk.violations == [] and chk.launches == len(IN_RANGE[op])
    assert chk.accesses >= chk.launches


def test_an_element_before_the_tensor_is_refused():
    with pytest.raises(BC.BoundsViolation, match="4 bytes before x_ptr"):
        with BC.checking():
            _launch("load", -1, N)  # lane 0 reaches x[-1]


def test_a_wrapped_negative_address_is_refused():
    """An offset of -2**60 elements wraps the 64-bit address below 0 (as a huge negative id
    times a stride can): the range check must not wrap with it."""
    with pytest.raises(BC.BoundsViolation, match="negative address"):
        with BC.checking():
            _launch("scalar_load", -2 ** 60, N)


def test_view_extent_refuses_the_buffer_around_a_view():
    """x is the first N elements of a 2N buffer: x[N] is inside the storage (allowed with
    extent="storage") but outside the view (refused with extent="view")."""
    with BC.checking(extent="storage") as chk:
        _launch("load", 1, N + 1, buf_extra=N)
    assert chk.violations == []
    with pytest.raises(BC.BoundsViolation, match="0 bytes past the end of x_ptr"):
        with BC.checking(extent="view"):
            _launch("load", 1, N + 1, buf_extra=N)


def test_a_swallowed_violation_still_fails_the_block():
    with pytest.raises(BC.BoundsViolation, match=r"1 access\(es\) outside"):
        with BC.checking():
            try:
                _launch("store", 1, N + 1)
            except Exception:  # noqa: BLE001 - what a careless caller might do
                pass


def test_hooks_are_removed_after_the_block():
    from triton.runtime import interpreter as interp
    before = (interp.GridExecutor.__call__, interp.GridExecutor._init_args_hst)
    with BC.checking():
        assert interp.GridExecutor.__call__ is not before[0]
    assert (interp.GridExecutor.__call__, interp.GridExecutor._init_args_hst) == before
    assert "create_masked_load" not in vars(interp.interpreter_builder)
    _launch("load", 1, N + 1, buf_extra=N)  # unchecked again: runs (reads the buffer's rest)


def test_missing_interpreter_internals_are_named(monkeypatch):
    """A triton whose interpreter lacks a hooked method, or changed its parameters: the reason
    names it, and checking() refuses to start (instead of checking nothing)."""
    from triton.runtime import interpreter as interp
    monkeypatch.delattr(interp.GridExecutor, "_init_args_hst")
    assert "no GridExecutor._init_args_hst" in BC.unavailable()
    monkeypatch.undo()
    monkeypatch.setattr(interp.interpreter_builder, "create_masked_store",
                        lambda ptrs, mask, value, cache_policy: None)
    assert "create_masked_store('ptrs', 'mask', 'value'" in BC.unavailable()
    with pytest.raises(RuntimeError, match="bounds checker unavailable"):
        with BC.checking():
            pass
    monkeypatch.undo()
    assert BC.unavailable() is None


MARKED = '''
import pytest
import torch
from test_bounds_check import _launch, N

@pytest.mark.bounds
def test_swallowed():
    try:
        _launch("store", 1, N + 1)  # x[N]: refused
    except Exception:
        pass

@pytest.mark.bounds(extent="view")
def test_in_range():
    _launch("load", 0, N)

def test_unmarked():
    _launch("load", 1, N + 1, buf_extra=N)  # inside x's buffer: unchecked, runs
'''


def test_the_bounds_marker_fails_a_test_that_swallows_the_violation(tmp_path):
    """tests/conftest.py's fixture on tests marked ``bounds``, run by a pytest of its own."""
    (tmp_path / "test_marked.py").write_text(MARKED)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p",
                        "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning",
                        str(tmp_path / "test_marked.py")], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=300)
    out = r.stdout + r.stderr
    assert "3 passed, 1 error" in out, out  # test_swallowed's call passes, its teardown fails
    assert "ERROR test_marked.py::test_swallowed" in out and "the exception swallowed" in out
    assert "_touch: tl.store" in out, out
