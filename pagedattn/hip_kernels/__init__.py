"""The ``hip`` backend: hand-written HIP/CUDA kernels, one source tree (csrc/, docs/hip.md).

* paged decode: grid over (KV head, sequence, partition), every KV tile read once for the whole
  GQA group (REUSE_KV_TIMES), split-KV with a combine kernel; layouts bhsd/bshd/hcu; fp16/bf16
  queries; fp16/bf16 or fp8 (e4m3/e5m2, per-KV-head scales) caches.
* extend (prefix prefill): shifted causal mask, ragged batch, paged K/V read from the cache;
  layouts bhsd/bshd; fp16/bf16.

Anything else is reported by :func:`supports` as a reason, so dispatch falls back. The kernels are
built on first use (:mod:`pagedattn.hip_kernels.build`).
"""
import functools
from typing import List, Optional

import torch

from pagedattn import layouts as L

LAYOUT_CODES = {"bhsd": 0, "bshd": 1, "hcu": 3}
DECODE_LAYOUTS = ("bhsd", "bshd", "hcu")
EXTEND_LAYOUTS = ("bhsd", "bshd")
HEAD_DIMS = (64, 128)
Q_DTYPES = (torch.float16, torch.bfloat16)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
MFMA_ARCHS = {"gfx90a", "gfx940", "gfx941", "gfx942"}
MMAC_ARCHS = {"gfx928", "gfx936", "gfx938", "gfx92a", "gfx946"}
T_TILE = 64  # tokens per KV tile in the kernels; partitions are multiples of it


@functools.lru_cache(maxsize=None)
def _toolchain_reason() -> Optional[str]:
    try:
        from torch.utils import cpp_extension
    except Exception as e:  # pragma: no cover
        return f"torch.utils.cpp_extension unavailable: {e}"
    if getattr(torch.version, "hip", None):
        return None if cpp_extension.ROCM_HOME else "no ROCm/DTK toolkit found (ROCM_HOME)"
    if torch.version.cuda is None:
        return "torch has no CUDA/ROCm support"
    return None if cpp_extension.CUDA_HOME else "no CUDA toolkit found (CUDA_HOME / nvcc)"


@functools.lru_cache(maxsize=None)
def _arch_reason(index: int) -> Optional[str]:
    from pagedattn.hip_kernels.build import device_arch
    arch = device_arch(index)
    if arch.startswith("sm_"):
        return None if int(arch[3:]) >= 80 else f"{arch}: needs sm_80+ (mma.sync bf16)"
    if arch in MFMA_ARCHS or arch in MMAC_ARCHS:
        return None
    return f"{arch}: no MFMA/MMAC code path"


def _aligned(t: torch.Tensor, epv: int) -> bool:
    return t.data_ptr() % 16 == 0 and all(s % epv == 0 for s in t.stride()[:-1])


