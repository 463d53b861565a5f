"""Device arch detection (once per device) and the per-arch facts table the selector reads.

The arch string is the one thing dispatch needs from the device: ``gfx936`` (ROCm/DTK
``gcnArchName`` without its feature suffix), ``sm_90`` (CUDA compute capability) or ``cpu``.
Everything else comes from :data:`ARCH_FACTS`, so selection stays a pure function of strings.
"""
import functools
from typing import NamedTuple, Optional, Tuple

import torch

# Hygon DCU arch names (from Hygon's DTK tooling): Kongming gfx926/928, Bowen
# gfx936/938, Yueying gfx92a, Shaobo gfx946, gfx948. Every other gfx is AMD.
HYGON_ARCHS = frozenset({"gfx926", "gfx928", "gfx936", "gfx938", "gfx92a", "gfx946", "gfx948"})

_F16 = (torch.float16, torch.bfloat16, torch.float32)


class ArchFacts(NamedTuple):
    """What one arch family offers the kernels."""

    arch: str
    vendor: str  # "amd" | "hygon" | "nvidia" | "cpu" | "unknown"
    wave_size: int  # lanes per wave/warp (0 on cpu)
    matrix_unit: str  # "MFMA" | "MMAC" | "MMA" | "WGMMA" | "tcgen05" | "none"
    smem_per_block: int  # bytes of LDS / shared memory one block may use (opt-in maximum)
    num_cus: int  # CUs / SMs of the flagship part; replaced by the real count per device
    fp8: Tuple[str, ...]  # fp8 KV formats the GPU backends can read: "e4m3", "e5m2"
    hip_built: bool  # the HIP backend's default build targets this arch
    dtypes: tuple = _F16  # compute dtypes the GPU backends give correct results in


KB = 1024

# One row per arch the project knows. Why each value:
# * wave_size: gfx9 (AMD CDNA and every Hygon DCU) is wave64; NVIDIA warps are 32.
# * matrix_unit: what the HIP kernels' mma_nt lowers to (docs/hip.md, "Matrix unit by arch").
#   sm_90 has WGMMA (Triton uses it; our HIP kernels use mma.sync there); sm_100 has tcgen05
#   (UMMA).
# * smem_per_block: LDS is 64 KB on gfx90a/942/928/936/938, 128 KB on gfx946, 160 KB on gfx950
#   (the vendors' ISA guides); NVIDIA opt-in maxima: 163 KB sm_80, 99 KB sm_86/89, 227 KB sm_90/100.
# * num_cus: MI250X GCD 110, MI300X 304, MI355X 256, Hygon 928/936/938 = 128/88/72
#   (aiter-das chip_info), A100 108, A40 84, L40S 142, H100/H200 132, B200 148.
# * fp8: gfx936 reads e5m2 only; gfx938 and gfx942 read e4m3 too (gfx942's units use the FNUZ
#   variants; the kernels convert OCP bits on load); gfx950 has OCP fp8. On NVIDIA, Triton's
#   e4m3 (fp8e4nv) conversion needs sm_89+, while e5m2 (the top byte of an fp16) converts
#   anywhere, so sm_80/86 and gfx90a get e5m2 only.
# * hip_built: PYTORCH_ROCM_ARCH="gfx90a;gfx942", DTK's default "gfx928;gfx936;gfx938", and
#   TORCH_CUDA_ARCH_LIST="8.0;9.0" (sm_80 cubins also run on sm_86/89). gfx950 and sm_100 are
#   not targets (docs/hip.md, "Building and running"; sm_90 cubins do not run on sm_100), nor
#   gfx92a/946 (not in DTK's default list).
ARCH_FACTS = {f.arch: f for f in (
    ArchFacts("gfx90a", "amd", 64, "MFMA", 64 * KB, 110, ("e5m2",), True),
    ArchFacts("gfx942", "amd", 64, "MFMA", 64 * KB, 304, ("e4m3", "e5m2"), True),
    ArchFacts("gfx950", "amd", 64, "MFMA", 160 * KB, 256, ("e4m3", "e5m2"), False),
    ArchFacts("gfx928", "hygon", 64, "MMAC", 64 * KB, 128, ("e5m2",), True),
    ArchFacts("gfx936", "hygon", 64, "MMAC", 64 * KB, 88, ("e5m2",), True),
    ArchFacts("gfx938", "hygon", 64, "MMAC", 64 * KB, 72, ("e4m3", "e5m2"), True),
    ArchFacts("gfx946", "hygon", 64, "MMAC", 128 * KB, 72, ("e4m3", "e5m2"), False),
    ArchFacts("sm_80", "nvidia", 32, "MMA", 163 * KB, 108, ("e5m2",), True),
    ArchFacts("sm_86", "nvidia", 32, "MMA", 99 * KB, 84, ("e5m2",), True),
    ArchFacts("sm_89", "nvidia", 32, "MMA", 99 * KB, 142, ("e4m3", "e5m2"), True),
    ArchFacts("sm_90", "nvidia", 32, "WGMMA", 227 * KB, 132, ("e4m3", "e5m2"), True),
    ArchFacts("sm_100", "nvidia", 32, "tcgen05", 227 * KB, 148, ("e4m3", "e5m2"), False),
    # The Triton interpreter computes fp16, fp32 and fp8 correctly but multiplies raw bits in
    # bf16 tl.dot (README.md, "Tests"), so bf16 is not a correct dtype on cpu. num_cus 1: no device
    # to fill, so decode takes the one-pass variant.
    ArchFacts("cpu", "cpu", 0, "none", 0, 1, ("e4m3", "e5m2"), False,
              (torch.float16, torch.float32)),
)}


