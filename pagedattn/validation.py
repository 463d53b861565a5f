"""Entry validation shared by every public op, and the normalised call records backends consume.

Host checks (shapes, dtypes, devices, strides) always run and raise before any launch.
Device-data checks (block ids in range, seq_len within the table's capacity, indptr monotone)
read tensors back to the host, so they run when ``validate`` is true: by default for the torch
backend, and for GPU backends when ``validate=True`` or ``PAGEDATTN_VALIDATE=1``.
"""
import math
from dataclasses import dataclass
from typing import Optional

import torch

from pagedattn import config
from pagedattn import layouts as L
from pagedattn.reference import FP8_DTYPES, is_fp8

Q_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
KV_DTYPES = Q_DTYPES + FP8_DTYPES
# Head dims (K's and V's, separately) every public op accepts: any width up to 576 (MLA's
# 512 latent + 64 rope). Backends declare what they serve (pagedattn.dispatch.capabilities).
MAX_HEAD_DIM = 576


def _desc(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


def check_tensor(name: str, t, *, dim: Optional[int] = None, dtypes=None, device=None,
                 last_contig: bool = True) -> torch.Tensor:
    """Type, rank, dtype, device and last-dim contiguity of one tensor argument."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name}: expected a {dim}-D tensor, got {_desc(t)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device} (all tensors must "
                         "be on one device)")
    if last_contig and t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: expected a contiguous last dimension, got strides {t.stride()}")
    return t


def check_shape(name: str, t: torch.Tensor, shape) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")


def check_errors(errors, device) -> Optional[torch.Tensor]:
    """The optional error counter of a public op: None, or an int32 tensor of one element on
    the op's device. Kernels add the number of guarded rows or skipped entries to it (atomically,
    no host sync); the caller reads it when convenient."""
    if errors is None:
        return None
    check_tensor("errors", errors, dtypes=(torch.int32,), device=device)
    if errors.numel() != 1:
        raise ValueError(f"errors: expected one int32 element, got shape {tuple(errors.shape)}")
    return errors


def validate_enabled(validate: Optional[bool], backend: str) -> bool:
    if validate is not None:
        return bool(validate)
    if config.get("PAGEDATTN_VALIDATE"):
        return True
    return backend == "torch"


def _check_scalar(name, x, *, positive=True, allow_none=True):
    if x is None:
        if allow_none:
            return None
        raise ValueError(f"{name}: required")
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{name}: expected a number, got {type(x).__name__}")
    x = float(x)
    if not math.isfinite(x) or (positive and x <= 0):
        raise ValueError(f"{name}: expected a finite {'positive ' if positive else ''}number, "
                         f"got {x}")
    return x


def _norm_kv_scale(name, scale, kv_dtype, num_kv_heads, device) -> Optional[torch.Tensor]:
    """k_scale/v_scale -> float32 [num_kv_heads] on device (None when the cache is not fp8)."""
    if scale is None:
        if is_fp8(kv_dtype):
            raise ValueError(f"{name}: an fp8 cache ({kv_dtype}) needs a scale (float, or a "
                             f"float32 tensor of 1 or num_kv_heads={num_kv_heads} elements)")
        return None
    if isinstance(scale, torch.Tensor):
        if scale.numel() not in (1, num_kv_heads) or scale.dim() > 1:
            raise ValueError(f"{name}: expected 1 or num_kv_heads={num_kv_heads} elements, got "
                             f"{_desc(scale)}")
        if not scale.dtype.is_floating_point:
            raise TypeError(f"{name}: expected a floating tensor, got {scale.dtype}")
        if scale.device != device:
            raise ValueError(f"{name}: expected device {device}, got {scale.device}")
        t = scale.to(torch.float32).reshape(-1)
    else:
        return _scale_tensor(_check_scalar(name, scale), num_kv_heads, device)
    return t.expand(num_kv_heads).contiguous() if t.numel() == 1 else t.contiguous()


_SCALES = {}  # (value, num_kv_heads, device) -> float32 [num_kv_heads]: float scales, made once


def _scale_tensor(value: float, num_kv_heads: int, device) -> torch.Tensor:
    """A float scale as the kernels' float32 [num_kv_heads] tensor, made once per value and
    device (a fill, where ``torch.tensor`` would be a host-to-device copy that waits for the
    stream and cannot run under CUDA-graph capture). Kernels only read it."""
    key = (value, num_kv_heads, device)
    t = _SCALES.get(key)
    if t is None:
        t = torch.full((num_kv_heads,), value, dtype=torch.float32, device=device)
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return t  # filled only when the graph replays: not for eager calls
        if len(_SCALES) >= 256:
            _SCALES.clear()
        _SCALES[key] = t
    return t


def _check_scale_values(name, t: Optional[torch.Tensor]):
    if t is not None and not bool(torch.all(torch.isfinite(t) & (t > 0))):
        raise ValueError(f"{name}: every scale must be finite and > 0, got {t.tolist()}")


def _norm_head_vec(name, x, hq, device):
    if x is None:
        return None
    check_tensor(name, x, dim=1, device=device)
    check_shape(name, x, (hq,))
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name}: expected a floating tensor, got {x.dtype}")
    return x.to(torch.float32).contiguous()


@dataclass(frozen=True)
class AttnOptions:
    """Options every attention op shares, normalised (scale folded later by the kernels)."""

    scale: float
    k_scale: Optional[torch.Tensor]  # float32 [num_kv_heads] or None
    v_scale: Optional[torch.Tensor]
    sliding_window: Optional[int]
    logit_cap: Optional[float]
    alibi_slopes: Optional[torch.Tensor]  # float32 [num_q_heads]
    sinks: Optional[torch.Tensor]  # float32 [num_q_heads]


@dataclass(frozen=True)
class DecodeCall:
    q: torch.Tensor  # [B, Hq, D] or [B, Lq, Hq, D]
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor  # int32 [B, max_blocks]
    seq_lens: torch.Tensor  # int32 [B]
    layout: str
    geom: L.CacheGeometry
    opts: AttnOptions
    partition_size: Optional[int]
    out: torch.Tensor  # same shape as q
    return_lse: bool
    validate: bool
    errors: Optional[torch.Tensor] = None  # int32 [1]: guarded rows are counted here

    @property
    def num_seqs(self):
        return self.q.shape[0]

    @property
    def q_len(self):
        return 1 if self.q.dim() == 3 else self.q.shape[1]

    @property
    def num_q_heads(self):
        return self.q.shape[-2]


@dataclass(frozen=True)
class ExtendCall:
    q: torch.Tensor  # [T, Hq, D]
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    cu_seqlens_q: torch.Tensor  # int32 [B+1]
    seq_lens: torch.Tensor  # int32 [B]
    layout: str
    geom: L.CacheGeometry
    opts: AttnOptions
    causal: bool
    k_new: Optional[torch.Tensor]  # [T, Hkv, D]
    v_new: Optional[torch.Tensor]
    custom_mask: Optional[torch.Tensor]  # bool, flat
    mask_indptr: Optional[torch.Tensor]  # int32 [B+1]
    max_q_len: Optional[int]  # host-known upper bound on one request's query length
    out: torch.Tensor
    return_lse: bool
    validate: bool
    errors: Optional[torch.Tensor] = None  # int32 [1]: guarded rows are counted here

    @property
    def num_seqs(self):
        return self.seq_lens.shape[0]


def resolve_v_cache(k_cache, v_cache, layout, head_dim_v=None):
    """The V cache of an attention call: ``v_cache`` itself, or with ``v_cache=None`` (MLA: one
    latent cache holds K and V) the view of the K cache's first ``head_dim_v`` columns.
    ``head_dim_v`` given with a V cache must equal its width."""
    if head_dim_v is not None:
        if isinstance(head_dim_v, bool) or not isinstance(head_dim_v, int) or head_dim_v < 1:
            raise ValueError(f"head_dim_v: expected a positive int, got {head_dim_v!r}")
    if v_cache is not None:
        if head_dim_v is not None and isinstance(v_cache, torch.Tensor) and v_cache.dim() == 4:
            got = L.v_geometry(v_cache, layout).head_dim
            if got != head_dim_v:
                raise ValueError(f"head_dim_v: {head_dim_v} differs from v_cache's width {got}")
        return v_cache
    check_tensor("k_cache", k_cache, dtypes=KV_DTYPES)
    if head_dim_v is None:
        raise ValueError("v_cache: None means V is the leading columns of k_cache (MLA); "
                         "give head_dim_v= (512 for DeepSeek's 576-wide latent cache)")
    g = L.cache_geometry(k_cache, layout)
    if head_dim_v > g.head_dim:
        raise ValueError(f"head_dim_v: {head_dim_v} exceeds k_cache's head_dim {g.head_dim} "
                         "(v_cache=None reads V from k_cache's first head_dim_v columns)")
    return L.mla_v_view(k_cache, layout, head_dim_v)


def _check_head_dim(name, d):
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"{name}: head_dim {d} unsupported; supported: 1 to {MAX_HEAD_DIM}")


def check_cache(k_cache, v_cache, layout) -> L.CacheGeometry:
    """Geometry of a (k_cache, v_cache) pair: block, head and block-size dims agree, the head
    dims (K's ``head_dim``, V's ``head_dim_v``) may differ."""
    L.check_layout(layout)
    check_tensor("k_cache", k_cache, dtypes=KV_DTYPES)
    check_tensor("v_cache", v_cache, dtypes=KV_DTYPES, device=k_cache.device)
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"v_cache: expected dtype {k_cache.dtype} (k_cache's), got {v_cache.dtype}")
    g = L.cache_geometry(k_cache, layout)
    vg = L.v_geometry(v_cache, layout) if v_cache.dim() == 4 else None
    if vg is None or vg[:3] != g[:3]:
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} does not match k_cache "
                         f"{tuple(k_cache.shape)} in layout {layout!r} (k_cache implies "
                         f"num_blocks {g.num_blocks}, block_size {g.block_size}, num_kv_heads "
                         f"{g.num_kv_heads})")
    g = g._replace(head_dim_v=vg.head_dim)
    if layout == "vllm" and k_cache.shape[4] != L.vllm_x(k_cache.dtype):
        raise ValueError(f"k_cache: the vllm layout needs x = 16 // element size = "
                         f"{L.vllm_x(k_cache.dtype)} in the last dim, got {k_cache.shape[4]}")
    if g.block_size <= 0:
        raise ValueError(f"k_cache: block_size must be >= 1, got {g.block_size}")
    if g.num_blocks <= 0:
        raise ValueError("k_cache: num_blocks must be > 0")
    if g.num_kv_heads <= 0:
        raise ValueError("k_cache: num_kv_heads must be > 0")
    _check_head_dim("k_cache", g.head_dim)
    _check_head_dim("v_cache", g.head_dim_v)
    return g


def _layout_hint(hq: int, d: int, g: L.CacheGeometry, kv_dtype, layout) -> str:
    """'; is k_cache in layout X? ...' when the K cache's shape, read in another layout of its
    rank (the dims permuted: bshd swaps block_size and num_kv_heads against bhsd), would fit q's
    heads and head_dim; '' otherwise (or without a layout)."""
    try:
        shape = L.kv_cache_shapes(*g[:4], layout, kv_dtype)[0]
    except (ValueError, TypeError):
        return ""
    meta = torch.empty(shape, device="meta")
    for other in L.LAYOUTS:
        try:
            g2 = L.cache_geometry(meta, other)
        except ValueError:  # another rank
            continue
        if g2[:4] != g[:4] and g2.head_dim == d and g2.num_kv_heads and hq % g2.num_kv_heads == 0:
            return f"; is k_cache in layout {other!r}? pass layout={other!r}"
    return ""


def check_q_and_heads(q, g: L.CacheGeometry, kv_dtype, device, *, dims=(3,), layout=None):
    check_tensor("q", q, dtypes=Q_DTYPES, device=device)
    if q.dim() not in dims:
        raise ValueError(f"q: expected {' or '.join(f'{d}-D' for d in dims)} "
                         f"[tokens, num_q_heads, head_dim], got {_desc(q)}")
    hq, d = q.shape[-2], q.shape[-1]
    if d != g.head_dim:
        raise ValueError(f"q: head_dim {d} differs from the cache's head_dim {g.head_dim}"
                         + _layout_hint(hq, d, g, kv_dtype, layout))
    if hq % g.num_kv_heads:
        raise ValueError(f"q: num_q_heads {hq} is not a multiple of num_kv_heads {g.num_kv_heads}"
                         + _layout_hint(hq, d, g, kv_dtype, layout))
    if not is_fp8(kv_dtype) and kv_dtype != q.dtype:
        raise TypeError(f"k_cache: dtype {kv_dtype} must equal q's dtype {q.dtype} (or be fp8 "
                        "with scales)")


def check_table(block_table, seq_lens, num_seqs, device):
    check_tensor("block_table", block_table, dim=2, dtypes=(torch.int32,), device=device)
    if block_table.shape[0] < num_seqs:
        raise ValueError(f"block_table: expected at least {num_seqs} rows, got "
                         f"{block_table.shape[0]}")
    check_tensor("seq_lens", seq_lens, dim=1, dtypes=(torch.int32,), device=device)
    check_shape("seq_lens", seq_lens, (num_seqs,))


def check_out(out, like: torch.Tensor, width: Optional[int] = None):
    """The output of an attention op: ``like`` (q) with its last dim ``width`` (V's head dim,
    default q's); allocated when None."""
    shape = tuple(like.shape[:-1]) + (like.shape[-1] if width is None else width,)
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    check_tensor("out", out, dtypes=(like.dtype,), device=like.device)
    check_shape("out", out, shape)
    if out.data_ptr() == like.data_ptr() and out.numel():
        raise ValueError("out: must not alias q")
    return out


def attn_options(*, q, g, kv_dtype, scale, k_scale, v_scale, sliding_window, logit_cap,
                 alibi_slopes, sinks) -> AttnOptions:
    dev = q.device
    d, hq = q.shape[-1], q.shape[-2]
    scale = d ** -0.5 if scale is None else _check_scalar("scale", scale)
    if sliding_window is not None:
        if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) \
                or sliding_window <= 0:
            raise ValueError(f"sliding_window: expected a positive int or None, got "
                             f"{sliding_window!r}")
    if logit_cap is not None:
        logit_cap = _check_scalar("logit_cap", logit_cap, positive=False)
        if logit_cap < 0:
            raise ValueError(f"logit_cap: expected >= 0, got {logit_cap}")
        logit_cap = logit_cap or None
    ks = _norm_kv_scale("k_scale", k_scale, kv_dtype, g.num_kv_heads, dev)
    vs = _norm_kv_scale("v_scale", v_scale, kv_dtype, g.num_kv_heads, dev)
    return AttnOptions(scale, ks, vs, sliding_window, logit_cap,
                       _norm_head_vec("alibi_slopes", alibi_slopes, hq, dev),
                       _norm_head_vec("sinks", sinks, hq, dev))


