"""The one-pass key loop of the Triton extend kernel (``extend._extend_fwd`` with ONE_LOOP).

Scope: no custom mask, no window, a power-of-2 page (:func:`serves`); other calls run the
two-stage loop of ``extend.py``. Calls with k_new/v_new run this loop over their cached prefix,
then the two-stage loop's new-key stage. On sm_90 under triton 3.6 the Gluon kernel
(``_extend_gluon.py``) serves the calls it can (:func:`kernel`); this loop serves the rest.

The loop walks the keys in ONE pass over absolute positions, so each tile start is a multiple
of BLOCK_N (page-aligned when PAGE divides BLOCK_N or BLOCK_N divides PAGE):

  keys:  0 ...................... full | full ........ hi = min(Lk, P + tok0 + BLOCK_Q)
         unmasked tiles (prefix and     | masked tiles of BLOCK_NM keys: the block's diagonal
         new keys below the diagonal)   | (causal j <= p, j < Lk)

What makes it fast (offline sm_90 SASS and H200 measurements; docs/performance.md):
  * BLOCK_N // PAGE ids per tile, int64 row bases by broadcasting [NP, PAGE]; the loop-invariant
    head/dim offset hoisted into a [D, 1] / [1, D] int64 tile;
  * the ids of tile t+1 loaded in iteration t (carried): no K/V address depends on a load of the
    same iteration, so the sm_90 pipeliner keeps K/V multi-buffered (async_wait num=2 with 3
    stages instead of num=0);
  * dense-FA2 softmax on unmasked tiles: row max of the raw qk, one FFMA per logit;
  * the first tile's block ids loaded before anything else and no early-exit branch
    (cu_seqlens | seq_lens | ids -> K/V: two dependent round trips before the first tile);
  * 64-key masked (diagonal) tiles on sm_90 (``_extend_configs``: block_nm), +3-4 points of the
    matmul rate over 128-key ones.
"""
import triton
import triton.language as tl

from pagedattn import config
from pagedattn.triton_kernels._common import (LOG2E, alibi_bias, kv_offset, online_softmax_step,
                                              soft_cap, visible)

_LOG2E = tl.constexpr(LOG2E)
GLUON_TRITON = "3.6."  # Gluon is experimental: its API changes between releases (3.9 renamed
# the cp.async call and dropped thread_barrier); the kernel is written and GPU-tested for 3.6


def kernel() -> str:
    """``PAGEDATTN_DEV_EXTEND_KERNEL`` (internal): ``auto`` and ``gluon`` run the Gluon sm_90
    kernel where it can serve the call, ``triton`` always the Triton kernel."""
    return config.get("PAGEDATTN_DEV_EXTEND_KERNEL")


def serves(*, has_mask: bool, has_window: bool, page: int) -> bool:
    """Whether this loop serves a call (ONE_LOOP): no custom mask, no window, a power-of-2 page
    (PAGE | BLOCK_N or BLOCK_N | PAGE keeps every BLOCK_N-aligned tile page-aligned)."""
    pow2 = page > 0 and page & (page - 1) == 0
    return not has_mask and not has_window and pow2


def tile_config(cfg, family: str, elem_bytes: int = 2):
    """The carried ids need >= 3 stages on sm_80+ to keep two K/V tiles in flight (16-bit inputs
    only: fp32 tiles at 3 stages overflow shared memory, 288 KB on the H200)."""
    if family in ("sm90", "sm80") and cfg.num_stages < 3 and elem_bytes <= 2:
        return cfg._replace(num_stages=3)
    return cfg


