"""store_kv in Triton: write new tokens' K/V into the paged cache by slot mapping.

slot = block * block_size + offset; slots < 0 are padding and skipped. fp8 caches store
``x / scale[h]`` saturated to the format's max (the semantics of ``reference.quantize``); other
caches store x unchanged (same dtype). Every layout goes through the one address function.

Guards (no host sync): a slot past the cache (>= num_blocks * block_size) is skipped, and so is
every token of a slot that two or more tokens name (which of them would win is undefined on a
GPU). Each skipped token adds 1 to the optional ``errors`` counter. Duplicates are found in the
kernel by comparing each token's slot with all others when the batch is small (decode: one
launch, no extra work), and from an on-device sorted copy of the slots otherwise (prefill: a sort
and two binary searches, O(T log T) instead of the kernel's O(T^2)). ``PAGEDATTN_DEV_GUARDS=0``
compiles the kernel without the guards (to measure their cost).
"""
import torch
import triton
import triton.language as tl

from pagedattn import config
from pagedattn import layouts as L
from pagedattn.reference import FP8_DTYPES
from pagedattn.triton_kernels import _replay
from pagedattn.triton_kernels._common import kv_offset

# mantissa bits and minimum normal exponent of each fp8 format
_FP8_GRID = {torch.float8_e4m3fn: (3, -6), torch.float8_e5m2: (2, -14)}


@triton.jit
def _round_to_grid(y, MBITS: tl.constexpr, EMIN: tl.constexpr):
    """Round float32 y to the nearest-even value with MBITS mantissa bits and min normal
    exponent EMIN (the fp8 grid, subnormals included), in float32 arithmetic.

    NOTE: the fp32 -> fp8 cast is then exact. The Triton interpreter's own cast rounds ties away
    and drops mantissa carries (-1.9967 -> -1.0), so rounding is not left to the cast.
    """
    bits = y.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, EMIN)  # unbiased exponent, >= EMIN
    ulp = ((e - MBITS + 127) << 23).to(tl.float32, bitcast=True)  # 2^(e - MBITS), exact
    t = y / ulp  # |t| < 2^(MBITS+1): exact (power-of-2 divide)
    magic = 12582912.0  # 1.5 * 2^23: (t + magic) - magic rounds t to an integer, ties to even
    r = ((t + magic) - magic) * ulp
    return tl.where(r == 0.0, y * 0.0, r)  # keep the sign of zero (-tiny -> -0.0)


@triton.jit
def _quantize(x, scale_ptr, h, FP8: tl.constexpr, FMAX: tl.constexpr, MBITS: tl.constexpr,
              EMIN: tl.constexpr, cache_ty: tl.constexpr):
    """x [BLOCK_D] -> cache dtype; fp8: x / scale[h], clamped to +-FMAX, round to nearest even."""
    if FP8:
        # IEEE division: the default fp32 "/" on NVIDIA is approximate (off by an ulp), which
        # moves values across fp8 rounding boundaries (seen on the H200)
        y = tl.math.div_rn(x.to(tl.float32), tl.load(scale_ptr + h))
        y = tl.minimum(tl.maximum(y, -FMAX), FMAX)
        return _round_to_grid(y, MBITS, EMIN).to(cache_ty, fp_downcast_rounding="rtne")
    else:
        return x.to(cache_ty)


# Token counts up to this are checked for duplicate slots in the kernel (all pairs, one launch);
# larger batches get a duplicate mask from a device-side sort first.
PAIRWISE_MAX_TOKENS = 512
BLOCK_T = 128  # slots compared per step of the in-kernel duplicate scan