def check_partition_size(partition_size):
    name = "partition_size"
    if partition_size is None:
        partition_size, name = config.get("PAGEDATTN_PARTITION_SIZE"), "PAGEDATTN_PARTITION_SIZE"
    if partition_size is not None:
        if isinstance(partition_size, bool) or not isinstance(partition_size, int) \
                or partition_size <= 0 or partition_size & (partition_size - 1):
            raise ValueError(f"{name}: expected a positive power of 2, got {partition_size!r}")
    return partition_size


# ----------------------------------------------------------------------------------------------
# device-data checks (host sync)
# ----------------------------------------------------------------------------------------------

def check_table_data(block_table, seq_lens, block_size, num_blocks, *, need=None):
    """seq_lens >= 0, within the table's capacity, and every used block id in range.

    need: per-sequence number of leading tokens that are read through the table (default
    seq_lens).
    """
    lens = seq_lens.to(torch.int64).cpu()
    if lens.numel() and int(lens.min()) < 0:
        i = int(torch.nonzero(lens < 0)[0])
        raise ValueError(f"seq_lens: negative length {int(lens[i])} at sequence {i}")
    need = lens if need is None else need.to(torch.int64).cpu()
    cap = block_table.shape[1] * block_size
    if need.numel() and int(need.max()) > cap:
        i = int(torch.argmax(need))
        raise ValueError(f"seq_lens: sequence {i} reads {int(need[i])} tokens, which exceeds "
                         f"block table capacity {block_table.shape[1]} x {block_size} = {cap}")
    used = (need + block_size - 1) // block_size
    table = block_table[: lens.numel()].to(torch.int64).cpu()
    col = torch.arange(table.shape[1]).view(1, -1)
    bad = (col < used.view(-1, 1)) & ((table < 0) | (table >= num_blocks))
    if bool(bad.any()):
        s, j = (int(v) for v in torch.nonzero(bad)[0])
        raise ValueError(f"block_table: block id out of range: {int(table[s, j])} at (seq {s}, "
                         f"index {j}); valid ids are [0, {num_blocks})")


