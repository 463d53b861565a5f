"""Lazy access to triton: it is not a hard dependency (ROCm/DCU torch builds bring their own)."""
import functools
import os


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def require_triton():
    """Import triton or raise an ImportError that says which package to install."""
    try:
        import triton
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError(
            "pagedattn's Triton backend needs the `triton` module. On CUDA: `pip install triton`; "
            "on ROCm/DCU it comes with torch as `pytorch-triton-rocm` (do not install PyPI's "
            "triton there)."
        ) from e
    return triton


def interpreter_enabled() -> bool:
    """True when Triton kernels run on the CPU through TRITON_INTERPRET=1."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def next_pow2(n: int) -> int:
    """The smallest power of 2 >= n, for n >= 1 (``triton.next_power_of_2``, without importing
    triton): the host-side tile sizing of the decode and extend launchers."""
    return 1 << max(0, (int(n) - 1).bit_length())
