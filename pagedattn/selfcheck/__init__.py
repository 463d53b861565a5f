"""``python -m pagedattn.selfcheck``: the first-run check of the backends on this device.

For each backend that can run here (torch always; Triton on a GPU, or on the CPU under the
interpreter; HIP where its extension builds for the device):

* a layout probe: known integer tiles through the matrix unit (``tl.dot``; the HIP kernels'
  ``mma_nt`` via ``hip_kernels.mma_probe``), compared exactly with torch, so that a wrong
  MMAC/MFMA operand layout is told apart from a wrong kernel;
* small cases of ``paged_decode``, ``extend_attention``, ``store_kv`` and ``copy_blocks`` over
  every layout, fp16, bf16 and fp8 KV where the backend and device support them, against the
  float32 reference.

It prints a table and writes a verification record (:mod:`pagedattn.selfcheck.record`) that
dispatch reads: a backend that passed an op here becomes eligible for ``auto``; one that failed
is excluded, and ``pagedattn.dispatch.explain`` says why (docs/dispatch.md).

Examples
--------
>>> from pagedattn import selfcheck
>>> report = selfcheck.run(backends=("torch",), write=False, log=lambda line: None)
>>> report.ok
True
"""


def run(*args, **kwargs):
    """:func:`pagedattn.selfcheck.runner.run` (imported on first use)."""
    from pagedattn.selfcheck.runner import run as _run
    return _run(*args, **kwargs)


__all__ = ["run"]
