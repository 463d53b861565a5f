"""Key-loop variants of the extend kernel (``PAGEDATTN_EXTEND_VARIANT``).

Scope: no custom mask, no window, a power-of-2 page. By default (``gluon``) the calls the Gluon
sm_90 kernel serves run it (``_extend_gluon.py``; H200 session 11: 63.6 / 61.4 / 51.3 / 50.8 % of
the matmul rate from graphs); the others run ``early`` (TRITON_DEFAULT), with
64-key masked (diagonal) tiles on sm_90 (``_extend_configs``: ``block_nm``). H200, triton 3.6,
session 10 (bench/results/2026-12-01-h200-s10/extend_variants_03f9a32.md), % of the matmul rate on
the four issue shapes: ``pipe_fma`` 53.4-54.2 / 41.4 / 43.6 / 51.5-51.7, ``early`` 54.0 / 41.6 /
43.5 / 51.9 (the same within noise), with 64-key masked tiles 57.1 / 45.6 / 47.1 / 55.5; 32-key
masked tiles lose (39-46). Earlier: ``pipe_fma`` 41-54 % against 35-42 % for ``onepass`` and
32-39 % for the two-stage loop (bench/results/2026-11-30-h200-s3/extend_variants.md). Calls with
k_new/v_new run the variant over their cached prefix, then the two-stage loop's new-key stage
(bench/results/2026-11-30-h200-s4/extend_variants_k_new.md: 40-54 % against 33-51 %). Every
other call runs the two-stage loop of ``extend.py`` (``twostage``; launcher: :func:`resolve`).
``default`` names :data:`DEFAULT`.

Every variant walks the keys in ONE pass over absolute positions, so each tile start is a
multiple of BLOCK_N (page-aligned when PAGE divides BLOCK_N or BLOCK_N divides PAGE):

  keys:  0 ...................... full | full ........ hi = min(Lk, P + tok0 + BLOCK_Q)
         unmasked tiles (prefix and     | masked tiles: the block's diagonal
         new keys below the diagonal)   | (causal j <= p, j < Lk)

Ladder (each adds one change; bench/NOTES_extend.md has the offline SASS counts behind it):

  onepass   one pass, per-token block ids gathered inside the loop (the default's addressing)
  pages     + BLOCK_N // PAGE ids per tile; int64 row bases by broadcasting [NP, PAGE]; the
            loop-invariant head/dim offset hoisted into a [D, 1] / [1, D] int64 tile
  pipe      + the ids of tile t+1 loaded in iteration t (carried): no K/V address depends on a
            load of the same iteration, so the sm_90 pipeliner keeps K/V multi-buffered
            (async_wait num=2 with 3 stages instead of num=0)
  pipe_fma  + dense-FA2 softmax on unmasked tiles: row max of the raw qk, one FFMA per logit
  gluon     the default: a separate sm_90 kernel in Gluon (_extend_gluon.py), a producer warpgroup
            gathering the pages and two consumer warpgroups; calls it cannot serve (other GPUs,
            other triton versions, options, fewer than 128 query rows) run TRITON_DEFAULT
  early     + the first tile's block ids loaded before anything else, and no early-exit branch
            (cu_seqlens -> exit -> seq_lens/ids -> K/V was three dependent round trips before
            the first tile; cu_seqlens | seq_lens | ids -> K/V can be two). Measured level with
            pipe_fma: ptxas (sm_90) still places most of the id loads after cu_seqlens is used
"""
import os

import triton
import triton.language as tl

from pagedattn.triton_kernels._common import (LOG2E, alibi_bias, kv_offset, online_softmax_step,
                                              soft_cap, visible)

_LOG2E = tl.constexpr(LOG2E)

VARIANTS = {"twostage": 0, "onepass": 1, "pages": 2, "pipe": 3, "pipe_fma": 4, "early": 5,
            "gluon": 6}
GLUON = "gluon"  # a separate kernel (_extend_gluon.py); calls it cannot serve run TRITON_DEFAULT
DEFAULT = "gluon"  # on sm_90 under triton 3.6 where it applies; everywhere else TRITON_DEFAULT
TRITON_DEFAULT = "early"  # the Triton loop's default (calls the Gluon kernel cannot serve)
ENV = "PAGEDATTN_EXTEND_VARIANT"


