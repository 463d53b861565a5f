# Import flashinfer.jit without running flashinfer/__init__.py (which needs real torch+CUDA).
import sys, types, importlib.util
spec = importlib.util.find_spec("flashinfer")
pkg = types.ModuleType("flashinfer")
pkg.__path__ = list(spec.submodule_search_locations)
pkg.__file__ = spec.origin
sys.modules["flashinfer"] = pkg
import flashinfer.jit as jit
from flashinfer.jit import env as jit_env
