# Minimal stand-in for the "flashinfer-jit-cache" package, so that FlashInfer 0.6.1
# (flashinfer/jit/env.py: _get_aot_dir) uses ./jit_cache/<uri>/<uri>.so as its AOT dir.
# A JitSpec whose <uri>.so exists there is loaded directly with tvm_ffi.load_module:
# no ninja, no nvcc, no mtime checks (flashinfer/jit/core.py: JitSpec.build_and_load).
# Put the directory that CONTAINS this package on PYTHONPATH.
import pathlib

__version__ = "0.6.1+local.sm90a"  # env.py only checks startswith(flashinfer.__version__)


def get_jit_cache_dir() -> str:
    return str(pathlib.Path(__file__).resolve().parent / "jit_cache")
