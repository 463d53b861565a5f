"""The two-stage key loop of the Triton extend kernel (``extend._extend_fwd`` without
ONE_LOOP: custom masks, windows, pages that are not a power of 2, and the new-key stage of calls
with k_new/v_new): :func:`_stage` walks one stage's keys, :func:`_step` folds one tile."""
import triton
import triton.language as tl

from pagedattn.triton_kernels._common import (LOG2E, alibi_bias, kv_offset, online_softmax_step,
                                              soft_cap, visible)

_LOG2E = tl.constexpr(LOG2E)  # jit code may read globals only as constexpr


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    # IEEE (fp32 inputs): full precision; TF32 would miss the 1e-5 tolerance
    return tl.dot(a, b, input_precision="ieee" if IEEE else None)


@triton.jit
def _load(ptrs, mask, MASKED: tl.constexpr, PAD_D: tl.constexpr, d_mask):
    """Masked load only where a mask can be false: the full tiles stay unpredicated."""
    if MASKED:
        return tl.load(ptrs, mask=mask, other=0.0)
    elif PAD_D:
        return tl.load(ptrs, mask=d_mask, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _step(acc, m_i, l_i, q, k, v, vis, jpos, row_pos, qk_scale, logit_cap, slope2,
          MASKED: tl.constexpr, HAS_CAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
          IEEE: tl.constexpr):
    """One online-softmax update in base 2. q [M, D_P], k [D_P, N], v [N, DV_P]; acc [M, DV_P]."""
    qk = _dot(q, k, IEEE)  # [M, N] fp32
    if HAS_CAP:
        s = soft_cap(qk * qk_scale, logit_cap) * _LOG2E
    else:
        s = qk * (qk_scale * _LOG2E)
    if HAS_ALIBI:  # slope2 is already in base 2
        s += alibi_bias(slope2[:, None], jpos[None, :], row_pos[:, None])
    if MASKED:
        s = tl.where(vis, s, float("-inf"))
    m_i, l_i, alpha, p = online_softmax_step(m_i, l_i, s)  # an all-masked row stays -inf / 0
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
    return acc, m_i, l_i


@triton.jit
def _stage(acc, m_i, l_i, q, lo, hi, n_keys, key_base, row_pos, row_ok, slope2, qk_scale,
           logit_cap, inv_vs, window, kvh, q0, mask_row,
           bt_row, kc_ptr, vc_ptr, kn_ptr, vn_ptr, mask_ptr,
           stride_kb: tl.int64, stride_kt: tl.int64, stride_kh: tl.int64, stride_kdh: tl.int64,
           stride_kdl: tl.int64, stride_vb: tl.int64, stride_vt: tl.int64, stride_vh: tl.int64,
           stride_vdh: tl.int64, stride_vdl: tl.int64, stride_nt: tl.int64, stride_nh: tl.int64,
           stride_vnt: tl.int64, stride_vnh: tl.int64,
           K_X: tl.constexpr, K_SPLIT: tl.constexpr, K_LO_ONE: tl.constexpr,
           V_LO_ONE: tl.constexpr,
           PAGE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
           HEAD_DIM_P: tl.constexpr, MASKED: tl.constexpr, STAGE1: tl.constexpr,
           FROM_NEW: tl.constexpr, TRIANGLE: tl.constexpr, HAS_WINDOW: tl.constexpr,
           HAS_MASK: tl.constexpr,
           HAS_CAP: tl.constexpr, HAS_ALIBI: tl.constexpr, KV_FP8: tl.constexpr,
           IEEE: tl.constexpr, HEAD_DIM_V: tl.constexpr, HEAD_DIM_VP: tl.constexpr):
    """Keys [lo, hi) of one stage, relative index r in [0, n_keys); absolute position key_base + r.

    FROM_NEW: K/V rows q0 + r of k_new/v_new; else cache positions key_base + r via the table.
    TRIANGLE: stage 2's causal rule j <= p (r <= query index: the shifted mask minus the prefix).
    """
    d = tl.arange(0, HEAD_DIM_P)  # [D_P] K's columns
    d_ok = d < HEAD_DIM
    e = tl.arange(0, HEAD_DIM_VP)  # [DV_P] V's columns
    e_ok = e < HEAD_DIM_V
    PAD_D: tl.constexpr = HEAD_DIM_P != HEAD_DIM
    PAD_DV: tl.constexpr = HEAD_DIM_VP != HEAD_DIM_V
    ONE_PAGE: tl.constexpr = STAGE1 and (PAGE >= BLOCK_N)  # key_base 0: page-aligned tiles
    for start in range(lo, hi, BLOCK_N):
        r = start + tl.arange(0, BLOCK_N)  # [N] relative key index
        r_ok = r < n_keys
        jpos = key_base + r  # [N] absolute key position
        if FROM_NEW:
            row = (q0 + r).to(tl.int64)  # [N] rows of k_new/v_new
            k_off = row[None, :] * stride_nt + kvh * stride_nh + d[:, None]  # [D_P, N]
            v_off = row[:, None] * stride_vnt + kvh * stride_vnh + e[None, :]  # [N, DV_P]
            k = _load(kn_ptr + k_off, r_ok[None, :] & d_ok[:, None], MASKED, PAD_D, d_ok[:, None])
            v = _load(vn_ptr + v_off, r_ok[:, None] & e_ok[None, :], MASKED, PAD_DV, e_ok[None, :])
            if KV_FP8:  # k_new/v_new are not quantised: undo the v_scale the epilogue applies
                v = (v.to(tl.float32) * inv_vs).to(q.dtype)
        else:
            if ONE_PAGE:  # stage 1, page >= tile: the tile lies in one page, one table entry
                blk = tl.load(bt_row + (key_base + start) // PAGE).to(tl.int64)  # scalar
            else:  # per-token ids, masked to the used range of the table
                blk = tl.load(bt_row + jpos // PAGE, mask=r_ok, other=0).to(tl.int64)  # [N]
            tin = jpos % PAGE  # [N] token within its page
            if ONE_PAGE:
                bk = blk
                bv = blk
            else:
                bk = blk[None, :]
                bv = blk[:, None]
            k_off = kv_offset(bk, tin[None, :], kvh, d[:, None], stride_kb, stride_kt, stride_kh,
                              stride_kdh, stride_kdl, K_X, K_SPLIT, K_LO_ONE)  # [D_P, N]
            v_off = kv_offset(bv, tin[:, None], kvh, e[None, :], stride_vb, stride_vt, stride_vh,
                              stride_vdh, stride_vdl, HEAD_DIM_VP, False, V_LO_ONE)  # [N, DV_P]
            k = _load(kc_ptr + k_off, r_ok[None, :] & d_ok[:, None], MASKED, PAD_D, d_ok[:, None])
            v = _load(vc_ptr + v_off, r_ok[:, None] & e_ok[None, :], MASKED, PAD_DV, e_ok[None, :])
            if KV_FP8:  # dequantised by the folded scales; the dot runs in q's dtype
                k = k.to(q.dtype)
                v = v.to(q.dtype)
        vis = r_ok[None, :]  # [1, N]; [M, N] once a row-dependent rule applies
        if MASKED:
            vis = visible(jpos[None, :], row_pos[:, None], key_base + n_keys, window, TRIANGLE,
                          HAS_WINDOW)  # [M, N]
            if HAS_MASK:  # request's [Lq, Lk] row-major block; padded rows never read
                m_off = mask_row[:, None] + jpos[None, :]  # [M, N] int64
                cm = tl.load(mask_ptr + m_off, mask=row_ok[:, None] & r_ok[None, :], other=0)
                vis = vis & (cm != 0)
        acc, m_i, l_i = _step(acc, m_i, l_i, q, k, v, vis, jpos, row_pos, qk_scale, logit_cap,
                              slope2, MASKED, HAS_CAP, HAS_ALIBI, IEEE)
    return acc, m_i, l_i


# --- kernel ------------------------------------------------------------------------------------