@triton.jit
def _store_kv_kernel(
        k_ptr, v_ptr,  # [T, Hkv, D], [T, Hkv, DV] new keys / values (v: k's stand-in, not HAS_V)
        k_cache_ptr, v_cache_ptr,  # paged caches, any layout
        slot_mapping_ptr,  # int32/int64 [T]
        dup_ptr,  # uint8 [T]: token t's slot is named by another token too (DUP_MASK) or dummy
        errors_ptr,  # int32 [1]: += skipped tokens (HAS_ERR) or dummy
        k_scale_ptr, v_scale_ptr,  # float32 [Hkv] (fp8) or dummies
        num_slots,  # num_blocks * block_size: slots in the cache
        stride_kt: tl.int64, stride_kh: tl.int64, stride_vt: tl.int64, stride_vh: tl.int64,
        stride_ckb: tl.int64, stride_ckt: tl.int64, stride_ckh: tl.int64,
        stride_ckdh: tl.int64, stride_ckdl: tl.int64,
        stride_cvb: tl.int64, stride_cvt: tl.int64, stride_cvh: tl.int64,
        stride_cvdh: tl.int64, stride_cvdl: tl.int64,
        D: tl.constexpr, BS: tl.constexpr, BLOCK_D: tl.constexpr,
        K_X: tl.constexpr, K_SPLIT: tl.constexpr, K_LO_ONE: tl.constexpr,
        V_LO_ONE: tl.constexpr, FP8: tl.constexpr, FMAX: tl.constexpr, MBITS: tl.constexpr,
        EMIN: tl.constexpr, GUARD: tl.constexpr, DUP_MASK: tl.constexpr,
        HAS_ERR: tl.constexpr, BLOCK_T: tl.constexpr, DV: tl.constexpr,
        BLOCK_DV: tl.constexpr, HAS_V: tl.constexpr):
    # grid: (T, Hkv): one program per (token, KV head) writes D elements of K and DV of V
    # (HAS_V; an MLA latent cache holds K only).
    # T is the grid's first dimension, so no argument depends on the token count.
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)  # scalar; < 0 = padding
    keep = slot >= 0
    if GUARD:
        if DUP_MASK:
            dup = tl.load(dup_ptr + t) != 0
        else:
            # how many tokens name this slot, itself included: all pairs, BLOCK_T at a time
            num_t = tl.num_programs(0)
            hits = 0
            for j0 in range(0, num_t, BLOCK_T):
                j = j0 + tl.arange(0, BLOCK_T)  # [BLOCK_T]
                other = tl.load(slot_mapping_ptr + j, mask=j < num_t, other=-1).to(tl.int64)
                hits += tl.sum((other == slot).to(tl.int32), axis=0)
            dup = hits > 1
        bad = keep & ((slot >= num_slots) | dup)  # skipped and counted
        if HAS_ERR:
            tl.atomic_add(errors_ptr, 1, mask=bad & (h == 0))  # once per token, not per head
        keep = keep & ~bad
    blk = tl.maximum(slot, 0) // BS  # int64 physical block
    off = tl.maximum(slot, 0) % BS
    d = tl.arange(0, BLOCK_D)
    mask = d < tl.where(keep, D, 0)  # [BLOCK_D]: nothing when the token is skipped
    t64 = t.to(tl.int64)
    k = tl.load(k_ptr + t64 * stride_kt + h * stride_kh + d, mask=mask, other=0.0)  # [BLOCK_D]
    k_off = kv_offset(blk, off, h, d, stride_ckb, stride_ckt, stride_ckh, stride_ckdh,
                      stride_ckdl, K_X, K_SPLIT, K_LO_ONE)
    ck_ty = k_cache_ptr.dtype.element_ty
    tl.store(k_cache_ptr + k_off, _quantize(k, k_scale_ptr, h, FP8, FMAX, MBITS, EMIN, ck_ty),
             mask=mask)
    if HAS_V:
        e = tl.arange(0, BLOCK_DV)
        v_mask = e < tl.where(keep, DV, 0)
        v = tl.load(v_ptr + t64 * stride_vt + h * stride_vh + e, mask=v_mask, other=0.0)
        v_off = kv_offset(blk, off, h, e, stride_cvb, stride_cvt, stride_cvh, stride_cvdh,
                          stride_cvdl, BLOCK_DV, False, V_LO_ONE)
        cv_ty = v_cache_ptr.dtype.element_ty
        tl.store(v_cache_ptr + v_off,
                 _quantize(v, v_scale_ptr, h, FP8, FMAX, MBITS, EMIN, cv_ty), mask=v_mask)


def unsupported(**_):
    """Reasons this kernel cannot serve the call ([] = it can): every layout and dtype."""
    return []


