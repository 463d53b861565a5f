"""JIT build of the HIP/CUDA kernels through torch.utils.cpp_extension, cached per user.

The csrc tree is copied into a writable per-user cache directory first (``~/.cache/pagedattn/
hip-<hash>``, or ``PAGEDATTN_CACHE_DIR``), because on ROCm/DTK torch hipifies sources *next to
the originals*, and an install directory may be read-only. The hash covers the sources, torch's
version, the toolkit version and the compile flags (which name the target arch), so a stale
build is never loaded. The first build takes minutes (six kernel translation units compile in
parallel); later processes only re-link-check with ninja and load the library.

One build per arch: NVIDIA archs other than sm_90/sm_100/sm_103 get ``-DPK_DECODE_STAGES=2``
(attn_cfg.h: the 3-stage decode pipeline needs 104 KB of shared memory per block).
``PAGEDATTN_HIP_VERBOSE=1`` prints the compiler's output.
"""
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from pagedattn import config

CSRC = Path(__file__).resolve().parent / "csrc"
KERNEL_TUS = [f"attn_{q}_{kv}.cu" for q in ("f16", "bf16") for kv in (q, "e4m3", "e5m2")]
SOURCES = ["bindings.cpp", "mma_probe.cu"] + KERNEL_TUS
HYGON_ARCHS = {"gfx926", "gfx928", "gfx936", "gfx938", "gfx92a", "gfx946", "gfx948"}

_loaded = None


def is_rocm() -> bool:
    return getattr(torch.version, "hip", None) is not None


def device_arch(index: int = None) -> str:
    """``sm_90`` / ``gfx942`` of the current (or given) device."""
    index = torch.cuda.current_device() if index is None else index
    p = torch.cuda.get_device_properties(index)
    if is_rocm():
        return getattr(p, "gcnArchName", "").split(":")[0]
    return f"sm_{p.major}{p.minor}"


def arch_flags(arch: str):
    """(nvcc/hipcc flags, env) selecting exactly the device's arch."""
    if is_rocm():
        archs = os.environ.get("PYTORCH_ROCM_ARCH") or arch
        # DTK's patched cpp_extension honours only PYTORCH_ROCM_ARCH, not --offload-arch.
        return [f"--offload-arch={a}" for a in archs.replace(",", ";").split(";") if a], \
            {"PYTORCH_ROCM_ARCH": archs}
    mm = arch.split("_")[1]
    code = f"{mm}a" if mm == "90" else mm  # sm_90a on Hopper; the kernels need only sm_80+
    return [f"-gencode=arch=compute_{code},code=sm_{code}"], {}


# A build lock older than any real build was left by a killed build (torch's FileBaton).
STALE_LOCK_S = 1200.0


def pipeline_flags(arch: str):
    """-D flags the device arch implies (NVIDIA decode pipeline depth)."""
    if is_rocm() or arch in ("sm_90", "sm_100", "sm_103"):
        return []
    return ["-DPK_DECODE_STAGES=2"]


def source_hash(flags) -> str:
    h = hashlib.sha256()
    for f in sorted(CSRC.glob("*")):
        if f.is_file():
            h.update(f.name.encode())
            h.update(f.read_bytes())
    h.update(torch.__version__.encode())
    h.update(str(torch.version.cuda or torch.version.hip).encode())
    h.update(" ".join(flags).encode())
    return h.hexdigest()[:16]


def _stage(src_dir: Path) -> None:
    """Copy csrc into the cache (atomically: a half-copied tree is never used)."""
    if (src_dir / ".complete").exists():
        return
    tmp = src_dir.with_name(src_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(CSRC, tmp, ignore=shutil.ignore_patterns("compile_check"))
    (tmp / ".complete").touch()
    try:
        tmp.rename(src_dir)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)


def load(verbose: bool = None):
    """Build (first time) and load the extension; returns torch.ops.pagedattn_hip."""
    global _loaded
    if _loaded is not None:
        return _loaded
    from torch.utils import cpp_extension

    arch = device_arch()
    aflags, env = arch_flags(arch)
    aflags = aflags + pipeline_flags(arch)
    os.environ.update(env)
    tag = source_hash(aflags)
    root = Path(config.cache_dir()) / f"hip-{tag}"
    src, build = root / "src", root / "build"
    root.mkdir(parents=True, exist_ok=True)
    _stage(src)
    build.mkdir(exist_ok=True)
    # torch's FileBaton leaves build/lock behind when a build is killed; every later load would
    # wait on it forever. A lock older than any real build is stale.
    lock = build / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
        print(f"pagedattn: removing stale build lock {lock}", file=sys.stderr, flush=True)
        lock.unlink(missing_ok=True)
    verbose = config.get("PAGEDATTN_HIP_VERBOSE") if verbose is None else verbose
    common = ["-O3", "-std=c++17"]
    cuda_flags = common + aflags + ([] if is_rocm() else ["--expt-relaxed-constexpr"])
    fresh = not any(build.glob("*.so"))
    t0 = time.time()
    if fresh:
        print(f"pagedattn: building the hip backend for {arch} in {root} (first use: minutes)",
              file=sys.stderr, flush=True)
    cpp_extension.load(name=f"pagedattn_hip_{tag}", sources=[str(src / s) for s in SOURCES],
                       extra_cflags=common, extra_cuda_cflags=cuda_flags,
                       extra_include_paths=[str(src)], build_directory=str(build),
                       is_python_module=False, verbose=verbose)
    if fresh:
        print(f"pagedattn: hip backend built in {time.time() - t0:.1f} s", file=sys.stderr,
              flush=True)
    _loaded = torch.ops.pagedattn_hip
    return _loaded
