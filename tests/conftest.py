"""Test tiers (README.md, "Tests"): the device is picked here, once.

No GPU: tests run on the CPU and Triton kernels run under the interpreter (TRITON_INTERPRET=1 is
set before anything imports triton). `gpu` tests are skipped with the reason; `hip` tests need the
HIP backend built for the device; `slow` tests need PAGEDATTN_SLOW=1.

Tests run in the default mode of the public ops, as a user's calls do: no device-data validation
(PAGEDATTN_VALIDATE unset), so the kernels' own guards are what runs. Tests of validation mode pass
``validate=True``, use the torch backend (which validates by default), or take the
``validation_mode`` fixture.
"""
import os
import warnings

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# triton.jit picks the interpreter when a kernel is decorated, i.e. when its module is first
# imported. Import every Triton kernel module now, under this tier's setting: dispatch tests
# monkeypatch TRITON_INTERPRET and may trigger the first import, which can leave an xdist worker's
# kernels interpreted for the rest of a GPU run ("Cannot call @triton.jit'd outside of the scope
# of a kernel", and extend tests 3x slower, depending on which tests reached the worker first).
from pagedattn._triton import triton_available  # noqa: E402

if triton_available():
    import importlib

    from pagedattn.triton_kernels import _MODULES
    from pagedattn.triton_kernels import _extend_loop, decode
    for _name in _MODULES.values():
        importlib.import_module(_name)
    _extend_loop.gluon_kernel()  # the Gluon modules too, where this triton runs them
    decode.gluon_kernel()

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", max_examples=300, stateful_step_count=60, deadline=None,
                          derandomize=True, suppress_health_check=list(HealthCheck))
settings.register_profile("deep", max_examples=20000, stateful_step_count=120, deadline=None,
                          suppress_health_check=list(HealthCheck))
settings.register_profile("dev", max_examples=50, stateful_step_count=30, deadline=None,
                          derandomize=True, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    slow = os.environ.get("PAGEDATTN_SLOW", "") not in ("", "0")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(pytest.mark.skip(reason="needs a GPU (the H200 tier)"))
        if "slow" in item.keywords and not slow:
            item.add_marker(pytest.mark.skip(reason="slow tier: set PAGEDATTN_SLOW=1"))


@pytest.fixture(autouse=True)
def _no_recorded_launches():
    """Every test starts without recorded launches (triton_kernels/_replay.py) or remembered
    backend choices (api._decode_route): tests that count or patch a backend's launches or
    supports() see the normal path on a call's first metadata."""
    from pagedattn import api
    api._ROUTES.clear()  # and no remembered backend choices
    if triton_available():
        from pagedattn.triton_kernels import _replay
        _replay.clear()


@pytest.fixture(autouse=True)
def _bounds_checked(request):
    """Tests marked ``bounds`` (``pytest.mark.bounds(extent=...)``, tests/bounds_check.py): every
    load, store and atomic of an interpreted kernel is checked against its launch's tensor
    arguments; an access outside them fails the test. On a GPU the kernels are compiled and
    nothing is checked; an interpreter the checker cannot hook is a warning with the reason."""
    marker = request.node.get_closest_marker("bounds")
    if marker is None or HAS_GPU:
        yield
        return
    import bounds_check
    reason = bounds_check.unavailable()
    if reason is not None:
        warnings.warn(f"bounds checker off: {reason}", pytest.PytestWarning)
        yield
        return
    with bounds_check.checking(**marker.kwargs, raise_at_exit=False) as checker:
        yield
    call = getattr(request.node, "_call_report", None)
    if checker.violations and not (call is not None and call.failed):  # swallowed by the test
        pytest.fail(f"out-of-bounds access(es), the exception swallowed:\n{checker.report()}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test's call-phase report on the item (``_call_report``), for fixtures' teardown."""
    outcome = yield
    if call.when == "call":
        item._call_report = outcome.get_result()


@pytest.fixture
def validation_mode(monkeypatch):
    """PAGEDATTN_VALIDATE=1 for one test: the device-data checks on for every public op and for
    entry points that take no ``validate`` argument (the compat layers)."""
    monkeypatch.setenv("PAGEDATTN_VALIDATE", "1")


@pytest.fixture
def device():
    return torch.device("cuda" if HAS_GPU else "cpu")


@pytest.fixture
def mode_guard():
    """Triton decode tests that force a launch shape (``decode.FORCE_MODE``) leave none behind."""
    yield
    from pagedattn.triton_kernels import decode
    decode.FORCE_MODE = None


@pytest.fixture(params=[True, False], ids=["native", "python"])
def radix_path(request):
    """Run a radix-cache test on both paths: the C helpers and the pure-Python one
    (radix_paths.py)."""
    from radix_paths import radix_path as path
    with path(request.param):
        yield
