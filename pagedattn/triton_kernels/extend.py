"""Extend (prefix-prefill) attention over the paged KV cache: Triton kernel and launcher.

Request b owns query rows [cu[b], cu[b+1]) (Lq) and Lk = seq_lens[b] keys; its prefix is
P = Lk - Lq. Query i sees key j iff j <= i + P (docs/layout.md). The kernel walks the keys in two
stages (docs/performance.md, "Extend"):

  keys:   0 ........................ P | P ................... Lk
  stage 1 dense rectangle, no mask     | stage 2 lower triangle, loop ends at the diagonal
  (paged gather; only the last partial | (paged gather of positions P.., or the contiguous
   tile, a window or a custom mask     |  k_new/v_new rows; mask only on the diagonal tiles)
   need a mask)                        |

Grid: (cdiv(max Lq, BLOCK_Q), num_kv_heads, num_seqs). A program owns BLOCK_M = BLOCK_Q x GROUP_P
rows (query token major, the GQA heads of one KV head minor), so every KV tile is loaded once per
head group and fed to one tl.dot. Programs past a request's Lq exit at once; query blocks are
issued last-first so the longest (most keys) start earliest.

On sm_90 under triton 3.6, :func:`run` hands the calls it can serve to the Gluon kernel
(``_extend_gluon.py``: a producer warpgroup and two consumer warpgroups; same grid and rows).
"""
import torch
import triton
import triton.language as tl

from pagedattn import config
from pagedattn import layouts as L
from pagedattn.reference import is_fp8
from pagedattn.triton_kernels import _extend_configs as C
from pagedattn.triton_kernels import _extend_guard as GD
from pagedattn.triton_kernels import _extend_loop as V
from pagedattn.triton_kernels._extend_stages import _stage
from pagedattn.triton_kernels._common import LN2, LOG2E, finalize_state

_LOG2E = tl.constexpr(LOG2E)  # jit code may read globals only as constexpr
_LN2 = tl.constexpr(LN2)


