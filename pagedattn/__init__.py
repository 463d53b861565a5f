"""pagedattn: paged decode and extend (prefix-prefill) attention for LLM serving.

Public ops pick a backend (``torch`` reference, ``triton``, ``hip``) per call; see
``pagedattn.dispatch.explain``. KV layouts are documented in ``docs/layout.md``.
"""
__version__ = "0.1.0"

from pagedattn.layouts import LAYOUTS, make_kv_cache, make_mla_cache  # noqa: E402
from pagedattn.api import copy_blocks, extend_attention, paged_decode, store_kv  # noqa: E402
from pagedattn.plan import DecodePlan, plan_decode, run_decode  # noqa: E402
from pagedattn import dispatch  # noqa: E402

__all__ = [
    "__version__",
    "LAYOUTS",
    "make_kv_cache",
    "make_mla_cache",
    "paged_decode",
    "extend_attention",
    "store_kv",
    "copy_blocks",
    "DecodePlan",
    "plan_decode",
    "run_decode",
    "dispatch",
]
