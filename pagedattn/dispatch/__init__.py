"""Backend selection: ``resolve`` for the public ops, ``explain`` for people (docs/dispatch.md).

Backends are modules exposing ``supports(op, **facts) -> [reasons it cannot]`` and the op
functions, imported lazily; their declared capabilities live in ``capabilities`` as data.
``select(op, arch, **plain facts)`` is the pure, cached decision; ``PAGEDATTN_BACKEND`` or
``backend=`` forces a backend, and a forced backend that cannot serve the call raises
``ValueError`` with the reasons (never a fallback).
"""
from pagedattn.dispatch.arch import (ARCH_FACTS, ArchFacts, arch_facts, detect_arch,
                                     device_facts)
from pagedattn.dispatch.capabilities import CAPS, FEATURES, OPS, unsupported
from pagedattn.dispatch.core import (BACKENDS, PREFERENCE, Decision, cache_clear, call_facts,
                                     generation, load, partition_size_for, preference, register,
                                     resolve, resolve_decision, reuse_kv_times, select)
from pagedattn.dispatch.explain import explain

__all__ = ["ARCH_FACTS", "ArchFacts", "BACKENDS", "CAPS", "Decision", "FEATURES", "OPS",
           "PREFERENCE", "arch_facts", "cache_clear", "call_facts", "detect_arch",
           "device_facts", "explain", "generation", "load", "partition_size_for", "preference",
           "register", "resolve", "resolve_decision", "reuse_kv_times", "select", "unsupported"]
