"""Backend selection: ``resolve`` for the public ops, ``explain`` for people.

Backends are modules exposing ``supports(op, **facts) -> [reasons it cannot]`` and the op
functions; they are imported lazily. ``PAGEDATTN_BACKEND`` or ``backend=`` forces one; a forced
backend that cannot serve the call raises ``ValueError`` with the reasons (never a fallback).
"""
from pagedattn.dispatch.core import BACKENDS, Decision, detect_arch, explain, resolve, select

__all__ = ["BACKENDS", "Decision", "detect_arch", "explain", "resolve", "select"]