def requested() -> str:
    """The variant named by PAGEDATTN_EXTEND_VARIANT (DEFAULT if unset); ValueError if unknown."""
    name = os.environ.get(ENV, "") or "default"
    name = DEFAULT if name == "default" else name
    if name not in VARIANTS:
        raise ValueError(f"{ENV}={name!r}: expected 'default' or one of {sorted(VARIANTS)}")
    return name


def resolve(*, has_mask: bool, has_window: bool, page: int) -> int:
    """VARIANT constexpr for this call: the requested one where it applies, else 0 (default).

    A power-of-2 page keeps every BLOCK_N-aligned tile page-aligned (PAGE | BLOCK_N or
    BLOCK_N | PAGE), whatever tile the config picks. Calls with k_new/v_new run the variant's
    key loop over their cached prefix (:func:`one_pass` on keys [0, prefix), non-causal), then
    the two-stage loop's new-key stage (measured, H200 2026-11-30).
    """
    name = requested()
    v = VARIANTS[TRITON_DEFAULT if name == GLUON else name]
    pow2 = page > 0 and page & (page - 1) == 0
    return v if v and not has_mask and not has_window and pow2 else 0


def tile_config(cfg, variant: int, family: str, elem_bytes: int = 2):
    """The carried-id variants need >= 3 stages on sm_80+ to keep two K/V tiles in flight
    (16-bit inputs only: fp32 tiles at 3 stages overflow shared memory, 288 KB on the H200)."""
    if variant >= VARIANTS["pipe"] and family in ("sm90", "sm80") and cfg.num_stages < 3 \
            and elem_bytes <= 2:
        return cfg._replace(num_stages=3)
    return cfg


GLUON_TRITON = "3.6."  # Gluon is experimental: its API changes between releases (3.9 renamed
# the cp.async call and dropped thread_barrier); the kernel is written and GPU-tested for 3.6


