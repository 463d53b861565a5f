"""The AMD compile tier: the real HIP kernels as a ROCm build compiles them, with limits.

A ROCm torch build hipifies the staged csrc tree and compiles the ``.hip`` copies
(hip_kernels/build.py). Here the same hipify step (torch.utils.hipify, as cpp_extension calls
it) runs on a staged copy, and the copies are compiled, device side, with the device libraries:

* gfx90a: Debian hipcc 5.2.3 (clang 15) and its rocm-device-libs;
* gfx942: clang-19 with the same rocm-device-libs. Debian's set stops at isa_version_940, so an
  ``oclc_isa_version_942.bc`` (one constant, __oclc_ISA_version = 9402) is generated beside
  links to the others.

Every kernel must use no scratch (no spills, no private arrays in memory) and at most 64 KB of
LDS per block; the attention TUs must use MFMA and 128-bit buffer loads. The Hygon MMAC
builtins cannot be compiled here (no compiler knows gfx928/936/938): their selection by arch is
checked on the preprocessed source. bindings.cpp goes through torch.utils.cpp_extension's real
ninja build with nvcc (CUDA_HOME pointed at the local toolkit); with the CPU torch wheel the
final link cannot find libc10_cuda / libtorch_cuda, so the test stops at the objects. A ROCm
build of bindings.cpp needs ROCm torch headers (c10/hip), which no wheel here provides.
Each check skips, with the reason, when its compiler is missing.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.compile

CSRC = Path(__file__).resolve().parents[1] / "pagedattn" / "hip_kernels" / "csrc"
BITCODE = Path("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode")
HIPCC, CLANG19, NVCC = (shutil.which(n) for n in ("hipcc", "clang-19", "nvcc"))
# torch 2.13's cpp_extension flags for a ROCm build (COMMON_HIP_FLAGS + COMMON_HIPCC_FLAGS)
HIP_FLAGS = ["-fPIC", "-D__HIP_PLATFORM_AMD__=1", "-DUSE_ROCM=1", "-DHIPBLAS_V2",
             "-DCUDA_HAS_FP16=1", "-D__HIP_NO_HALF_OPERATORS__=1",
             "-D__HIP_NO_HALF_CONVERSIONS__=1", "-DHIP_ENABLE_WARP_SYNC_BUILTINS=1",
             "-O3", "-std=c++17"]
# One TU per kernel family: 16-bit decode + extend (fp16, bf16), fp8 decode, the probe.
TUS = ["attn_f16_f16", "attn_bf16_bf16", "attn_bf16_e5m2", "mma_probe"]
LDS_LIMIT = 64 * 1024
ISA_942 = """target triple = "amdgcn-amd-amdhsa"
@__oclc_ISA_version = linkonce_odr protected local_unnamed_addr addrspace(4) constant i32 9402, align 4
"""


@pytest.fixture(scope="module")
def hipified(tmp_path_factory):
    """The csrc tree staged and hipified as cpp_extension does on ROCm: {tu: path of .hip}."""
    hipify_python = pytest.importorskip("torch.utils.hipify.hipify_python")
    root = tmp_path_factory.mktemp("rocm")
    src = root / "src"
    shutil.copytree(CSRC, src, ignore=shutil.ignore_patterns("compile_check"))
    (root / "build").mkdir()
    files = [str(src / f"{t}.cu") for t in TUS] + [str(src / "bindings.cpp")]
    res = hipify_python.hipify(project_directory=str(root / "build"),
                               output_directory=str(root / "build"),
                               header_include_dirs=[str(src)], extra_files=files, ignores=[],
                               show_detailed=False, show_progress=False,
                               is_pytorch_extension=True)
    out = {t: Path(res[str(src / f"{t}.cu")].hipified_path) for t in TUS}
    assert all(p.suffix == ".hip" and p.exists() for p in out.values()), out
    return out


@pytest.fixture(scope="module")
def bitcode_942(tmp_path_factory):
    if CLANG19 is None:
        pytest.skip("clang-19 not found (apt-get install clang-19)")
    if not (BITCODE / "ocml.bc").exists():
        pytest.skip("rocm-device-libs not found (apt-get install rocm-device-libs)")
    d = tmp_path_factory.mktemp("bitcode")
    for f in BITCODE.glob("*.bc"):
        os.symlink(f, d / f.name)
    (d / "isa942.ll").write_text(ISA_942)
    subprocess.run([CLANG19, "-x", "ir", "--target=amdgcn-amd-amdhsa", "-nogpulib", "-c",
                    "-emit-llvm", str(d / "isa942.ll"), "-o", str(d / "oclc_isa_version_942.bc")],
                   check=True, capture_output=True)
    return d


def _resources(stderr: str):
    """{kernel: {remark: value}} from -Rpass-analysis=kernel-resource-usage."""
    out, cur = {}, None
    for line in stderr.splitlines():
        m = re.search(r"remark: Function Name: (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), {})
            continue
        m = re.search(r"remark:\s+([A-Za-z ]+?)(?: \[[\w/]+\])?: (\S+) \[", line)
        if m and cur is not None:
            cur[m.group(1).strip()] = m.group(2)
    return out


def _compile_amd(arch, hip_file: Path, bitcode=None):
    asm = hip_file.with_suffix(f".{arch}.s")
    if arch == "gfx90a":
        cmd, env = [HIPCC], {**os.environ, "HIP_PLATFORM": "amd"}
    else:
        cmd, env = [CLANG19, f"--rocm-device-lib-path={bitcode}"], None
    cmd += ["-x", "hip", f"--offload-arch={arch}", *HIP_FLAGS, "-I", str(hip_file.parent),
            "--cuda-device-only", "-S", "-Rpass-analysis=kernel-resource-usage", str(hip_file),
            "-o", str(asm)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-6000:]}"
    return _resources(r.stderr), asm.read_text()


@pytest.mark.parametrize("tu", TUS)
@pytest.mark.parametrize("arch", ["gfx90a", "gfx942"])
def test_amd_kernels_fit(arch, tu, hipified, request):
    if arch == "gfx90a" and HIPCC is None:
        pytest.skip("hipcc not found (apt-get install hipcc libamdhip64-dev rocm-device-libs)")
    bitcode = request.getfixturevalue("bitcode_942") if arch == "gfx942" else None
    res, asm = _compile_amd(arch, hipified[tu], bitcode)
    assert res, "no kernel resource remarks"
    want = {"mma_probe": 2, "attn_bf16_e5m2": 14}.get(tu, 16)  # kernels in the TU
    assert len(res) == want, sorted(res)
    for name, r in res.items():
        assert r.get("ScratchSize") == "0", f"{name}: scratch {r.get('ScratchSize')} B/lane"
        assert r.get("VGPRs Spill") == "0", f"{name}: {r.get('VGPRs Spill')} VGPRs spilled"
        assert int(r["LDS Size"]) <= LDS_LIMIT, f"{name}: LDS {r['LDS Size']} B > 64 KB"
        assert r.get("Dynamic Stack", "False") == "False", f"{name}: dynamic stack (calls)"
    assert "v_mfma_f32_16x16x16" in asm, "no MFMA instruction"
    if tu != "mma_probe":
        assert "buffer_load_dwordx4" in asm, "KV loads are not 128-bit buffer loads"


# Hygon arch -> the builtins pk_mma.h must call there (pk_port.h selector).
MMAC = {"gfx936": ("__builtin_amdgcn_mmac_f32_16x16x16f16(x, y, c)",
                   "__builtin_amdgcn_mmac_f32_16x16x16bf16(x, y, c)"),
        "gfx938": ("__builtin_hcu_mmac_f32_16x16x16_f16_lit_lts(x, y, c, false, false)",
                   "__builtin_hcu_mmac_f32_16x16x16_bf16_lit_lts(x, y, c, false, false)")}
MMAC["gfx928"], MMAC["gfx92a"], MMAC["gfx946"] = MMAC["gfx936"], MMAC["gfx938"], MMAC["gfx938"]


@pytest.mark.skipif(CLANG19 is None, reason="clang-19 not found (apt-get install clang-19)")
@pytest.mark.parametrize("arch", sorted(MMAC))
def test_mmac_builtins_chosen_by_arch(arch):
    """The device pass for a Hygon arch expands mma_nt to that arch's MMAC builtins, with the
    lit/lts flags explicit (preprocessed only: upstream clang does not know these targets)."""
    r = subprocess.run([CLANG19, "-x", "hip", "--offload-arch=gfx90a", "--cuda-device-only",
                        "-nogpulib", "-E", "-std=c++17", "-D__HIP_PLATFORM_AMD__=1",
                        "-U__gfx90a__", f"-D__{arch}__", "-I", str(CSRC),
                        str(CSRC / "mma_probe.cu"), "-o", "-"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    found = set(re.findall(r"__builtin_\w*mmac\w*\([^;]*\)", r.stderr + r.stdout))
    assert found == set(MMAC[arch]), found
    assert "__has_builtin(__builtin_hcu" not in (CSRC / "pk_mma.h").read_text()


def _cuda_home():
    for d in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if d and (Path(d) / "include" / "cuda_runtime_api.h").exists():
            return d
    return None


@pytest.mark.skipif(NVCC is None or _cuda_home() is None, reason="no CUDA toolkit (nvcc)")
def test_bindings_build_through_cpp_extension(tmp_path):
    """bindings.cpp and a kernel TU compile through torch.utils.cpp_extension.load's ninja
    build (torch's own flags and include paths); only the link against the CUDA torch
    libraries, absent from the CPU wheel, fails."""
    from torch.utils import cpp_extension
    src, build, shim = tmp_path / "src", tmp_path / "build", tmp_path / "shim"
    shutil.copytree(CSRC, src, ignore=shutil.ignore_patterns("compile_check"))
    build.mkdir()
    # Generated when torch is built with CUDA; the CPU wheel lacks it.
    (shim / "c10" / "cuda" / "impl").mkdir(parents=True)
    (shim / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text(
        "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    old = cpp_extension.CUDA_HOME
    cpp_extension.CUDA_HOME = _cuda_home()  # None with a CPU torch
    try:
        with pytest.raises(RuntimeError) as e:
            cpp_extension.load(name="pk_bindings_check",
                               sources=[str(src / "bindings.cpp"), str(src / "mma_probe.cu")],
                               extra_include_paths=[str(src), str(shim)],
                               extra_cflags=["-O3", "-std=c++17"],
                               extra_cuda_cflags=["-O3", "-std=c++17", "--expt-relaxed-constexpr",
                                                  "-gencode=arch=compute_90a,code=sm_90a"],
                               build_directory=str(build), is_python_module=False)
    finally:
        cpp_extension.CUDA_HOME = old
    assert (build / "bindings.o").exists() and (build / "mma_probe.cuda.o").exists(), str(e.value)
    assert "c10_cuda" in str(e.value) or "torch_cuda" in str(e.value), str(e.value)[-3000:]
