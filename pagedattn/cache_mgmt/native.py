"""The radix cache's C helpers (`_radix_native.c`): built once per source and Python, loaded
from the cache directory afterwards.

The build uses the C compiler Python was built with (sysconfig's CC, else `cc`, `gcc` or
`clang` on PATH) and Python's headers: what Triton's launcher stubs need on every GPU host.
It takes about a second, once; later processes load the built module in about a millisecond.
Concurrent first builds (tensor-parallel ranks) each compile to a private file and rename it
into place, so a reader never sees a half-written module.

Without a compiler (or Python's headers, or a writable cache directory) `load()` returns None,
once with a RuntimeWarning, and the cache and its pools run the pure-Python path: same results,
about twice the time per request (docs/radix_cache.md). `reason()` says why the C helpers are
not in use.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import warnings

from pagedattn import config

__all__ = ["load", "reason", "disabled"]

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_radix_native.c")
_NAME = "_radix_native"
_state: dict = {}          # "module" (or None), "reason" (str)


def load():
    """The built C module, or None (see `reason()`). Built or loaded on the first call."""
    if "module" not in _state:
        _state["module"], _state["reason"] = _load()
        if _state["module"] is None:
            warnings.warn(f"pagedattn radix cache: pure-Python path ({_state['reason']})",
                          RuntimeWarning, stacklevel=2)
    return _state["module"]


@contextlib.contextmanager
def disabled():
    """Within the block, `load()` returns None: caches built there run the pure-Python path
    (tests of both paths; the bench's pure-Python row)."""
    load()
    saved = dict(_state)
    _state.update(module=None, reason="native.disabled()")
    try:
        yield
    finally:
        _state.update(saved)


def reason() -> str:
    """Why the C helpers are not in use ('' when they are)."""
    load()
    return _state["reason"]


def _load():
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    with open(_SRC, "rb") as f:
        src = f.read()
    tag = hashlib.sha256(src + sys.version.encode() + suffix.encode()).hexdigest()[:16]
    path = os.path.join(config.cache_dir(), "native", f"{_NAME}-{tag}{suffix}")
    if not os.path.exists(path):
        err = _build(path)
        if err:
            return None, err
    try:
        spec = importlib.util.spec_from_file_location(_NAME, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except ImportError as e:
        return None, f"the built module does not load: {e}"
    return mod, ""


def _compiler():
    cc = shlex.split(sysconfig.get_config_var("CC") or "")
    if cc and shutil.which(cc[0]):
        return cc
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return [name]
    return None


def _build(path: str) -> str:
    """Compile the module to `path`; returns '' or why it failed."""
    cc = _compiler()
    if cc is None:
        return "no C compiler (cc, gcc or clang) on PATH"
    inc = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(inc, "Python.h")):
        return f"no Python headers ({inc}/Python.h)"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
        os.close(fd)
    except OSError as e:
        return f"the cache directory is not writable ({e})"
    cmd = cc + ["-O2", "-shared", "-fPIC", "-std=c99", "-Wall", f"-I{inc}", _SRC, "-o", tmp]
    if sys.platform == "darwin":
        cmd += ["-undefined", "dynamic_lookup"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        os.unlink(tmp)
        return f"the compiler did not run: {e}"
    if r.returncode:
        os.unlink(tmp)
        return f"the build failed: {' '.join(cmd)}\n{r.stderr[-2000:]}"
    try:
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        return f"the built module could not be put in place ({e})"
    return ""