def duplicate_mask(slot_mapping: torch.Tensor) -> torch.Tensor:
    """uint8 [T]: 1 where another token names the same slot, on the slots' device without a host
    sync (a sort and two binary searches: the size of each run of equal slots)."""
    ordered = torch.sort(slot_mapping).values
    runs = torch.searchsorted(ordered, slot_mapping, right=True) \
        - torch.searchsorted(ordered, slot_mapping)
    return (runs > 1).view(torch.uint8)


def run(k, v, k_cache, v_cache, slot_mapping, *, layout, geom, k_scale=None, v_scale=None,
        errors=None):
    """Write k [T, Hkv, D] and v [T, Hkv, DV] to the cache slots (v and v_cache None: an MLA
    latent cache, K only); k_scale/v_scale: float32 [Hkv] for fp8; errors: optional int32 [1],
    += the number of skipped tokens."""
    t, hkv, d = k.shape
    has_v = v is not None
    if not has_v:  # stand-ins: HAS_V compiles the V half out, and the replay key holds it
        v, v_cache, v_scale = k, k_cache, k_scale
    dv = v.shape[2]
    if t == 0:
        return
    dev, rec = k.device, None
    guard = config.get("PAGEDATTN_DEV_GUARDS")
    dup_mask = guard and t > PAIRWISE_MAX_TOKENS
    dup = duplicate_mask(slot_mapping) if dup_mask else None
    replay_on = _replay.enabled(dev)
    if replay_on:  # eager fast path (_replay.py): the key leaves the token count out
        cur = torch.cuda.current_device()
        key = _replay.store_key(k, v, k_cache, v_cache, slot_mapping, layout, k_scale, v_scale,
                                cur) + (guard, dup_mask, _replay.alignment(errors, dup))
        own = _replay.store_tensors(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
        own.update(dup=dup, errors=errors)
        rep = _replay.lookup(key)
        if rep is not None:
            rep(own, dev, torch._C._cuda_getCurrentRawStream(cur), grid=(t, hkv, 1))
            return
    fp8 = k_cache.dtype in FP8_DTYPES
    ks, vs = L.k_strides(k_cache, layout), L.v_strides(v_cache, layout)
    dummy = torch.empty(1, dtype=torch.float32, device=k.device)
    if replay_on:
        rec = _replay.store_recorder(own, dummy)
    # grid: one program per (token, KV head)
    _replay.launch(
        rec, _store_kv_kernel, (t, hkv),
        k_ptr=k, v_ptr=v, k_cache_ptr=k_cache, v_cache_ptr=v_cache, slot_mapping_ptr=slot_mapping,
        dup_ptr=dummy if dup is None else dup, errors_ptr=dummy if errors is None else errors,
        k_scale_ptr=k_scale if fp8 else dummy, v_scale_ptr=v_scale if fp8 else dummy,
        num_slots=geom.num_blocks * geom.block_size,
        stride_kt=k.stride(0), stride_kh=k.stride(1), stride_vt=v.stride(0),
        stride_vh=v.stride(1),
        stride_ckb=ks.block, stride_ckt=ks.token, stride_ckh=ks.head, stride_ckdh=ks.dim_hi,
        stride_ckdl=ks.dim_lo,
        stride_cvb=vs.block, stride_cvt=vs.token, stride_cvh=vs.head, stride_cvdh=vs.dim_hi,
        stride_cvdl=vs.dim_lo,
        D=d, BS=geom.block_size, BLOCK_D=triton.next_power_of_2(d), K_X=ks.x,
        K_SPLIT=ks.x < d, K_LO_ONE=ks.dim_lo == 1, V_LO_ONE=vs.dim_lo == 1, FP8=fp8,
        FMAX=float(torch.finfo(k_cache.dtype).max) if fp8 else 0.0,
        MBITS=_FP8_GRID.get(k_cache.dtype, (0, 0))[0], EMIN=_FP8_GRID.get(k_cache.dtype, (0, 0))[1],
        GUARD=guard, DUP_MASK=dup_mask, HAS_ERR=guard and errors is not None, BLOCK_T=BLOCK_T,
        DV=dv, BLOCK_DV=triton.next_power_of_2(dv), HAS_V=has_v, num_warps=1)
    if rec is not None and (replay := rec.replay()) is not None:
        _replay.store(key, replay)