@triton.jit
def _extend_fwd(
    q_ptr,  # [T, Hq, D]
    kn_ptr, vn_ptr,  # [T, Hkv, D], [T, Hkv, DV] k_new / v_new (q_ptr: dummies for the cache's)
    kc_ptr, vc_ptr,  # paged K / V caches, any layout (addressed through kv_offset)
    out_ptr,  # [T, Hq, DV]
    lse_ptr,  # [T, Hq] float32 (dummy unless RETURN_LSE)
    bt_ptr,  # int32 [B, max_blocks]
    cu_ptr,  # int32 [B + 1] query row offsets
    lens_ptr,  # int32 [B] Lk
    mask_ptr,  # uint8 flat custom mask (dummy unless HAS_MASK)
    mask_indptr_ptr,  # int32 [B + 1]
    kscale_ptr, vscale_ptr,  # float32 [Hkv] (dummy unless KV_FP8)
    alibi_ptr, sinks_ptr,  # float32 [Hq] (dummy unless HAS_ALIBI / HAS_SINKS)
    err_ptr,  # int32 [1]: guarded rows are counted here (HAS_ERR), else a dummy
    sm_scale, logit_cap, window,
    T, NBLK, MASK_N,  # q's rows; blocks in the cache; custom mask entries (GUARD)
    bt_w,  # block-table width (entries per row)
    stride_qt: tl.int64, stride_qh: tl.int64, stride_ot: tl.int64, stride_oh: tl.int64,
    stride_nt: tl.int64, stride_nh: tl.int64, stride_vnt: tl.int64, stride_vnh: tl.int64,
    stride_lt: tl.int64, stride_lh: tl.int64,
    stride_bt: tl.int64,
    stride_kb: tl.int64, stride_kt: tl.int64, stride_kh: tl.int64, stride_kdh: tl.int64,
    stride_kdl: tl.int64, stride_vb: tl.int64, stride_vt: tl.int64, stride_vh: tl.int64,
    stride_vdh: tl.int64, stride_vdl: tl.int64,
    K_X: tl.constexpr, K_SPLIT: tl.constexpr, K_LO_ONE: tl.constexpr, V_LO_ONE: tl.constexpr,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_NM: tl.constexpr,  # keys per masked (diagonal) tile of the one-pass loop; divides BLOCK_N
    CAUSAL: tl.constexpr, NEW_FROM_CACHE: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_CAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_SINKS: tl.constexpr, KV_FP8: tl.constexpr, RETURN_LSE: tl.constexpr, IEEE: tl.constexpr,
    ONE_LOOP: tl.constexpr,  # the one-pass key loop (_extend_loop.py); else the two stages below
    GUARD: tl.constexpr,  # the metadata is not trusted (_extend_guard.py)
    HAS_ERR: tl.constexpr,
    HEAD_DIM_V: tl.constexpr, HEAD_DIM_VP: tl.constexpr,  # V's (out's) head dim, padded
    VN_SAME: tl.constexpr = False,  # v_new's strides are k_new's
):
    # Preconditions (launcher): BLOCK_M % GROUP_P == 0, GROUP <= GROUP_P, HEAD_DIM <= HEAD_DIM_P,
    # HEAD_DIM_V <= HEAD_DIM_VP, powers of 2 for every tile dim, q/out/k_new last dim contiguous,
    # 0 <= Lq <= Lk (any Lq when not CAUSAL and NEW_FROM_CACHE: every key is visible to every
    # query, and one stage walks them all).
    LONG_Q: tl.constexpr = (not CAUSAL) and NEW_FROM_CACHE
    if VN_SAME:  # v_new strided like k_new: one pair of strides (registers on gfx90a)
        stride_vnt = stride_nt
        stride_vnh = stride_nh
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP_P
    b = tl.program_id(2)
    kvh = tl.program_id(1).to(tl.int64)
    mblk = tl.num_programs(0) - 1 - tl.program_id(0)  # last query block first (most keys)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    if ONE_LOOP:
        ids0 = V.first_ids(bt_row, bt_w, PAGE, BLOCK_N)  # before any other load
    q0 = tl.load(cu_ptr + b).to(tl.int64)
    lq = tl.load(cu_ptr + b + 1).to(tl.int64) - q0
    tok0 = mblk * BLOCK_Q
    lk = tl.load(lens_ptr + b).to(tl.int64)
    if GUARD:  # an invalid request: NaN rows (its first query block's program), no key loop
        cu_ok = GD.cu_monotone(cu_ptr, tl.num_programs(2), T)
        ok = GD.request_ok(cu_ok, q0, lq, lk, bt_row, mask_indptr_ptr, b, bt_w * PAGE, NBLK,
                           MASK_N, tl.num_programs(0) * BLOCK_Q, PAGE, NEW_FROM_CACHE, HAS_MASK,
                           LONG_Q)
        if ok == 0:
            if tok0 == 0:  # a bad cu_seqlens_q: request 0's program takes every row of q
                GD.nan_rows(out_ptr, lse_ptr, err_ptr, tl.where(cu_ok, q0, 0),
                            tl.where(cu_ok, lq, tl.where(b == 0, T, 0)), T, kvh, stride_ot,
                            stride_oh, stride_lt, stride_lh, GROUP, GROUP_P, HEAD_DIM_V,
                            HEAD_DIM_VP, BLOCK_Q, RETURN_LSE, HAS_ERR)
            return
    # NOTE the one-pass loop has no early exit: the branch held lk and the first tile's ids behind
    # the round trip for cu_seqlens (three dependent round trips before the first K/V tile, two
    # without it). A program past its request's Lq instead runs an empty key range (one_pass's
    # `live`) with every q load and store masked off.
    if not ONE_LOOP or not NEW_FROM_CACHE:
        if tok0 >= lq:
            return
    prefix = lk - lq
    rows = tl.arange(0, BLOCK_M)
    row_tok = tok0 + rows // GROUP_P  # [M] query index within the request
    hg = rows % GROUP_P  # [M] head within the group
    head = kvh * GROUP + hg  # [M] query head
    row_ok = (row_tok < lq) & (hg < GROUP)
    row_pos = prefix + row_tok  # [M] absolute position p
    d = tl.arange(0, HEAD_DIM_P)
    d_ok = d < HEAD_DIM
    q_off = (q0 + row_tok)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [M, D_P]

    # fp8: per KV head = per program, k_scale joins the logit scale and v_scale the output.
    # k_new/v_new rows (stage 2 without NEW_FROM_CACHE) are unquantised: plain scale, V / vs.
    k_sc = 1.0
    inv_vs = 1.0
    if KV_FP8:
        k_sc = tl.load(kscale_ptr + kvh)
        inv_vs = 1.0 / tl.load(vscale_ptr + kvh)
    scale_1 = sm_scale * k_sc
    scale_2 = scale_1 if NEW_FROM_CACHE else sm_scale
    slope2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_ALIBI:
        slope2 = tl.load(alibi_ptr + head, mask=hg < GROUP, other=0.0) * _LOG2E
    mask_row = tl.zeros([BLOCK_M], dtype=tl.int64)
    if HAS_MASK:
        mask_row = tl.load(mask_indptr_ptr + b).to(tl.int64) + row_tok * lk  # [M]

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_VP], dtype=tl.float32)

    if ONE_LOOP and NEW_FROM_CACHE:  # no custom mask or window: one pass (launcher checks)
        acc, m_i, l_i = V.one_pass(
            acc, m_i, l_i, q, prefix, tok0, lk, kvh, row_pos, slope2, scale_1, logit_cap, bt_row,
            bt_w, ids0, kc_ptr, vc_ptr, stride_kb, stride_kt, stride_kh, stride_kdh, stride_kdl,
            stride_vb, stride_vt, stride_vh, stride_vdh, stride_vdl, K_X, K_SPLIT, K_LO_ONE,
            V_LO_ONE, PAGE, BLOCK_Q, BLOCK_N, BLOCK_NM, HEAD_DIM, HEAD_DIM_P, CAUSAL,
            HAS_CAP, HAS_ALIBI, KV_FP8, IEEE, tok0 < lq, HEAD_DIM_V, HEAD_DIM_VP)
    else:
        # A window hides keys j <= p - W from every row once p >= tok0's position: skip those
        # tiles.
        lo1 = 0
        lo2 = 0
        if HAS_WINDOW:
            lo1 = tl.maximum(prefix + tok0 - window + 1, 0) // BLOCK_N * BLOCK_N
            lo2 = tl.maximum(tok0 - window + 1, 0) // BLOCK_N * BLOCK_N
        ANY_MASK: tl.constexpr = HAS_WINDOW or HAS_MASK
        TRI: tl.constexpr = CAUSAL and not HAS_MASK
        FROM_NEW: tl.constexpr = not NEW_FROM_CACHE

        # Stage 1: the prefix [0, P), a dense rectangle. Full tiles run unmasked; the partial
        # last tile (and every tile under a window or custom mask) runs masked.
        if ONE_LOOP:  # k_new/v_new, no mask or window: the one-pass loop over
            # the keys [0, prefix), all visible to every row: one_pass without the causal rule
            acc, m_i, l_i = V.one_pass(
                acc, m_i, l_i, q, prefix, tok0, prefix, kvh, row_pos, slope2, scale_1, logit_cap,
                bt_row, bt_w, ids0, kc_ptr, vc_ptr, stride_kb, stride_kt, stride_kh, stride_kdh,
                stride_kdl, stride_vb, stride_vt, stride_vh, stride_vdh, stride_vdl, K_X, K_SPLIT,
                K_LO_ONE, V_LO_ONE, PAGE, BLOCK_Q, BLOCK_N, BLOCK_NM, HEAD_DIM,
                HEAD_DIM_P, False, HAS_CAP, HAS_ALIBI, KV_FP8, IEEE, True, HEAD_DIM_V,
                HEAD_DIM_VP)
        else:
            # LONG_Q: every key [0, Lk) in this stage (Lq may exceed Lk), and no stage 2
            n1 = lk if LONG_Q else prefix
            full1 = lo1 if ANY_MASK else n1 // BLOCK_N * BLOCK_N
            for MASKED in tl.static_range(2):
                acc, m_i, l_i = _stage(
                    acc, m_i, l_i, q, tl.maximum(full1, lo1) if MASKED else lo1,
                    n1 if MASKED else full1, n1, 0, row_pos, row_ok, slope2, scale_1,
                    logit_cap, inv_vs, window, kvh, q0, mask_row, bt_row, kc_ptr, vc_ptr, kn_ptr,
                    vn_ptr, mask_ptr, stride_kb, stride_kt, stride_kh, stride_kdh, stride_kdl,
                    stride_vb, stride_vt, stride_vh, stride_vdh, stride_vdl, stride_nt,
                    stride_nh, stride_vnt, stride_vnh, K_X, K_SPLIT, K_LO_ONE, V_LO_ONE, PAGE,
                    BLOCK_N, HEAD_DIM, HEAD_DIM_P, MASKED == 1, True, False, False, HAS_WINDOW,
                    HAS_MASK, HAS_CAP, HAS_ALIBI, KV_FP8, IEEE, HEAD_DIM_V, HEAD_DIM_VP)

        # Stage 2: the new keys r in [0, Lq) at positions P + r. Causal: a lower triangle; the
        # loop stops at the block's diagonal (keys past its last query are never loaded).
        # Tiles entirely at or below the block's first query run unmasked.
        if TRI:
            hi2 = tl.minimum(lq, tok0 + BLOCK_Q)
            full2 = (tok0 + 1) // BLOCK_N * BLOCK_N
        else:
            hi2 = lq
            full2 = lq // BLOCK_N * BLOCK_N
        if ANY_MASK:
            full2 = lo2
        if LONG_Q:  # stage 1 took every key
            hi2 = 0
            full2 = 0
            lo2 = 0
        for MASKED in tl.static_range(2):
            acc, m_i, l_i = _stage(
                acc, m_i, l_i, q, tl.maximum(full2, lo2) if MASKED else lo2,
                hi2 if MASKED else full2, lq, prefix, row_pos, row_ok, slope2, scale_2,
                logit_cap, inv_vs, window, kvh, q0, mask_row, bt_row, kc_ptr, vc_ptr, kn_ptr,
                vn_ptr, mask_ptr,
                stride_kb, stride_kt, stride_kh, stride_kdh, stride_kdl, stride_vb, stride_vt,
                stride_vh, stride_vdh, stride_vdl, stride_nt, stride_nh, stride_vnt, stride_vnh,
                K_X, K_SPLIT, K_LO_ONE, V_LO_ONE, PAGE, BLOCK_N, HEAD_DIM, HEAD_DIM_P,
                MASKED == 1, False, FROM_NEW, TRI, HAS_WINDOW, HAS_MASK, HAS_CAP, HAS_ALIBI,
                KV_FP8, IEEE, HEAD_DIM_V, HEAD_DIM_VP)

    # Epilogue: normalise (sinks join the denominator only), v_scale, store; empty rows -> 0/-inf.
    sink = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head, mask=hg < GROUP, other=0.0)
    o, lse2 = finalize_state(m_i, l_i, acc, sink, HAS_SINKS)  # [M, DV_P], [M]
    if KV_FP8:
        o = o * tl.load(vscale_ptr + kvh)
    e = tl.arange(0, HEAD_DIM_VP)
    o_off = (q0 + row_tok)[:, None] * stride_ot + head[:, None] * stride_oh + e[None, :]
    tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (e < HEAD_DIM_V)[None, :])
    if RETURN_LSE:
        tl.store(lse_ptr + (q0 + row_tok) * stride_lt + head * stride_lh, lse2 * _LN2, mask=row_ok)