def supports(op: str, **facts) -> List[str]:
    """Reasons the hip backend cannot serve this call (empty: it can)."""
    if op in ("store_kv", "copy_blocks"):
        return [f"{op}: not implemented in hip"]
    if op not in ("paged_decode", "extend_attention"):
        return [f"unknown op {op!r}"]
    why = []
    q, k, layout, geom, opts = (facts.get(n) for n in ("q", "k_cache", "layout", "geom", "opts"))
    if q is None or q.device.type != "cuda":
        return ["needs tensors on a CUDA/ROCm device"]
    tc = _toolchain_reason()
    if tc:
        why.append(tc)
    else:
        ar = _arch_reason(q.device.index if q.device.index is not None else 0)
        if ar:
            why.append(ar)
    if q.dtype not in Q_DTYPES:
        why.append(f"q dtype {q.dtype} (needs fp16/bf16)")
    if op == "paged_decode":
        if q.dim() != 3:
            why.append("q_len > 1 (speculative decode) not supported")
        if layout not in DECODE_LAYOUTS:
            why.append(f"layout {layout!r} (decode supports {DECODE_LAYOUTS})")
        if k is not None and k.dtype != q.dtype and k.dtype not in FP8:
            why.append(f"cache dtype {k.dtype}")
    else:
        if layout not in EXTEND_LAYOUTS:
            why.append(f"layout {layout!r} (extend supports {EXTEND_LAYOUTS})")
        if k is not None and k.dtype != q.dtype:
            why.append(f"extend cache dtype {k.dtype} (needs q's dtype; fp8 not supported)")
        if facts.get("causal") is False:
            why.append("causal=False not supported")
        if facts.get("k_new") is not None:
            why.append("k_new/v_new not supported (write them with store_kv first)")
        if facts.get("custom_mask") is not None:
            why.append("custom_mask not supported")
    if geom is not None:
        if geom.head_dim not in HEAD_DIMS:
            why.append(f"head_dim {geom.head_dim} (supports {HEAD_DIMS})")
        if geom.head_dim_v != geom.head_dim:
            why.append(f"head_dim_v {geom.head_dim_v} differs from head_dim {geom.head_dim} "
                       "(K and V share one head dim here)")
        bs = geom.block_size
        if bs < 16 or bs & (bs - 1):
            why.append(f"block_size {bs} (needs a power of 2 >= 16)")
    if opts is not None:
        for name in ("sinks", "logit_cap", "alibi_slopes", "sliding_window"):
            if getattr(opts, name) is not None:
                why.append(f"{name} not supported")
    if k is not None and layout in LAYOUT_CODES and not _aligned(k, 16 // k.element_size()):
        why.append("k_cache not 16-byte aligned (pointer or strides)")
    if q.dim() >= 2 and (q.data_ptr() % 4 or any(s % 2 for s in q.stride()[:-1])):
        why.append("q not 4-byte aligned (pointer or odd strides)")
    return why


def default_partition_size(group: int, requested: Optional[int]) -> int:
    """512, or 256 when the GQA group exceeds 15; a requested size (call or
    PAGEDATTN_PARTITION_SIZE, already folded into the call) is rounded up to a multiple of 64.
    Split points depend on the sequence only, never on the batch."""
    p = requested if requested else (256 if group > 15 else 512)
    return max(T_TILE, -(-p // T_TILE) * T_TILE)


class HipUnavailableError(RuntimeError):
    """The hip extension cannot be built or loaded here (no device, no toolkit, a build error)."""


def _ops():
    from pagedattn.hip_kernels import build
    return build.load()


def mma_probe(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b.T`` in float32, computed by one wave through the kernels' matrix abstraction.

    The first-run self-check runs this with known tiles and compares with torch: a wrong
    MMAC/MFMA/``mma.sync`` operand order or lane map shows here, apart from any attention
    kernel (``csrc/mma_probe.cu``; the layout assumptions it verifies are listed in
    ``csrc/pk_mma.h`` and docs/hip.md).

    Parameters
    ----------
    a : torch.Tensor
        shape: ``[16, 16]``, dtype: float16 or bfloat16, on a CUDA/ROCm device.
    b : torch.Tensor
        shape: ``[16, 16]``, a's dtype and device.

    Returns
    -------
    torch.Tensor
        shape: ``[16, 16]``, dtype: float32, ``c[x][y] = sum_k a[x][k] * b[y][k]``.

    Raises
    ------
    TypeError, ValueError
        ``a`` or ``b`` is not a 16x16 fp16/bf16 tensor pair on one CUDA/ROCm device.
    HipUnavailableError
        The hip extension cannot be built or loaded (the reason is in the message).

    Examples
    --------
    >>> import torch
    >>> from pagedattn import hip_kernels
    >>> a = torch.randn(16, 16).half().cuda()  # doctest: +SKIP
    >>> c = hip_kernels.mma_probe(a, a)  # doctest: +SKIP
    """
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in Q_DTYPES:
            raise TypeError(f"{name}: expected float16 or bfloat16, got {t.dtype}")
        if tuple(t.shape) != (16, 16):
            raise ValueError(f"{name}: expected shape (16, 16), got {tuple(t.shape)}")
    if b.dtype != a.dtype or b.device != a.device:
        raise ValueError(f"b: expected a's dtype {a.dtype} and device {a.device}, got "
                         f"{b.dtype} on {b.device}")
    if a.device.type != "cuda":
        raise HipUnavailableError(f"mma_probe needs tensors on a CUDA/ROCm device, got "
                                  f"{a.device}")
    why = _toolchain_reason() or _arch_reason(a.device.index or 0)
    if why:
        raise HipUnavailableError(f"mma_probe: the hip extension cannot be built here: {why}")
    try:
        ops = _ops()
    except Exception as e:  # noqa: BLE001 - any build or load failure becomes one typed error
        raise HipUnavailableError(f"mma_probe: building the hip extension failed: "
                                  f"{type(e).__name__}: {e}") from e
    c = torch.empty(16, 16, dtype=torch.float32, device=a.device)
    ops.mma_probe(a.contiguous(), b.contiguous(), c)
    return c


_MODES = {"auto": -1, "split": 0, "one_pass": 1}


def check_errors(errors, device) -> None:
    """``errors`` is None or an int32 tensor of 1 element on ``device`` (TypeError/ValueError
    naming it otherwise)."""
    if errors is None:
        return
    if not isinstance(errors, torch.Tensor):
        raise TypeError(f"errors: expected None or a torch.Tensor, got {type(errors).__name__}")
    if errors.dtype != torch.int32 or errors.numel() != 1:
        raise TypeError(f"errors: expected an int32 tensor of 1 element, got dtype "
                        f"{errors.dtype}, shape {tuple(errors.shape)}")
    if errors.device != device:
        raise ValueError(f"errors: expected device {device}, got {errors.device}")


def decode_raw(q, k_cache, v_cache, block_table, seq_lens, out, *, layout="bhsd", scale=None,
               k_scale=None, v_scale=None, partition_size=None, lse=None, mode="auto",
               parts_per_block=None, errors=None) -> None:
    """Launch the decode kernel directly (no validation beyond the C++ host checks).

    Metadata is guarded on the device (csrc/pk_guard.h): a sequence with a seq_len outside
    [0, table width x block size] or a used block id outside [0, num_blocks) reads no KV and
    gets NaN rows (lse NaN); ``errors`` (None or an int32 device tensor of 1 element) then
    receives +1 per kernel program that found it, without a host sync.

    mode (``auto`` | ``split`` | ``one_pass``) and parts_per_block (None: auto) force the
    column-split decode's launch shape, for tests: every shape gives the same bits. ``auto``:
    one pass when the (head group, sequence) blocks fill the GPU three times over, else split
    with as few partitions per block as keep one wave (attn_kernel always splits one partition
    per block).
    """
    if mode not in _MODES:
        raise ValueError(f"mode: expected one of {sorted(_MODES)}, got {mode!r}")
    if parts_per_block is not None and (not isinstance(parts_per_block, int) or
                                        parts_per_block < 1):
        raise ValueError(f"parts_per_block: expected None or a positive int, got "
                         f"{parts_per_block!r}")
    check_errors(errors, q.device)
    g = L.cache_geometry(k_cache, layout)
    group = q.shape[1] // g.num_kv_heads
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    part = default_partition_size(group, partition_size)
    _ops().paged_decode(q, k_cache, v_cache, block_table, seq_lens, out, lse, k_scale, v_scale,
                        LAYOUT_CODES[layout], float(scale), part, _MODES[mode],
                        parts_per_block or 0, errors)


def paged_decode(call, errors=None):
    """Serve a validated :class:`pagedattn.validation.DecodeCall`: writes call.out.

    errors: None or an int32 device tensor of 1 element (default: ``call.errors`` when the
    call carries one); see :func:`decode_raw` for the guards."""
    errors = getattr(call, "errors", None) if errors is None else errors
    q = call.q
    lse = (torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
           if call.return_lse else None)
    decode_raw(q, call.k_cache, call.v_cache, call.block_table, call.seq_lens, call.out,
               layout=call.layout, scale=call.opts.scale, k_scale=call.opts.k_scale,
               v_scale=call.opts.v_scale, partition_size=call.partition_size, lse=lse,
               errors=errors)
    return lse


def extend_attention(call, errors=None):
    """Serve a validated :class:`pagedattn.validation.ExtendCall`: writes call.out.

    Metadata is guarded on the device (csrc/pk_guard.h): a request whose cu_seqlens_q pair is
    descending or outside [0, num_tokens], whose query length exceeds its seq_len or max_q_len,
    whose seq_len is outside [0, table width x block size], or whose used block ids leave
    [0, num_blocks), reads no KV and gets NaN rows (lse NaN) for every head. ``errors`` (None
    or an int32 device tensor of 1 element; default ``call.errors`` when present) receives +1
    per kernel program that found bad metadata, without a host sync."""
    errors = getattr(call, "errors", None) if errors is None else errors
    q = call.q
    check_errors(errors, q.device)
    lse = (torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
           if call.return_lse else None)
    max_q = call.max_q_len
    if max_q is None:
        cu = call.cu_seqlens_q
        max_q = max(0, int((cu[1:] - cu[:-1]).max())) if cu.numel() > 1 else 0  # a host sync
    _ops().extend_attention(q, call.k_cache, call.v_cache, call.block_table, call.cu_seqlens_q,
                            call.seq_lens, call.out, lse, LAYOUT_CODES[call.layout],
                            float(call.opts.scale), int(max_q), errors)
    return lse
