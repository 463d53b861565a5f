"""Entry points shaped like the attention APIs engines already call, over pagedattn's ops.

* :mod:`pagedattn.compat.flashinfer`: ``BatchDecodeWithPagedKVCacheWrapper`` and
  ``BatchPrefillWithPagedKVCacheWrapper`` (plan/run), as in flashinfer-python 0.7.4;
* :mod:`pagedattn.compat.sglang`: ``decode_attention_fwd`` and ``extend_attention_fwd``, SGLang's
  Triton ops, as in sglang 0.5.23;
* :mod:`pagedattn.compat.vllm`: ``unified_attention`` (vLLM's Triton backend, vllm 0.34.0) and the
  legacy ``paged_attention_v1`` / ``paged_attention_v2`` (vllm 0.24.0, their last release).

Each keeps the peer's argument names, order and defaults and runs pagedattn's public ops with
``backend="auto"``, so dispatch, validation and the kernels' bounds guards apply. An argument
the wrapper cannot honour raises ``NotImplementedError`` naming it; docs/compat.md lists every
argument of every entry point as honoured, accepted and unused, or refused.

Import the submodule you need (``from pagedattn.compat import sglang``); nothing of the peers is
imported or required.
"""
__all__ = ["flashinfer", "sglang", "vllm"]
