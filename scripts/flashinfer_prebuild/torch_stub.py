# Minimal stand-in for torch, only so flashinfer.jit's gen_* functions can run on a
# CPU-only Python 3.12 without a real torch. dtypes are singleton named objects.
import sys, types
class dtype:
    def __init__(self, name): self.name = name
    def __repr__(self): return "torch." + self.name
_dt = {}
def _mk(n):
    if n not in _dt: _dt[n] = dtype(n)
    return _dt[n]
for _n in ["float16","bfloat16","float32","float64","int8","uint8","int16","int32","int64",
           "uint16","uint32","uint64","bool","float8_e4m3fn","float8_e5m2","float8_e8m0fnu",
           "float4_e2m1fn_x2","complex64","complex128"]:
    globals()[_n] = _mk(_n)
half = float16; float = float32; double = float64; int = int32; long = int64; short = int16
class Tensor: pass
class device:
    def __init__(self, *a, **k): pass
class _Version:
    cuda = "13.0"
    __version__ = "2.11.0"
version = _Version()
__version__ = "2.11.0"
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
class cuda:
    @staticmethod
    def device_count(): return 0
    @staticmethod
    def is_available(): return False
def __getattr__(name):
    raise AttributeError(f"torch stub has no attribute {name!r}")
