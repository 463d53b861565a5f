"""Compile-only checks of the HIP/CUDA kernel sources with the compilers on this machine.

No GPU and no torch headers: the kernels live in torch-free headers and
csrc/compile_check/check_kernels.cu instantiates them. Each check compiles real
device code for one target and skips, with the reason, when its compiler is missing:

* nvcc (CUDA 13) for sm_80 and sm_90a (the 16-bit decode instantiations must not spill);
* the Hygon MMAC branch, compiled for syntax through compile_check/mmac_shim.h on gfx90a: no
  compiler here knows gfx936, so this proves the MMAC code path type-checks, not that it runs.

The AMD tier proper (the hipified TUs for gfx90a and gfx942 with device libraries, resource
limits, the MMAC builtin selection, bindings.cpp through cpp_extension) is
tests/test_hip_compile_amd.py.

CI installs hipcc and clang-19 best-effort (.ci/run). Each check takes < 60 s on 2 cores.
"""
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.compile

CSRC = Path(__file__).resolve().parents[1] / "pagedattn" / "hip_kernels" / "csrc"
CHECK = CSRC / "compile_check" / "check_kernels.cu"
SHIM = CSRC / "compile_check" / "mmac_shim.h"
# torch's own flags for extensions: half operators off on both sides.
CUDA_DEFS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
             "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]
HIP_DEFS = ["-D__HIP_PLATFORM_AMD__=1", "-DUSE_ROCM=1", "-D__HIP_NO_HALF_OPERATORS__=1",
            "-D__HIP_NO_HALF_CONVERSIONS__=1"]


def _find(*names):
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    return None


def _run(cmd, out: Path, env=None, timeout=600):
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    dt = time.time() - t0
    print(f"\n$ {' '.join(map(str, cmd))}\n  ({dt:.1f} s, rc {r.returncode})")
    assert r.returncode == 0, f"compile failed ({dt:.1f} s):\n{r.stderr[-6000:]}"
    assert out.exists() and out.stat().st_size > 0, "no output produced"
    return r, dt


NVCC = _find("nvcc", "/usr/local/cuda/bin/nvcc")
HIPCC = _find("hipcc")


def _ptxas_entries(stderr: str):
    """{mangled entry name: (registers, spill store bytes)} from `-Xptxas -v` output."""
    out = {}
    for chunk in stderr.split("Compiling entry function '")[1:]:
        name = chunk.split("'", 1)[0]
        regs = re.search(r"Used (\d+) registers", chunk)
        spill = re.search(r"(\d+) bytes spill stores", chunk)
        out[name] = (int(regs.group(1)) if regs else -1, int(spill.group(1)) if spill else 0)
    return out


# 16-bit-cache decode instantiations (f16 q, f16 KV) on NVIDIA, per (head dim, V layout):
# attn_kernel's cp.async pipeline (Mode 0; 2 and 4 row tiles) and the column-split kernel (groups
# <= 16; its merging and parking forms): 16.
DECODE16 = re.compile(r"AttnCfgINS_3f16ES2_Li\d+ELi\d+ELb[01]ELNS_4ModeE0E|DecodeCsCfgINS_3f16E")


def _nvcc(arch, tmp_path, *extra):
    code = arch.split("_")[1]
    out = tmp_path / "check.o"
    r, _ = _run([NVCC, "-std=c++17", "-O3", "--expt-relaxed-constexpr", *CUDA_DEFS, *extra,
                 f"-gencode=arch=compute_{code},code={arch}", "-Xptxas", "-v", "-c",
                 str(CHECK), "-o", str(out)], out)
    return r


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_nvcc(arch, tmp_path):
    r = _nvcc(arch, tmp_path)
    assert "mma" not in r.stderr.lower() or "error" not in r.stderr.lower()
    decode = {n: v for n, v in _ptxas_entries(r.stderr).items() if DECODE16.search(n)}
    assert len(decode) == 16, f"expected 16 f16 decode instantiations, got {sorted(decode)}"
    # The pipelined decode keeps no register staging: no spills, and at most 255 registers
    # (2 blocks of 128 threads per SM at D 128).
    spilled = {n: v for n, v in decode.items() if v[1] > 0}
    assert not spilled, f"decode instantiations spill: {spilled}"


def _hipcc_cmd(tmp_path, *extra):
    out = tmp_path / "check.o"
    return [HIPCC, "-x", "hip", "--offload-arch=gfx90a", "-O3", "-std=c++17", *HIP_DEFS, *extra,
            "--cuda-device-only", "-S", "-o", str(out), str(CHECK)], out


@pytest.mark.skipif(HIPCC is None, reason="hipcc not found (apt-get install hipcc libamdhip64-dev)")
def test_hygon_mmac_syntax_via_shim(tmp_path):
    """Syntax check only: the MMAC branch (gfx928/936/938) with its builtins emulated by MFMA."""
    cmd, out = _hipcc_cmd(tmp_path, "-DPK_CHECK_ONE", "-include", str(SHIM))
    _run(cmd, out, env={"HIP_PLATFORM": "amd"})
    assert "v_mfma" in out.read_text()


def test_hygon_code_is_guarded_by_arch_macros():
    """Every Hygon-only builtin sits under an #if (`if constexpr` does not hide unknown builtins
    from upstream clang)."""
    text = (CSRC / "pk_mma.h").read_text()
    for name in ("__builtin_hcu_mmac", "__builtin_amdgcn_mmac"):
        for line in (ln for ln in text.splitlines() if name in ln):
            assert line.lstrip().startswith("#"), f"unguarded Hygon builtin: {line}"
    port = (CSRC / "pk_port.h").read_text()
    assert "defined(__gfx936__)" in port and "#error" in port
    assert "__has_builtin(__builtin_hcu" not in text and "__has_builtin(__builtin_amdgcn_mmac" \
        not in text, "MMAC builtins are chosen by arch, not by __has_builtin"


def test_decode_launch_shape_arguments():
    """Bad launch-shape requests to hip_kernels.decode_raw are refused before any launch."""
    from pagedattn import hip_kernels as H
    with pytest.raises(ValueError, match="mode"):
        H.decode_raw(None, None, None, None, None, None, mode="fast")
    with pytest.raises(ValueError, match="parts_per_block"):
        H.decode_raw(None, None, None, None, None, None, parts_per_block=0)


def test_mma_probe_argument_errors():
    """mma_probe refuses bad tiles with typed errors, and CPU tensors with HipUnavailableError
    (no device to build for)."""
    import torch
    from pagedattn import hip_kernels as H
    a = torch.zeros(16, 16, dtype=torch.float16)
    with pytest.raises(TypeError, match="a: expected float16 or bfloat16"):
        H.mma_probe(a.float(), a)
    with pytest.raises(ValueError, match=r"b: expected shape \(16, 16\)"):
        H.mma_probe(a, a[:8])
    with pytest.raises(ValueError, match="b: expected a's dtype"):
        H.mma_probe(a, a.bfloat16())
    with pytest.raises(H.HipUnavailableError, match="CUDA/ROCm device"):
        H.mma_probe(a, a)


def test_no_hip_environment_knobs():
    """The hip backend reads no PAGEDATTN_* variable except through pagedattn.config."""
    pkg = CSRC.parent
    for f in list(pkg.glob("*.py")) + list(CSRC.rglob("*.[ch]*")):
        text = f.read_text()
        for name in ("os.environ", "getenv"):
            hits = [ln for ln in text.splitlines() if name in ln and "PAGEDATTN_" in ln]
            assert not hits, f"{f.name} reads PAGEDATTN_* directly: {hits}"