def gluon_kernel():
    """The Gluon module, or None under another triton or when the internal override asks for
    the Triton kernel."""
    if kernel() == "triton" or not triton.__version__.startswith(GLUON_TRITON):
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
           kc_h, vc_h, dk, dv, d_ok, dv_ok,
           stride_kb: tl.int64, stride_kt: tl.int64, stride_vb: tl.int64, stride_vt: tl.int64,
           MASKED: tl.constexpr, CAUSAL: tl.constexpr,
           PAGE: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr, PAD_DV: tl.constexpr,
           HAS_CAP: tl.constexpr, HAS_ALIBI: tl.constexpr, KV_FP8: tl.constexpr,
           IEEE: tl.constexpr):
    """Keys [lo, hi) (absolute positions, lo a multiple of BLOCK_N) folded into (acc, m_i, l_i).

    kc_h / vc_h: cache base + head offset; dk [D_P, 1] / dv [1, DV_P]: int64 dim offsets
    (d_ok / dv_ok: the columns inside K's / V's head dim).
    nxt: the block ids of the tile at ``lo`` (:func:`_page_ids`).
    """
    n_pages = (lk + PAGE - 1) // PAGE
    n = tl.arange(0, BLOCK_N)
    k_dmask = d_ok[:, None]
    v_dmask = dv_ok[None, :]
    for start in range(lo, hi, BLOCK_N):
        jpos = start + n  # [N] absolute key position
        ids = nxt  # loaded one iteration earlier; fetch the next tile's now
        nxt = _page_ids(bt_row, start + BLOCK_N, n_pages, PAGE, BLOCK_N)
        rk = _rows(ids, start, stride_kb, stride_kt, PAGE, BLOCK_N)  # [N]
        rv = _rows(ids, start, stride_vb, stride_vt, PAGE, BLOCK_N)
        k_ptrs = kc_h + (rk[None, :] + dk)  # [D_P, N]
        v_ptrs = vc_h + (rv[:, None] + dv)  # [N, D_P]
        if MASKED:
            k = tl.load(k_ptrs, mask=(jpos < lk)[None, :] & k_dmask, other=0.0)
            v = tl.load(v_ptrs, mask=(jpos < lk)[:, None] & v_dmask, other=0.0)
        else:
            if PAD_D:
                k = tl.load(k_ptrs, mask=k_dmask, other=0.0)
            else:
                k = tl.load(k_ptrs)
            if PAD_DV:
                v = tl.load(v_ptrs, mask=v_dmask, other=0.0)
            else:
                v = tl.load(v_ptrs)
        if KV_FP8:
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        qk = _dot(q, k, IEEE)  # [M, N] fp32
        FMA: tl.constexpr = not MASKED and not HAS_CAP and not HAS_ALIBI
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
def first_ids(bt_row, bt_w, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """The block ids of a request's first key tile, for :func:`one_pass`.

    Masked by the table's width only, so the load needs nothing but the program ids and the
    kernel can issue it beside its first load (cu_seqlens). Ids past the request's pages feed
    only masked loads or a loop that does not run (an unmasked tile lies below lk).
    """
    return _page_ids(bt_row, 0, bt_w, PAGE, BLOCK_N)


@triton.jit
def one_pass(acc, m_i, l_i, q, prefix, tok0, lk, kvh, row_pos, slope2, qk_scale, logit_cap,
             bt_row, bt_w, ids0, kc_ptr, vc_ptr,
             stride_kb: tl.int64, stride_kt: tl.int64, stride_kh: tl.int64,
             stride_kdh: tl.int64, stride_kdl: tl.int64, stride_vb: tl.int64,
             stride_vt: tl.int64, stride_vh: tl.int64, stride_vdh: tl.int64,
             stride_vdl: tl.int64,
             K_X: tl.constexpr, K_SPLIT: tl.constexpr, K_LO_ONE: tl.constexpr,
             V_LO_ONE: tl.constexpr, PAGE: tl.constexpr,
             BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NM: tl.constexpr,
             HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, CAUSAL: tl.constexpr,
             HAS_CAP: tl.constexpr, HAS_ALIBI: tl.constexpr, KV_FP8: tl.constexpr,
             IEEE: tl.constexpr, live, HEAD_DIM_V: tl.constexpr, HEAD_DIM_VP: tl.constexpr):
    """All keys of one query block in one pass (see the module docstring's diagram). ids0: the
    first tile's block ids (:func:`first_ids`).

    Unmasked tiles hold BLOCK_N keys, masked ones BLOCK_NM (a divisor of BLOCK_N: the diagonal
    of a BLOCK_Q-token block spans BLOCK_Q + (position mod BLOCK_N) keys, often far fewer than
    BLOCK_N). ``live`` false (a block past its request's Lq): no key at all.
    """
    d = tl.arange(0, HEAD_DIM_P)
    d_ok = d < HEAD_DIM
    e = tl.arange(0, HEAD_DIM_VP)  # V's columns
    dv_ok = e < HEAD_DIM_V
    zero = kvh * 0  # int64 0: kv_offset wants an int64 block term
    # loop-invariant parts: head term in the base pointer, dim terms as int64 tiles
    kc_h = kc_ptr + kvh * stride_kh
    vc_h = vc_ptr + kvh * stride_vh
    dk = kv_offset(zero, 0, 0, d[:, None], stride_kb, stride_kt, stride_kh, stride_kdh,
                   stride_kdl, K_X, K_SPLIT, K_LO_ONE)  # [D_P, 1]
    dv = kv_offset(zero, 0, 0, e[None, :], stride_vb, stride_vt, stride_vh, stride_vdh,
                   stride_vdl, HEAD_DIM_VP, False, V_LO_ONE)  # [1, DV_P]
    if CAUSAL:
        hi = tl.minimum(lk, prefix + tok0 + BLOCK_Q)  # past the block's last query position
        full = (prefix + tok0 + 1) // BLOCK_N * BLOCK_N  # keys every row of the block sees
    else:
        hi = lk
        full = lk // BLOCK_N * BLOCK_N
    hi = tl.where(live, hi, 0)
    full = tl.minimum(full, hi)
    PAD_D: tl.constexpr = HEAD_DIM_P != HEAD_DIM
    PAD_DV: tl.constexpr = HEAD_DIM_VP != HEAD_DIM_V
    for MASKED in tl.static_range(2):
        if MASKED:
            ids = _page_ids(bt_row, full, bt_w, PAGE, BLOCK_NM)
        else:
            ids = ids0
        acc, m_i, l_i = _tiles(
            acc, m_i, l_i, q, full if MASKED else 0, hi if MASKED else full, lk, row_pos,
            slope2, qk_scale, logit_cap, bt_row, ids, kc_h, vc_h, dk, dv, d_ok, dv_ok, stride_kb,
            stride_kt, stride_vb, stride_vt, MASKED == 1, CAUSAL, PAGE,
            BLOCK_NM if MASKED else BLOCK_N, PAD_D, PAD_DV, HAS_CAP, HAS_ALIBI, KV_FP8, IEEE)
    return acc, m_i, l_i