def gluon_kernel():
    """The Gluon module (``PAGEDATTN_EXTEND_VARIANT=gluon``), or None under another triton."""
    if not triton.__version__.startswith(GLUON_TRITON):
        return None
    from pagedattn.triton_kernels import _extend_gluon
    return _extend_gluon


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _page_ids(bt_row, start, n_pages, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """int64 block ids [NP] of the tile starting at key start (a multiple of BLOCK_N).

    NP = BLOCK_N // PAGE (1 when one page holds the tile). Pages >= n_pages (past the used
    range of the table) read as block 0 and only feed masked or never-issued loads.
    """
    NP: tl.constexpr = BLOCK_N // PAGE if PAGE < BLOCK_N else 1
    pg = start // PAGE + tl.arange(0, NP)  # [NP] page index within the request
    return tl.load(bt_row + pg, mask=pg < n_pages, other=0).to(tl.int64)


@triton.jit
def _rows(ids, start, stride_b: tl.int64, stride_t: tl.int64, PAGE: tl.constexpr,
          BLOCK_N: tl.constexpr):
    """int64 offsets [N] of the tile's key rows: block term + token term, by broadcasting."""
    NP: tl.constexpr = BLOCK_N // PAGE if PAGE < BLOCK_N else 1
    TPP: tl.constexpr = PAGE if PAGE < BLOCK_N else BLOCK_N  # tile tokens per page
    # Reshape the ids only and multiply by the strides after: triton 3.6 (the H200's) has no
    # axis info for tt.reshape (divisibility 1), so reshaped offsets made K/V 2-byte loads that
    # cp.async cannot take (no pipelining); id * stride keeps the stride's divisibility.
    blk = tl.reshape(tl.broadcast_to(ids[:, None], [NP, TPP]), [BLOCK_N])  # [N] id per token
    tok = (start % PAGE + tl.arange(0, BLOCK_N) % TPP).to(tl.int64)  # [N] token in its page
    return blk * stride_b + tok * stride_t


@triton.jit
def _tiles(acc, m_i, l_i, q, lo, hi, lk, row_pos, slope2, qk_scale, logit_cap, bt_row, nxt,
           kc_h, vc_h, dk, dv, d_ok,
           stride_kb: tl.int64, stride_kt: tl.int64, stride_vb: tl.int64, stride_vt: tl.int64,
           VARIANT: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
           PAGE: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr,
           HAS_CAP: tl.constexpr, HAS_ALIBI: tl.constexpr, KV_FP8: tl.constexpr,
           IEEE: tl.constexpr):
    """Keys [lo, hi) (absolute positions, lo a multiple of BLOCK_N) folded into (acc, m_i, l_i).

    kc_h / vc_h: cache base + head offset; dk [D_P, 1] / dv [1, D_P]: int64 dim offsets.
    nxt: the block ids of the tile at ``lo`` (:func:`_page_ids`; carried-id variants only).
    """
    n_pages = (lk + PAGE - 1) // PAGE
    n = tl.arange(0, BLOCK_N)
    k_dmask = d_ok[:, None]
    v_dmask = d_ok[None, :]
    for start in range(lo, hi, BLOCK_N):
        jpos = start + n  # [N] absolute key position
        if VARIANT == 1:  # per-token ids, as the default loop
            blk = tl.load(bt_row + jpos // PAGE, mask=jpos < lk, other=0).to(tl.int64)  # [N]
            tin = (jpos % PAGE).to(tl.int64)
            rk = blk * stride_kb + tin * stride_kt  # [N]
            rv = blk * stride_vb + tin * stride_vt
        else:
            if VARIANT == 2:  # per-page ids of this tile, loaded here
                ids = _page_ids(bt_row, start, n_pages, PAGE, BLOCK_N)
            else:  # loaded one iteration earlier; fetch the next tile's now
                ids = nxt
                nxt = _page_ids(bt_row, start + BLOCK_N, n_pages, PAGE, BLOCK_N)
            rk = _rows(ids, start, stride_kb, stride_kt, PAGE, BLOCK_N)  # [N]
            rv = _rows(ids, start, stride_vb, stride_vt, PAGE, BLOCK_N)
        k_ptrs = kc_h + (rk[None, :] + dk)  # [D_P, N]
        v_ptrs = vc_h + (rv[:, None] + dv)  # [N, D_P]
        if MASKED:
            k = tl.load(k_ptrs, mask=(jpos < lk)[None, :] & k_dmask, other=0.0)
            v = tl.load(v_ptrs, mask=(jpos < lk)[:, None] & v_dmask, other=0.0)
        elif PAD_D:
            k = tl.load(k_ptrs, mask=k_dmask, other=0.0)
            v = tl.load(v_ptrs, mask=v_dmask, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        if KV_FP8:
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        qk = _dot(q, k, IEEE)  # [M, N] fp32
        FMA: tl.constexpr = VARIANT >= 4 and not MASKED and not HAS_CAP and not HAS_ALIBI
        if FMA:  # every key visible: m_new is finite, no -inf guard needed
            sc = qk_scale * _LOG2E
            m_new = tl.maximum(m_i, tl.max(qk, 1) * sc)  # [M]
            p = tl.math.exp2(qk * sc - m_new[:, None])  # [M, N]; one FFMA + EX2 per logit
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        else:
            if HAS_CAP:
                s = soft_cap(qk * qk_scale, logit_cap) * _LOG2E
            else:
                s = qk * (qk_scale * _LOG2E)
            if HAS_ALIBI:
                s += alibi_bias(slope2[:, None], jpos[None, :], row_pos[:, None])
            if MASKED:
                vis = visible(jpos[None, :], row_pos[:, None], lk, 0, CAUSAL, False)  # [M, N]
                s = tl.where(vis, s, float("-inf"))
            m_i, l_i, alpha, p = online_softmax_step(m_i, l_i, s)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
    return acc, m_i, l_i


@triton.jit
def first_ids(bt_row, bt_w, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, VARIANT: tl.constexpr):
    """The block ids of a request's first key tile, for :func:`one_pass` (``early``).

    Masked by the table's width only, so the load needs nothing but the program ids and the
    kernel can issue it beside its first load (cu_seqlens). Ids past the request's pages feed
    only masked loads or a loop that does not run (an unmasked tile lies below lk).
    """
    if VARIANT >= 5:
        ids = _page_ids(bt_row, 0, bt_w, PAGE, BLOCK_N)
    else:  # unused (the other variants load the first ids in one_pass)
        ids = tl.zeros([BLOCK_N // PAGE if PAGE < BLOCK_N else 1], tl.int64)
    return ids


@triton.jit
def one_pass(acc, m_i, l_i, q, prefix, tok0, lk, kvh, row_pos, slope2, qk_scale, logit_cap,
             bt_row, bt_w, ids0, kc_ptr, vc_ptr,
             stride_kb: tl.int64, stride_kt: tl.int64, stride_kh: tl.int64,
             stride_kdh: tl.int64, stride_kdl: tl.int64, stride_vb: tl.int64,
             stride_vt: tl.int64, stride_vh: tl.int64, stride_vdh: tl.int64,
             stride_vdl: tl.int64,
             K_X: tl.constexpr, K_SPLIT: tl.constexpr, K_LO_ONE: tl.constexpr,
             V_LO_ONE: tl.constexpr, VARIANT: tl.constexpr, PAGE: tl.constexpr,
             BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NM: tl.constexpr,
             HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, CAUSAL: tl.constexpr,
             HAS_CAP: tl.constexpr, HAS_ALIBI: tl.constexpr, KV_FP8: tl.constexpr,
             IEEE: tl.constexpr, live):
    """All keys of one query block in one pass (see the module docstring's diagram). ids0: the
    first tile's block ids (:func:`first_ids`).

    Unmasked tiles hold BLOCK_N keys, masked ones BLOCK_NM (a divisor of BLOCK_N: the diagonal
    of a BLOCK_Q-token block spans BLOCK_Q + (position mod BLOCK_N) keys, often far fewer than
    BLOCK_N). ``live`` false (a block past its request's Lq): no key at all.
    """
    d = tl.arange(0, HEAD_DIM_P)
    d_ok = d < HEAD_DIM
    zero = kvh * 0  # int64 0: kv_offset wants an int64 block term
    # loop-invariant parts: head term in the base pointer, dim terms as int64 tiles
    kc_h = kc_ptr + kvh * stride_kh
    vc_h = vc_ptr + kvh * stride_vh
    dk = kv_offset(zero, 0, 0, d[:, None], stride_kb, stride_kt, stride_kh, stride_kdh,
                   stride_kdl, K_X, K_SPLIT, K_LO_ONE)  # [D_P, 1]
    dv = kv_offset(zero, 0, 0, d[None, :], stride_vb, stride_vt, stride_vh, stride_vdh,
                   stride_vdl, HEAD_DIM_P, False, V_LO_ONE)  # [1, D_P]
    if CAUSAL:
        hi = tl.minimum(lk, prefix + tok0 + BLOCK_Q)  # past the block's last query position
        full = (prefix + tok0 + 1) // BLOCK_N * BLOCK_N  # keys every row of the block sees
    else:
        hi = lk
        full = lk // BLOCK_N * BLOCK_N
    hi = tl.where(live, hi, 0)
    full = tl.minimum(full, hi)
    PAD_D: tl.constexpr = HEAD_DIM_P != HEAD_DIM
    for MASKED in tl.static_range(2):
        if MASKED:
            ids = _page_ids(bt_row, full, bt_w, PAGE, BLOCK_NM)
        elif VARIANT >= 5:
            ids = ids0
        else:
            ids = _page_ids(bt_row, 0, bt_w, PAGE, BLOCK_N)
        acc, m_i, l_i = _tiles(
            acc, m_i, l_i, q, full if MASKED else 0, hi if MASKED else full, lk, row_pos,
            slope2, qk_scale, logit_cap, bt_row, ids, kc_h, vc_h, dk, dv, d_ok, stride_kb,
            stride_kt, stride_vb, stride_vt, VARIANT, MASKED == 1, CAUSAL, PAGE,
            BLOCK_NM if MASKED else BLOCK_N, PAD_D, HAS_CAP, HAS_ALIBI, KV_FP8, IEEE)
    return acc, m_i, l_i

