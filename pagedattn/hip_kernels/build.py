"""JIT build of the HIP/CUDA kernels through torch.utils.cpp_extension, cached per user.

The csrc tree is copied into a writable per-user cache directory first (``~/.cache/pagedattn/
hip-<hash>``, or ``$PAGEDATTN_CACHE_DIR``), because on ROCm/DTK torch hipifies sources *next to
the originals* (HIP.md §1.3), and an install directory may be read-only. The hash covers the
sources, torch's version, the toolkit version and the target arch, so a stale build is never
loaded. The first build takes minutes (six kernel translation units compile in parallel);
later processes only re-link-check with ninja and load the library.

Build switches (environment, read at build time; each combination is its own cached build):

* ``PAGEDATTN_HIP_DECODE_PIPELINE=0``: NVIDIA decode falls back to the register-prefetch path
  (``-DPK_DECODE_PIPELINE=0``); default 1, the cp.async pipeline for 16-bit caches.
* ``PAGEDATTN_HIP_DECODE_STAGES=N``: attn_kernel's pipeline depth (``-DPK_DECODE_STAGES=N``;
  fp8 caches, groups > 16 and ``COLSPLIT=0``). Default 3 on sm_90/sm_100 (104 KB of shared
  memory per block, 2 blocks per SM), 2 elsewhere (70 KB: fits the 99 KB per-block limit of
  sm_86/89/120).
* ``PAGEDATTN_HIP_DECODE_CS_STAGES=N``: the column-split decode's depth (``-DPK_CS_STAGES=N``,
  16 KB per stage at D 128). Default 2: H200 session 7, faster than 3 on 14 of the 20 decode
  rows (1-3 %), 1-2 % slower on the two 32/32 (256, 2048) rows; 4 was slower.
* ``PAGEDATTN_HIP_DECODE_SWIZZLE=0``: the column split's K/V tiles keep padded rows (pitch
  D + 8) instead of XOR-swizzled 16-byte chunks. Padded rows made the L2 serve 1.5 sectors per
  DRAM sector (H200 session 7: 22 M vs 8.4 M L2 requests at (64, 4096) 32/8); the swizzle was
  8-10 % faster on every 32/8 block-16 row.
* ``PAGEDATTN_HIP_CP_ASYNC_L2=0|64|128|256``: L2 prefetch-size hint of the copies (default 0;
  256 measured no better on the H200).
* ``PAGEDATTN_HIP_DECODE_PIPE_SWIZZLE=0``: attn_kernel's pipeline (groups > 16, ``COLSPLIT=0``)
  keeps padded K/V rows instead of the column split's swizzled unpadded rows
  (``-DPK_DECODE_SWIZZLE=0``). The swizzle is the default at D 128 since session 8: 1-4 % faster
  on every 64/1 and 48/2 decode row of the H200 A/B, the 74 HIP decode tests passing under it
  (D 64 keeps padded rows: swizzled, its 2-row-tile form spilled).
* ``PAGEDATTN_HIP_DECODE_COLSPLIT=0``: groups of <= 16 heads run attn_kernel's pipeline instead
  of the column-split kernel (decode_cs.cuh, the default since session 6: 4 warps share 32-token
  tiles, 16 warps per SM; H200: 1-17 % faster on 32/8, level to +4 % on 32/32).
* ``PAGEDATTN_HIP_TIMELINE=1``: the column-split decode writes per-block %globaltimer stamps
  into ``hip_kernels.TIMELINE`` when that is set (``scripts/decode_timeline.py --backend hip``);
  unset, the stamps are compiled out.
* ``PAGEDATTN_HIP_DECODE_SMALL_TILE=1`` (with ``COLSPLIT=0``): those groups use 2-warp blocks on
  32-token tiles (52 KB, 4 blocks per SM) instead of 4 warps on 64. H200, session 5: correct,
  1-11 % faster on 10 of 12 A/B rows, 23 % slower at B1 L4096; off by default.
"""
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parent / "csrc"
KERNEL_TUS = [f"attn_{q}_{kv}.cu" for q in ("f16", "bf16") for kv in (q, "e4m3", "e5m2")]
SOURCES = ["bindings.cpp"] + KERNEL_TUS
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
        # DTK's patched cpp_extension only honours PYTORCH_ROCM_ARCH (HIP.md §5.2).
        return [f"--offload-arch={a}" for a in archs.replace(",", ";").split(";") if a], \
            {"PYTORCH_ROCM_ARCH": archs}
    mm = arch.split("_")[1]
    code = f"{mm}a" if mm == "90" else mm  # sm_90a on Hopper; the kernels need only sm_80+
    return [f"-gencode=arch=compute_{code},code=sm_{code}"], {}


BUILD_SWITCHES = {  # environment variable -> macro (NVIDIA decode pipeline; no-ops elsewhere)
    "PAGEDATTN_HIP_DECODE_PIPELINE": "PK_DECODE_PIPELINE",
    "PAGEDATTN_HIP_DECODE_STAGES": "PK_DECODE_STAGES",
    "PAGEDATTN_HIP_CP_ASYNC_L2": "PK_CP_ASYNC_L2",
    "PAGEDATTN_HIP_DECODE_SMALL_TILE": "PK_DECODE_SMALL_TILE",
    "PAGEDATTN_HIP_DECODE_COLSPLIT": "PK_DECODE_COLSPLIT",
    "PAGEDATTN_HIP_DECODE_SWIZZLE": "PK_CS_SWIZZLE",
    "PAGEDATTN_HIP_DECODE_CS_STAGES": "PK_CS_STAGES",
    "PAGEDATTN_HIP_DECODE_PIPE_SWIZZLE": "PK_DECODE_SWIZZLE",
    "PAGEDATTN_HIP_TIMELINE": "PK_TIMELINE",
}


def switch_flags():
    """-D flags for the build switches set in the environment (integers only)."""
    flags = []
    for env, macro in BUILD_SWITCHES.items():
        v = os.environ.get(env, "").strip()
        if not v:
            continue
        if not v.isdigit():
            raise ValueError(f"{env} must be a non-negative integer, got {v!r}")
        flags.append(f"-D{macro}={int(v)}")
    return flags


def cache_root() -> Path:
    env = os.environ.get("PAGEDATTN_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pagedattn"


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
    aflags = aflags + switch_flags()
    if not is_rocm() and "PAGEDATTN_HIP_DECODE_STAGES" not in os.environ and \
            arch not in ("sm_90", "sm_100", "sm_103"):
        aflags.append("-DPK_DECODE_STAGES=2")
    os.environ.update(env)
    tag = source_hash(aflags)
    root = cache_root() / f"hip-{tag}"
    src, build = root / "src", root / "build"
    root.mkdir(parents=True, exist_ok=True)
    _stage(src)
    build.mkdir(exist_ok=True)
    # torch's FileBaton leaves build/lock behind when a build is killed; every later load would
    # wait on it forever. A lock older than any real build is stale.
    lock = build / "lock"
    stale_s = float(os.environ.get("PAGEDATTN_HIP_STALE_LOCK_S", "1200"))
    if lock.exists() and time.time() - lock.stat().st_mtime > stale_s:
        print(f"pagedattn: removing stale build lock {lock}", file=sys.stderr, flush=True)
        lock.unlink(missing_ok=True)
    verbose = os.environ.get("PAGEDATTN_HIP_VERBOSE", "") not in ("", "0") if verbose is None else verbose
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
