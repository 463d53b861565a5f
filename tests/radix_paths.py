"""Both paths of the radix cache in the tests: the C helpers (cache_mgmt/native.py) and the
pure-Python one. A cache picks its path when it is constructed."""
import contextlib

import pytest

from pagedattn.cache_mgmt import native


def radix_path(c_helpers: bool):
    """A context in which caches are built with the C helpers, which must have built here,
    or on the pure-Python path."""
    if not c_helpers:
        return native.disabled()
    if native.load() is None:
        pytest.fail(f"the radix cache's C helpers did not build: {native.reason()}")
    return contextlib.nullcontext()
