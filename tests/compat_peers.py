"""The peers' released wheels for the compat tests: downloaded once into a cache outside the
repository, read with zipfile, signatures parsed with ast, Triton kernels loaded with stubs.

Wheels go to ``peer_wheels`` in the package cache directory (``pagedattn.config.cache_dir()``:
``PAGEDATTN_CACHE_DIR``, else ``$XDG_CACHE_HOME/pagedattn`` or ``~/.cache/pagedattn``), about
660 MB for the four pins, through ``pip download --no-deps``; when pip cannot fetch one, :class:`PeerUnavailable` carries pip's
reason and the tests skip with it. Nothing of the peers is imported as a package: the kernel
files SGLang's and vLLM's Triton ops live in are extracted next to the wheel and executed with
stub modules standing in for the rest of each runtime (their imports of environment flags,
platform queries and loggers), as pagedattn/bench/_sglang_peer.py does for SGLang's radix cache.
"""
import ast
import contextlib
import fcntl
import glob
import importlib.util
import inspect
import logging
import os
import subprocess
import sys
import textwrap
import types
import zipfile

import torch

from pagedattn import config

PINS = {  # key -> (distribution, version); the compat modules name the same versions
    "flashinfer": ("flashinfer-python", "0.7.4"),
    "sglang": ("sglang", "0.5.23"),
    "vllm": ("vllm", "0.34.0"),
    "vllm_legacy": ("vllm", "0.24.0"),  # last release with paged_attention_v1/v2
}


class PeerUnavailable(RuntimeError):
    """The peer's wheel cannot be downloaded or its files are not where they were."""


def cache_dir() -> str:
    path = os.path.join(config.cache_dir(), "peer_wheels")
    os.makedirs(path, exist_ok=True)
    return path


_FAILED = {}  # key -> PeerUnavailable: one failed download per process, not one per test


def wheel(key: str) -> str:
    """Path of the pinned wheel, downloaded on first use (a file lock keeps parallel workers
    from fetching it twice)."""
    if key in _FAILED:
        raise _FAILED[key]
    try:
        return _fetch(key)
    except PeerUnavailable as e:
        _FAILED[key] = e
        raise