# --- launcher ----------------------------------------------------------------------------------

def unsupported(**facts) -> list:
    """Reasons this kernel cannot serve a call ([] = it can). Facts: q, k_cache, geom, ..."""
    why = []
    q, g = facts.get("q"), facts.get("geom")
    if q is not None and g is not None:
        if q.shape[-2] // max(g.num_kv_heads, 1) > 128:
            why.append("GQA group > 128 query heads per KV head")
    return why


def run(call):
    """Launch the extend kernel for a validated :class:`pagedattn.validation.ExtendCall`.

    Writes call.out; returns the float32 lse [T, Hq] when call.return_lse, else None.
    Host syncs: none when call.max_q_len is given; otherwise one ``.item()`` reads the longest
    request's query length to size the grid (the api already read cu_seqlens_q[-1]).
    """
    q, g, o = call.q, call.geom, call.opts
    t, hq, d = q.shape
    hkv, nseq = g.num_kv_heads, call.num_seqs
    group = hq // hkv
    if call.max_q_len is not None:
        max_q = int(call.max_q_len)
    else:  # one host sync
        cu = call.cu_seqlens_q
        max_q = int((cu[1:] - cu[:-1]).max().item()) if nseq else 0
    lse = torch.empty((t, hq), dtype=torch.float32, device=q.device) if call.return_lse else q
    if max_q <= 0 or t == 0:
        call.out.zero_()
        if call.return_lse:
            lse.fill_(float("-inf"))
        return lse if call.return_lse else None
    group_p = triton.next_power_of_2(group)
    d_p = max(16, triton.next_power_of_2(d))
    dv = g.head_dim_v
    dv_p = max(16, triton.next_power_of_2(dv))
    ks, vs = L.k_strides(call.k_cache, call.layout), L.v_strides(call.v_cache, call.layout)
    kv_fp8 = is_fp8(call.k_cache.dtype)
    k_new = call.k_new if call.k_new is not None else q
    v_new = call.v_new if call.v_new is not None else q
    mask = call.custom_mask
    if mask is not None and mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)
    dummy = o.k_scale if o.k_scale is not None else call.seq_lens
    args = dict(
        q_ptr=q, kn_ptr=k_new, vn_ptr=v_new,
        kc_ptr=call.k_cache, vc_ptr=call.v_cache, out_ptr=call.out, lse_ptr=lse,
        bt_ptr=call.block_table, cu_ptr=call.cu_seqlens_q, lens_ptr=call.seq_lens,
        mask_ptr=mask if mask is not None else call.seq_lens,
        mask_indptr_ptr=call.mask_indptr if mask is not None else call.seq_lens,
        kscale_ptr=o.k_scale if kv_fp8 else dummy, vscale_ptr=o.v_scale if kv_fp8 else dummy,
        alibi_ptr=o.alibi_slopes if o.alibi_slopes is not None else dummy,
        sinks_ptr=o.sinks if o.sinks is not None else dummy,
        err_ptr=call.errors if call.errors is not None else dummy,
        sm_scale=float(o.scale), logit_cap=float(o.logit_cap or 1.0),
        window=int(o.sliding_window or 0), bt_w=call.block_table.shape[1], T=t,
        NBLK=g.num_blocks, MASK_N=mask.numel() if mask is not None else 0,
        stride_qt=q.stride(0), stride_qh=q.stride(1),
        stride_ot=call.out.stride(0), stride_oh=call.out.stride(1),
        stride_nt=k_new.stride(0), stride_nh=k_new.stride(1),
        stride_vnt=v_new.stride(0), stride_vnh=v_new.stride(1),
        stride_lt=lse.stride(0) if call.return_lse else 0,
        stride_lh=lse.stride(1) if call.return_lse else 0,
        stride_bt=call.block_table.stride(0),
        stride_kb=ks.block, stride_kt=ks.token, stride_kh=ks.head, stride_kdh=ks.dim_hi,
        stride_kdl=ks.dim_lo, stride_vb=vs.block, stride_vt=vs.token, stride_vh=vs.head,
        stride_vdh=vs.dim_hi, stride_vdl=vs.dim_lo,
        K_X=ks.x, K_SPLIT=ks.x < d, K_LO_ONE=ks.dim_lo == 1, V_LO_ONE=vs.dim_lo == 1,
        GROUP=group, GROUP_P=group_p, HEAD_DIM=d, HEAD_DIM_P=d_p, PAGE=g.block_size,
        HEAD_DIM_V=dv, HEAD_DIM_VP=dv_p, VN_SAME=v_new.stride()[:2] == k_new.stride()[:2],
        CAUSAL=bool(call.causal), NEW_FROM_CACHE=call.k_new is None, HAS_MASK=mask is not None,
        HAS_WINDOW=o.sliding_window is not None, HAS_CAP=o.logit_cap is not None,
        HAS_ALIBI=o.alibi_slopes is not None, HAS_SINKS=o.sinks is not None, KV_FP8=kv_fp8,
        RETURN_LSE=bool(call.return_lse), IEEE=q.dtype == torch.float32,
        GUARD=config.get("PAGEDATTN_DEV_GUARDS"), HAS_ERR=call.errors is not None,
        ONE_LOOP=V.serves(has_mask=mask is not None, has_window=o.sliding_window is not None,
                          page=g.block_size),
    )
    gk = V.gluon_kernel()
    if gk is not None and not gk.unsupported(call, ks, vs, C.family_of(q.device), group_p, max_q):
        gk.launch(call, ks, vs, group, group_p, max_q, lse)
        return lse if call.return_lse else None
    # grid = (cdiv(max_q, BLOCK_Q), Hkv, B) with BLOCK_Q = BLOCK_M // GROUP_P query tokens.
    c = C.default_config(q.device, max(d_p, dv_p), group_p, max_q)
    if args["ONE_LOOP"]:
        c = V.tile_config(c, C.family_of(q.device), q.element_size())
    extra = {}
    if c.waves_per_eu and C.is_hip(q.device):
        extra = dict(waves_per_eu=c.waves_per_eu, matrix_instr_nonkdim=c.matrix_instr_nonkdim)
    grid = (triton.cdiv(max_q, c.block_m // group_p), hkv, nseq)
    _extend_fwd[grid](**args, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_NM=C.masked_tile(c),
                      num_warps=c.num_warps, num_stages=c.num_stages, **extra)
    return lse if call.return_lse else None