def arch_facts(arch: str) -> ArchFacts:
    """The table row for ``arch``; an arch not in the table gets conservative facts (no HIP
    build, no fp8) with the vendor and wave size its name implies."""
    if not isinstance(arch, str):
        raise TypeError(f"arch: expected a str such as 'gfx942' or 'sm_90', got "
                        f"{type(arch).__name__}")
    known = ARCH_FACTS.get(arch)
    if known is not None:
        return known
    if arch.startswith("gfx"):
        vendor = "hygon" if arch in HYGON_ARCHS else "amd"
        return ArchFacts(arch, vendor, 64, "unknown", 64 * KB, 64, (), False)
    if arch.startswith("sm_"):
        return ArchFacts(arch, "nvidia", 32, "unknown", 48 * KB, 64, (), False)
    return ArchFacts(arch, "unknown", 32, "unknown", 48 * KB, 64, (), False)


def parse_gcn_arch(name: str) -> str:
    """``gfx936:sramecc+:xnack-`` -> ``gfx936`` (ROCm/DTK ``gcnArchName``)."""
    return name.split(":")[0].strip()


def cuda_arch(major: int, minor: int) -> str:
    """Compute capability -> ``sm_XY`` (9.0 -> ``sm_90``, 10.0 -> ``sm_100``)."""
    return f"sm_{major}{minor}"


def _device_index(device) -> int:
    """-1 for the CPU, else the CUDA/HIP device ordinal (None = the current device)."""
    if device is None:
        return torch.cuda.current_device() if torch.cuda.is_available() else -1
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        return -1
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _detect(index: int) -> str:
    if index < 0 or not torch.cuda.is_available():
        return "cpu"
    props = torch.cuda.get_device_properties(index)
    gcn = getattr(props, "gcnArchName", None)
    if gcn and (getattr(torch.version, "hip", None) or gcn.startswith("gfx")):
        return parse_gcn_arch(gcn)
    return cuda_arch(props.major, props.minor)


def detect_arch(device=None) -> str:
    """``gfx936``, ``sm_90``... for a GPU device, ``cpu`` otherwise; read once per device.

    device: None (the current device, or cpu without a GPU), an ordinal (-1 = cpu), a
    ``torch.device`` or a string such as ``"cuda:1"``.
    """
    return _detect(_device_index(device))


@functools.lru_cache(maxsize=None)
def _device_facts(index: int) -> ArchFacts:
    facts = arch_facts(_detect(index))
    if index >= 0 and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(index)
        facts = facts._replace(num_cus=int(props.multi_processor_count))
    return facts


def device_facts(device=None) -> ArchFacts:
    """:func:`arch_facts` of the device, with its real CU/SM count."""
    return _device_facts(_device_index(device))


def device_name(device=None) -> str:
    index = _device_index(device)
    if index < 0:
        return "cpu"
    return torch.cuda.get_device_name(index)


def clear_caches() -> None:
    _detect.cache_clear()
    _device_facts.cache_clear()


def fp8_format(dtype) -> Optional[str]:
    """``"e4m3"``/``"e5m2"`` for a torch fp8 dtype, None otherwise."""
    name = str(dtype)
    if "float8_e4m3" in name:
        return "e4m3"
    if "float8_e5m2" in name:
        return "e5m2"
    return None