def _fetch(key: str) -> str:
    dist, version = PINS[key]
    d = cache_dir()
    pattern = os.path.join(d, f"{dist.replace('-', '_')}-{version}-*.whl")
    with open(os.path.join(d, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = glob.glob(pattern)
        if not found:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--timeout", "30", "--retries", "1", "-q", "-d", d, f"{dist}=={version}"]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise PeerUnavailable(f"pip download {dist}=={version}: {e}") from None
            found = glob.glob(pattern)
            if r.returncode or not found:
                tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no wheel"]
                raise PeerUnavailable(f"pip download {dist}=={version} failed: {tail[0]}")
    return found[0]


def source(key: str, member: str) -> str:
    with zipfile.ZipFile(wheel(key)) as z:
        try:
            return z.read(member).decode()
        except KeyError:
            raise PeerUnavailable(f"{member} is not in {os.path.basename(wheel(key))}") from None


def extract(key: str, members) -> str:
    """Extract files of the wheel under the cache; returns the root they sit under."""
    whl = wheel(key)
    root = os.path.join(cache_dir(), "src", os.path.basename(whl)[:-4])
    with zipfile.ZipFile(whl) as z:
        for m in members:
            path = os.path.join(root, m)
            if not os.path.exists(path):
                try:
                    data = z.read(m)
                except KeyError:
                    raise PeerUnavailable(f"{m} is not in {os.path.basename(whl)}") from None
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path + f".{os.getpid()}", "wb") as f:  # whole files only, even when
                    f.write(data)                                # workers race
                os.replace(path + f".{os.getpid()}", path)
    return root


# ----------------------------------------------------------------------------------------------
# signatures
# ----------------------------------------------------------------------------------------------

def _params(fn: ast.FunctionDef):
    """[(name, kind, default source)] of a function definition; kinds as inspect's names."""
    a = fn.args
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    out = [(p.arg, "POSITIONAL_OR_KEYWORD", None if d is None else ast.unparse(d))
           for p, d in zip(pos, defaults)]
    if a.vararg:
        out.append((a.vararg.arg, "VAR_POSITIONAL", None))
    out += [(p.arg, "KEYWORD_ONLY", None if d is None else ast.unparse(d))
            for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append((a.kwarg.arg, "VAR_KEYWORD", None))
    return [p for p in out if p[0] != "self"]


def peer_signature(key: str, member: str, qualname: str):
    """Parameters of ``qualname`` (``f`` or ``Class.f``; the last definition wins, so an
    ``@overload`` stub gives way to the implementation) in a peer file."""
    tree = ast.parse(source(key, member))
    *cls, name = qualname.split(".")
    body = tree.body
    if cls:
        owners = [n for n in body if isinstance(n, ast.ClassDef) and n.name == cls[0]]
        if not owners:
            raise PeerUnavailable(f"class {cls[0]} is not in {member}")
        body = owners[-1].body
    defs = [n for n in body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not defs:
        raise PeerUnavailable(f"{qualname} is not in {member}")
    return _params(defs[-1])


def our_signature(fn):
    """The same form for one of our functions, parsed from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return _params(tree.body[0])


# ----------------------------------------------------------------------------------------------
# the peers' Triton kernels, under stub runtimes
# ----------------------------------------------------------------------------------------------

class _Flags:
    """``envs.X.get()`` for any X: off (SGLang's environment flags)."""

    def __getattr__(self, name):
        return types.SimpleNamespace(get=lambda: False)


class _Logger(logging.LoggerAdapter):
    def debug_once(self, *a, **k):
        pass

    info_once = warning_once = debug_once


def _package(name):
    m = types.ModuleType(name)
    m.__path__ = []  # a stub package: an import that is not stubbed fails at once
    return m


@contextlib.contextmanager
def _stubbed(prefix, stubs):
    saved = {k: v for k, v in sys.modules.items() if k == prefix or k.startswith(prefix + ".")}
    for k in saved:
        del sys.modules[k]
    sys.modules.update(stubs)
    try:
        yield
    finally:
        for k in [k for k in sys.modules if k == prefix or k.startswith(prefix + ".")]:
            del sys.modules[k]
        sys.modules.update(saved)


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


_LOADED = {}


def sglang_ops():
    """SGLang's ``decode_attention`` and ``extend_attention`` modules (0.5.23)."""
    if "sglang" not in _LOADED:
        base = "sglang/kernels/ops/attention/"
        files = ["score_mod.py", "decode_attention.py", "extend_attention.py"]
        root = extract("sglang", [base + f for f in files])
        stubs = {n: _package(n) for n in ("sglang", "sglang.kernels", "sglang.kernels.ops",
                                          "sglang.kernels.ops.attention", "sglang.srt")}
        stubs["sglang.srt.environ"] = types.SimpleNamespace(envs=_Flags())
        no = lambda *a, **k: False  # noqa: E731
        stubs["sglang.srt.utils"] = types.SimpleNamespace(
            get_device_core_count=lambda *a: 1, is_gfx95_supported=no, is_gfx1250_supported=no,
            is_hip=no, is_cuda=lambda: torch.cuda.is_available())
        with _stubbed("sglang", stubs):
            mods = [_load("sglang.kernels.ops.attention." + f[:-3], os.path.join(root, base + f))
                    for f in files]
        _LOADED["sglang"] = types.SimpleNamespace(decode=mods[1], extend=mods[2])
    return _LOADED["sglang"]


def vllm_unified_attention():
    """vLLM's ``triton_unified_attention`` module (0.34.0)."""
    if "vllm" not in _LOADED:
        from pagedattn.compat.vllm import KVQuantMode
        import triton
        import triton.language as tl
        base = "vllm/v1/attention/ops/"
        files = ["triton_attention_helpers.py", "triton_unified_attention.py"]
        root = extract("vllm", [base + f for f in files])
        stubs = {n: _package(n) for n in ("vllm", "vllm.v1", "vllm.v1.attention",
                                          "vllm.v1.attention.ops")}
        no = lambda *a, **k: False  # noqa: E731
        platform = types.SimpleNamespace(fp8_dtype=lambda: torch.float8_e4m3fn, is_rocm=no,
                                         is_cuda=lambda: torch.cuda.is_available(),
                                         is_device_capability_family=no)
        stubs.update({
            "vllm.envs": types.SimpleNamespace(VLLM_BATCH_INVARIANT=False),
            "vllm.logger": types.SimpleNamespace(
                init_logger=lambda n: _Logger(logging.getLogger(n), {})),
            "vllm.platforms": types.SimpleNamespace(current_platform=platform),
            "vllm.triton_utils": types.SimpleNamespace(tl=tl, triton=triton),
            "vllm.v1.kv_cache_interface": types.SimpleNamespace(KVQuantMode=KVQuantMode),
        })
        with _stubbed("vllm", stubs):
            mods = [_load(base.replace("/", ".") + f[:-3], os.path.join(root, base + f))
                    for f in files]
        _LOADED["vllm"] = mods[1]
    return _LOADED["vllm"]
