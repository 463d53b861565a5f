"""Registry of backends and the selection rule."""
import functools
import importlib
import os
from typing import List, NamedTuple

import torch

from pagedattn._triton import interpreter_enabled, triton_available

BACKENDS = {
    "torch": "pagedattn.torch_backend",
    "triton": "pagedattn.triton_kernels",
    "hip": "pagedattn.hip_kernels",
}


class Decision(NamedTuple):
    backend: str
    reasons: List[str]


@functools.lru_cache(maxsize=None)
def detect_arch(device_index: int = -1) -> str:
    """``gfx936``, ``sm_90``... for a GPU device, ``cpu`` otherwise."""
    if device_index < 0 or not torch.cuda.is_available():
        return "cpu"
    props = torch.cuda.get_device_properties(device_index)
    gcn = getattr(props, "gcnArchName", None)
    if gcn and getattr(torch.version, "hip", None):
        return gcn.split(":")[0]
    return f"sm_{props.major}{props.minor}"


def load(name: str):
    if name not in BACKENDS:
        raise ValueError(f"backend: expected one of {['auto', *BACKENDS]}, got {name!r}")
    return importlib.import_module(BACKENDS[name])


def _arch_of(facts) -> str:
    t = facts.get("q") if facts.get("q") is not None else facts.get("k_cache")
    if t is None or t.device.type != "cuda":
        return "cpu"
    return detect_arch(t.device.index if t.device.index is not None else 0)


def _candidates(arch: str) -> List[str]:
    if arch == "cpu":
        return ["triton", "torch"] if interpreter_enabled() and triton_available() else ["torch"]
    order = ["hip", "triton", "torch"] if arch.startswith("gfx") else ["triton", "hip", "torch"]
    return [b for b in order if b != "triton" or triton_available()]


def _reasons(name: str, op: str, facts) -> List[str]:
    try:
        mod = load(name)
    except ImportError as e:
        return [f"{name} backend unavailable: {e}"]
    return list(mod.supports(op, **facts))


def select(op: str, backend: str = "auto", **facts) -> Decision:
    """The backend for one call and why (pure apart from lazy imports)."""
    if backend == "auto":
        backend = os.environ.get("PAGEDATTN_BACKEND", "auto") or "auto"
    if backend != "auto":
        why = _reasons(backend, op, facts)
        if why:
            raise ValueError(f"backend {backend!r} cannot serve {op}: " + "; ".join(why))
        return Decision(backend, [f"{backend} forced"])
    arch = _arch_of(facts)
    notes = []
    for name in _candidates(arch):
        why = _reasons(name, op, facts)
        if not why:
            return Decision(name, notes + [f"{name}: first supported backend for {arch}"])
        notes.append(f"{name} skipped: " + "; ".join(why))
    raise ValueError(f"no backend can serve {op}: " + " | ".join(notes))


def resolve(op: str, backend: str = "auto", **facts):
    """(name, module) of the backend serving this call."""
    d = select(op, backend, **facts)
    return d.backend, load(d.backend)


def explain(op: str, backend: str = "auto", **facts) -> Decision:
    d = select(op, backend, **facts)
    print(f"{op}: {d.backend}\n  " + "\n  ".join(d.reasons))
    return d
