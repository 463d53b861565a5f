"""The ``triton`` backend: portable Triton kernels (CPU via TRITON_INTERPRET=1).

Each op lives in its own module (kernel helpers -> kernel -> launcher) and exposes
``unsupported(**facts) -> [reasons]`` and ``run(...)``; this file only routes, importing lazily so
that ``import pagedattn`` never needs triton.
"""
import importlib

from pagedattn._triton import interpreter_enabled, triton_available

_MODULES = {
    "paged_decode": "pagedattn.triton_kernels.decode",
    "extend_attention": "pagedattn.triton_kernels.extend",
    "store_kv": "pagedattn.triton_kernels.kv_store",
    "copy_blocks": "pagedattn.triton_kernels.block_copy",
}


_LOADED = {}


def _module(op):
    # NOTE: kernel modules are named apart from the ops (decode.py serves paged_decode):
    # importing a submodule binds its name on this package, which must not shadow a route.
    mod = _LOADED.get(op)
    if mod is None:
        mod = _LOADED[op] = importlib.import_module(_MODULES[op])
    return mod


def supports(op: str, **facts) -> list:
    """Reasons the Triton backend cannot serve this call ([] = it can)."""
    if op not in _MODULES:
        return [f"unknown op {op!r}"]
    if not triton_available():
        return ["triton is not installed"]
    t = facts.get("k_cache")
    if t is not None and t.device.type == "cpu" and not interpreter_enabled():
        return ["tensors are on the CPU and TRITON_INTERPRET is not set"]
    try:
        mod = _module(op)
    except ImportError as e:
        return [f"{op} kernel not available: {e}"]
    return list(mod.unsupported(**facts))


def paged_decode(call):
    return _module("paged_decode").run(call)


def extend_attention(call):
    return _module("extend_attention").run(call)


def store_kv(k, v, k_cache, v_cache, slot_mapping, **kw):
    return _module("store_kv").run(k, v, k_cache, v_cache, slot_mapping, **kw)


def copy_blocks(caches, block_mapping, **kw):
    return _module("copy_blocks").run(caches, block_mapping, **kw)