def check_decode_data(opts: AttnOptions, block_table, seq_lens, g: L.CacheGeometry, q_len: int):
    """The device-data checks of one decode batch: scale values, table contents, and room for
    the q_len query tokens in every sequence (host sync)."""
    _check_scale_values("k_scale", opts.k_scale)
    _check_scale_values("v_scale", opts.v_scale)
    check_table_data(block_table, seq_lens, g.block_size, g.num_blocks)
    if q_len > 1 and seq_lens.numel() and int(seq_lens.min()) < q_len:
        raise ValueError(f"seq_lens: every sequence must hold its {q_len} query tokens, got "
                         f"min {int(seq_lens.min())}")


def check_indptr(name, indptr, total, num_seqs):
    check_tensor(name, indptr, dim=1, dtypes=(torch.int32,))
    check_shape(name, indptr, (num_seqs + 1,))
    v = indptr.to(torch.int64).cpu()
    if int(v[0]) != 0:
        raise ValueError(f"{name}: must start at 0, got {int(v[0])}")
    if num_seqs and bool((v[1:] < v[:-1]).any()):
        raise ValueError(f"{name}: must be non-decreasing")
    if total is not None and int(v[-1]) != total:
        raise ValueError(f"{name}: last entry {int(v[-1])} must equal {total}")
    return v
