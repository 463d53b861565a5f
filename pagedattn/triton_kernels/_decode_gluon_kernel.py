"""The Gluon decode kernel for sm_90 (``decode_sm90``) and the state helpers its forms share
(fold, park, finish). The design, the gate and the launcher are in ``_decode_gluon.py``; the
program setup and the ring's prologue in ``_decode_gluon_ring.py``.

Pipeline (NS ring slots, one cp.async group per tile {K_t, V_t}):

  iteration t: barrier | issue tile t + NS - 1 into the slot of tile t - 1 | wait tile t |
               fence, barrier | S = Q K_t^T | softmax | O = O alpha + P V_t |
               partition end: fold or park
  (the refill comes before the wait: NS tiles are in flight during it, for one more barrier)
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy, warpgroup_mma

from pagedattn.triton_kernels._decode_gluon_ring import (_BLOCK_M, _bal_lens, _issue_kv, _kv_base,
                                                         _landed, _program, _ring_plan,
                                                         _ring_start)
from pagedattn.triton_kernels._extend_gluon import _bad_ids, _copy_rows, _ids

_LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _fold(big_m, big_l, big_a, m_p, l_p, acc_p, ROW_O: gl.constexpr):
    """``_decode_state.merge`` (the same operations, the same FMAs): fold one partition's
    state into the running one. m_p, l_p arrive in the S row layout."""
    m_p = gl.convert_layout(m_p, ROW_O)
    l_p = gl.convert_layout(l_p, ROW_O)
    m_new = gl.maximum(big_m, m_p)
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    a = gl.exp2(big_m - m_safe)
    b = gl.exp2(m_p - m_safe)
    big_l = gl.fma(l_p, b, big_l * a)
    big_a = gl.fma(acc_p, b[:, None], big_a * a[:, None])
    return m_new, big_l, big_a


@gluon.jit
def _park(ws_ml_ptr, ws_o_ptr, row0, m, l, acc, R: gl.constexpr, D: gl.constexpr,
          ROW_S: gl.constexpr, ROW_O: gl.constexpr, COL_O: gl.constexpr):
    """Store one partition's state for the combine at workspace rows row0 + [0, R) (l NaN:
    poisoned by the guards; the combine writes NaN rows)."""
    rs = gl.arange(0, acc.shape[0], layout=ROW_S)
    gl.store(ws_ml_ptr + 2 * (row0 + rs), m, mask=rs < R)
    gl.store(ws_ml_ptr + 2 * (row0 + rs) + 1, l, mask=rs < R)
    ro = gl.arange(0, acc.shape[0], layout=ROW_O)
    do = gl.arange(0, D, layout=COL_O)
    gl.store(ws_o_ptr + ((row0 + ro)[:, None] * D + do[None, :]), acc, mask=(ro < R)[:, None])


@gluon.jit
def _finish(out_ptr, lse_ptr, s, h, m, l, acc, Hq, LQ, stride_ob, stride_ot, stride_oh,
            G: gl.constexpr, R: gl.constexpr, D: gl.constexpr, RETURN_LSE: gl.constexpr,
            ROW_O: gl.constexpr, COL_O: gl.constexpr):
    """``_common.finalize_state`` (no sinks) and ``_decode_kernels._store_rows``: normalise,
    store out (and the natural-log lse) of rows [0, R); a poisoned row (l NaN) is NaN."""
    m_safe = gl.where(m == float("-inf"), 0.0, m)
    r = gl.full(m.shape, 1.0, gl.float32, ROW_O)
    inv = gl.where(l > 0, r / gl.where(l > 0, l, 1.0), 0.0)
    inv = gl.where(l == l, inv, l)
    o = acc * inv[:, None]
    ro = gl.arange(0, acc.shape[0], layout=ROW_O)
    qi = ro // G
    qh = h * G + ro % G
    ok = ro < R
    do = gl.arange(0, D, layout=COL_O)
    o_off = s * stride_ob + qi.to(gl.int64) * stride_ot + qh.to(gl.int64) * stride_oh
    gl.store(out_ptr + (o_off[:, None] + do[None, :]), o.to(out_ptr.dtype.element_ty),
             mask=ok[:, None])
    if RETURN_LSE:
        lse2 = gl.where(l > 0, m_safe + gl.log2(gl.where(l > 0, l, 1.0)), float("-inf"))
        lse2 = gl.where(l == l, lse2, l)
        gl.store(lse_ptr + ((s * LQ + qi) * Hq + qh), lse2 * _LN2, mask=ok)


@gluon.jit
def decode_sm90(
    q_ptr,  # [B, LQ, Hq, D] (strides)
    kc_ptr, vc_ptr,  # paged caches, head dim contiguous (bhsd, bshd)
    bt_ptr, lens_ptr,  # int32 block table [B, W], seq_lens [B]
    out_ptr,  # [B, LQ, Hq, D]
    lse_ptr,  # float32 [B, LQ, Hq]
    ws_ml_ptr, ws_o_ptr,  # float32 [B, Hkv, P, R, 2], [B, Hkv, P, R, D]
    err_ptr,  # int32 [1]: guarded rows are counted here (HAS_ERR), else any pointer
    qk_scale,  # sm_scale * log2(e)
    LQ, Hq, P, PPP, NB, FILL_N, SLOTS, FINE,  # NB ..: the balanced launch's plan (BAL)
    BT_W, NBLK,  # the block table's width; blocks in the cache
    stride_qb, stride_qt, stride_qh, stride_ob, stride_ot, stride_oh, stride_bt,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    G: gl.constexpr, R: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr, PART: gl.constexpr,
    BLOCK_N: gl.constexpr, NS: gl.constexpr, ONE_PASS: gl.constexpr, MULTI: gl.constexpr,
    CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr, PDL: gl.constexpr, BAL: gl.constexpr,
    NB_BLOCK: gl.constexpr, GUARD: gl.constexpr, HAS_ERR: gl.constexpr,
    num_warps: gl.constexpr,
):
    # GUARD (``_decode_kernels._decode_kernel``'s contract): a length outside {0} u
    # [LQ, BT_W * PAGE] runs as 0, a block id outside [0, NBLK) reads block 0; either makes the
    # sequence's rows NaN, counted in err_ptr. Nothing outside the given tensors is touched.
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    LEAD: gl.constexpr = NS - 1  # tiles issued ahead of the one computed
    TPC: gl.constexpr = D // 8  # threads per row of a 16-byte-per-thread copy
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPC, TPC], [num_warps, 1], [1, 0])
    MMA_S: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                    instr_shape=[16, BLOCK_N, 16])
    MMA_O: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                    instr_shape=[16, D, 16])
    P_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_O, k_width=2)
    ROW_S: gl.constexpr = gl.SliceLayout(1, MMA_S)
    COL_S: gl.constexpr = gl.SliceLayout(0, MMA_S)
    ROW_O: gl.constexpr = gl.SliceLayout(1, MMA_O)
    COL_O: gl.constexpr = gl.SliceLayout(0, MMA_O)
    KV_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], dtype)
    Q_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([_BLOCK_M, D], dtype)

    CAP = BT_W * PAGE
    h, s, seq_len, n_parts, p, t_lo, t_hi, bad_len = _program(lens_ptr, PPP, CAP, LQ, PART,
                                                              ONE_PASS, MULTI, PDL, GUARD, BAL,
                                                              NB)
    if BAL:  # issued beside seq_len
        lens0, j0 = _bal_lens(lens_ptr, NB, CAP, LQ, NB_BLOCK, num_warps)
    if p >= n_parts:  # split: past the sequence's last partition
        return
    n_tiles, lim, bt_row, kc_h, vc_h, sb_k, sb_v = _kv_base(
        bt_ptr, kc_ptr, vc_ptr, s, h, seq_len, t_lo, t_hi, LQ, stride_bt, stride_kb, stride_kh,
        stride_vb, stride_vh, BLOCK_N, CAUSAL)
    dcol, r, k_tok, v_tok = _copy_rows(stride_kt, stride_vt, D, PAGE, BLOCK_N, LD)
    q_smem = gl.allocate_shared_memory(dtype, [_BLOCK_M, D], Q_SMEM)
    k_ring = gl.allocate_shared_memory(dtype, [NS, BLOCK_N, D], KV_SMEM)
    v_ring = gl.allocate_shared_memory(dtype, [NS, BLOCK_N, D], KV_SMEM)

    whole = p < 0  # balanced launch: this program owns its sequence (folds, writes out)
    if BAL:
        (s, seq_len, n_parts, p, t_lo, t_hi, whole, none, ids_nx, n_tiles, lim,
         bt_row) = _ring_plan(
            q_smem, q_ptr, k_ring, v_ring, kc_h, vc_h, bt_ptr, lens_ptr, lens0, j0, s, seq_len,
            LQ, h, NB, FILL_N, SLOTS, FINE, stride_qb, stride_qt, stride_qh, stride_bt, sb_k,
            sb_v, stride_kt, stride_vt, k_tok, v_tok, r, dcol, G, _BLOCK_M, PAGE, PART, BLOCK_N,
            LEAD, LD, NB_BLOCK, CAUSAL, CAP, NBLK, GUARD)
        if none:
            return
        bad_len = bad_len & (gl.program_id(1) < NB)  # an extra share's sequence is valid
    else:
        ids_nx = _ring_start(q_smem, q_ptr + s * stride_qb, k_ring, v_ring, kc_h, vc_h, bt_row,
                             t_lo, t_hi, LQ, h, stride_qt, stride_qh, sb_k, sb_v, stride_kt,
                             stride_vt, k_tok, v_tok, r, dcol, NBLK, G, _BLOCK_M, PAGE, BLOCK_N,
                             LEAD, LD, GUARD)
    l0 = 0.0
    if GUARD:  # the ring copies clamped ids; a bad one (or length) poisons the state: l NaN
        bad = bad_len | _bad_ids(bt_row, t_lo // PAGE, (t_hi + PAGE - 1) // PAGE, NBLK,
                                 num_warps)
        l0 = gl.where(bad, float("nan"), 0.0)
        if HAS_ERR:  # the guards' count: each guarded row once (never the data's NaN)
            if bad:  # counted by the sequence's first guarded program
                later = _bad_ids(bt_row, 0, (t_lo + PAGE - 1) // PAGE, NBLK, num_warps)
                if bad_len | ~later:
                    gl.atomic_add(err_ptr, R)

    rows_s = gl.arange(0, _BLOCK_M, layout=ROW_S)
    pos = seq_len - LQ + rows_s // G  # [M] absolute query position of each row
    cols = gl.arange(0, BLOCK_N, layout=COL_S)
    ws_row0 = (s * gl.num_programs(0) + h) * P * R  # int64: (s, h, partition 0, row 0)
    m_i = gl.full([_BLOCK_M], float("-inf"), gl.float32, ROW_S)
    l_i = gl.zeros([_BLOCK_M], gl.float32, ROW_S) + l0
    o = gl.zeros([_BLOCK_M, D], gl.float32, MMA_O)
    big_m = gl.full([_BLOCK_M], float("-inf"), gl.float32, ROW_O)
    big_l = gl.zeros([_BLOCK_M], gl.float32, ROW_O) + l0
    big_a = gl.zeros([_BLOCK_M, D], gl.float32, MMA_O)
    for t in range(n_tiles):
        start = t_lo + t * BLOCK_N
        nx = start + LEAD * BLOCK_N
        gl.thread_barrier()  # every warp done with the slot refilled (tile t - 1's)
        _issue_kv(k_ring.index((t + LEAD) % NS), v_ring.index((t + LEAD) % NS), kc_h, vc_h,
                  ids_nx, nx, t_hi, sb_k, sb_v, stride_kt, stride_vt, k_tok, v_tok, r, dcol,
                  PAGE, BLOCK_N)
        ids_nx = _ids(bt_row, nx + BLOCK_N, t_hi, r, PAGE, BLOCK_N, NBLK, GUARD)
        _landed(LEAD)  # tile t

        sc = warpgroup_mma(q_smem, k_ring.index(t % NS).permute((1, 0)),
                           gl.zeros([_BLOCK_M, BLOCK_N], gl.float32, MMA_S), use_acc=False)
        sc = sc * qk_scale
        if start + BLOCK_N > lim:
            j = start + cols
            vis = (j < t_hi)[None, :]
            if CAUSAL:
                vis = vis & (j[None, :] <= pos[:, None])
            sc = gl.where(vis, sc, float("-inf"))
        # _common.online_softmax_step
        m_new = gl.maximum(m_i, gl.max(sc, 1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_safe)
        pr = gl.exp2(sc - m_safe[:, None])
        l_i = l_i * alpha + gl.sum(pr, 1)
        m_i = m_new
        o = o * gl.convert_layout(alpha, ROW_O)[:, None]
        o = warpgroup_mma(gl.convert_layout(pr.to(dtype), P_OP), v_ring.index(t % NS), o)

        end = start + BLOCK_N
        if ((end % PART) == 0) | (end >= t_hi):  # this partition's last tile
            if ONE_PASS:
                big_m, big_l, big_a = _fold(big_m, big_l, big_a, m_i, l_i, o, ROW_O)
                m_i = gl.full([_BLOCK_M], float("-inf"), gl.float32, ROW_S)
                l_i = gl.zeros([_BLOCK_M], gl.float32, ROW_S)
                o = gl.zeros([_BLOCK_M, D], gl.float32, MMA_O)
            elif BAL:
                if whole:
                    big_m, big_l, big_a = _fold(big_m, big_l, big_a, m_i, l_i, o, ROW_O)
                else:
                    _park(ws_ml_ptr, ws_o_ptr, ws_row0 + ((end - 1) // PART) * R, m_i, l_i, o, R,
                          D, ROW_S, ROW_O, COL_O)
                m_i = gl.full([_BLOCK_M], float("-inf"), gl.float32, ROW_S)
                l_i = gl.zeros([_BLOCK_M], gl.float32, ROW_S)
                o = gl.zeros([_BLOCK_M, D], gl.float32, MMA_O)
            elif n_parts > 1:  # a single-partition sequence is finished below
                _park(ws_ml_ptr, ws_o_ptr, ws_row0 + ((end - 1) // PART) * R, m_i, l_i, o, R, D,
                      ROW_S, ROW_O, COL_O)
                m_i = gl.full([_BLOCK_M], float("-inf"), gl.float32, ROW_S)
                l_i = gl.zeros([_BLOCK_M], gl.float32, ROW_S)
                o = gl.zeros([_BLOCK_M, D], gl.float32, MMA_O)
    async_copy.wait_group(0)  # no copy outlives the program

    if ONE_PASS:
        _finish(out_ptr, lse_ptr, s, h, big_m, big_l, big_a, Hq, LQ, stride_ob, stride_ot,
                stride_oh, G, R, D, RETURN_LSE, ROW_O, COL_O)
    elif BAL:
        if whole:
            _finish(out_ptr, lse_ptr, s, h, big_m, big_l, big_a, Hq, LQ, stride_ob, stride_ot,
                    stride_oh, G, R, D, RETURN_LSE, ROW_O, COL_O)
    elif n_parts == 1:  # the state one pass would hold: one fold into the empty state
        big_m, big_l, big_a = _fold(big_m, big_l, big_a, m_i, l_i, o, ROW_O)
        _finish(out_ptr, lse_ptr, s, h, big_m, big_l, big_a, Hq, LQ, stride_ob, stride_ot,
                stride_oh, G, R, D, RETURN_LSE, ROW_O, COL_O)
