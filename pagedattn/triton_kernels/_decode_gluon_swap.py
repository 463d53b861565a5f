"""Paged decode for sm_90 in Gluon, keys on the wgmma's M side (the ``swap`` form).

Why: ``_decode_gluon_kernel.decode_sm90`` pads the group's G * Lq query rows to the 64 rows of a
wgmma; for one row per KV head that is 64x the useful tensor work and a 64 x 64 softmax per
tile. Here the products are transposed so the wide side is the keys:

  S^T [BLOCK_N, NQ] = K_t [BLOCK_N, D] . Q^T [D, NQ]      (A: the K ring slot, B: Q in smem)
  O^T [D, NQ]      += V_t^T [D, BLOCK_N] . P^T [BLOCK_N, NQ]  (A: the V slot, transposed view)

with NQ = the rows padded to a multiple of 8 (wgmma's N). The tensor work and the softmax
shrink by 64 / NQ; the price is that a row's max and sum now run across the 4 warps (the
compiler's shared-memory reduction) and P^T goes through a small shared tile (wgmma's B).

Same grid, partitions, workspace, fold and combine as ``decode_sm90`` (see there); bits differ
from it (another tile arithmetic), so the form never changes with the batch: one-pass and split
launches of this kernel are bitwise equal to each other.

Measured on the H200: on MHA (one row), with one partition per split program, 1.002-1.021x the
rows form on every row of the decode table, so it serves one row (``_decode_gluon.form``); on
32/8 (4 rows) it is 0.87-1.03x the rows form, which keeps GQA.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared,
                                                              warpgroup_mma)

from pagedattn.triton_kernels._decode_gluon_ring import (_bal_lens, _issue_kv, _kv_base, _landed,
                                                         _program, _ring_plan, _ring_start)
from pagedattn.triton_kernels._extend_gluon import _bad_ids, _copy_rows, _ids

_LN2 = gl.constexpr(0.6931471805599453)


def rows_padded(rows: int) -> int:
    """NQ: the query rows as wgmma's N (a power of two >= 8, so the layouts tile evenly)."""
    n = 8
    while n < rows:
        n *= 2
    return n


MAX_ROWS = 32  # more rows gain little (64 / NQ <= 2) and spill (O^T and S^T: 96 fp32 / thread)


def smem_bytes(head_dim: int, block_n: int, ns: int, rows: int, elem: int = 2,
               num_warps: int = 4) -> int:
    """Shared memory of one program: Q, the K and V rings, the P^T tile and the scratch of the
    cross-warp row reductions (fp32 per row and warp)."""
    nq = rows_padded(rows)
    return (nq * head_dim + 2 * ns * block_n * head_dim + block_n * nq) * elem \
        + 4 * nq * num_warps


@gluon.jit
def _fold_t(big_m, big_l, big_a, m_p, l_p, acc_p, COL_O: gl.constexpr):
    """``_decode_state.merge`` on transposed states (acc [D, NQ]; the same FMAs)."""
    m_p = gl.convert_layout(m_p, COL_O)
    l_p = gl.convert_layout(l_p, COL_O)
    m_new = gl.maximum(big_m, m_p)
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    a = gl.exp2(big_m - m_safe)
    b = gl.exp2(m_p - m_safe)
    big_l = gl.fma(l_p, b, big_l * a)
    big_a = gl.fma(acc_p, b[None, :], big_a * a[None, :])
    return m_new, big_l, big_a


@gluon.jit
def _park_t(ws_ml_ptr, ws_o_ptr, row0, m, l, acc, R: gl.constexpr, D: gl.constexpr,
            COL_S: gl.constexpr, ROW_O: gl.constexpr, COL_O: gl.constexpr):
    """Store one partition's state (acc [D, NQ]) at workspace rows row0 + [0, R)."""
    rs = gl.arange(0, acc.shape[1], layout=COL_S)
    gl.store(ws_ml_ptr + 2 * (row0 + rs), m, mask=rs < R)
    gl.store(ws_ml_ptr + 2 * (row0 + rs) + 1, l, mask=rs < R)
    ro = gl.arange(0, acc.shape[1], layout=COL_O)
    do = gl.arange(0, D, layout=ROW_O)
    gl.store(ws_o_ptr + ((row0 + ro)[None, :] * D + do[:, None]), acc, mask=(ro < R)[None, :])


@gluon.jit
def _finish_t(out_ptr, lse_ptr, s, h, m, l, acc, Hq, LQ, stride_ob, stride_ot, stride_oh,
              G: gl.constexpr, R: gl.constexpr, D: gl.constexpr, RETURN_LSE: gl.constexpr,
              ROW_O: gl.constexpr, COL_O: gl.constexpr):
    """``_decode_gluon_kernel._finish`` on a transposed state: normalise, store out (and lse);
    a poisoned row (l NaN) is NaN."""
    m_safe = gl.where(m == float("-inf"), 0.0, m)
    one = gl.full(m.shape, 1.0, gl.float32, COL_O)
    inv = gl.where(l > 0, one / gl.where(l > 0, l, 1.0), 0.0)
    inv = gl.where(l == l, inv, l)
    o = acc * inv[None, :]
    ro = gl.arange(0, acc.shape[1], layout=COL_O)
    qi = ro // G
    qh = h * G + ro % G
    ok = ro < R
    do = gl.arange(0, D, layout=ROW_O)
    o_off = s * stride_ob + qi.to(gl.int64) * stride_ot + qh.to(gl.int64) * stride_oh
    gl.store(out_ptr + (o_off[None, :] + do[:, None]), o.to(out_ptr.dtype.element_ty),
             mask=ok[None, :])
    if RETURN_LSE:
        lse2 = gl.where(l > 0, m_safe + gl.log2(gl.where(l > 0, l, 1.0)), float("-inf"))
        lse2 = gl.where(l == l, lse2, l)
        gl.store(lse_ptr + ((s * LQ + qi) * Hq + qh), lse2 * _LN2, mask=ok)


@gluon.jit
def _softmax_t(sc, m_i, l_i, o, start, lim, t_hi, keys, pos, qk_scale, CAUSAL: gl.constexpr):
    """_common.online_softmax_step per column of S^T [BLOCK_N, NQ] (raw q.k): scale, mask keys
    past t_hi (and, causal, past each row's position) in tiles ending past lim, fold into (m, l)
    and rescale O^T. Returns (m, l, O^T, P^T)."""
    sc = sc * qk_scale
    if start + sc.shape[0] > lim:
        j = start + keys
        vis = (j < t_hi)[:, None]
        if CAUSAL:
            vis = vis & (j[:, None] <= pos[None, :])
        sc = gl.where(vis, sc, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(sc, 0))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_safe)
    pr = gl.exp2(sc - m_safe[None, :])  # P^T [BLOCK_N, NQ]
    l_i = l_i * alpha + gl.sum(pr, 0)
    return m_new, l_i, o * alpha[None, :], pr


@gluon.jit
def _end_tile_t(ws_ml_ptr, ws_o_ptr, ws_row0, end, t_hi, n_parts, m_i, l_i, o, big_m, big_l,
                big_a, R: gl.constexpr, PART: gl.constexpr, ONE_PASS: gl.constexpr,
                MMA: gl.constexpr, BAL: gl.constexpr = False, whole=False):
    """After the tile ending at ``end``: at a partition's last tile, fold its state into the
    running one (one pass; a balanced program that owns its sequence: BAL and whole) or park it
    for the combine (split, several partitions), and start the next partition empty. Returns
    (big_m, big_l, big_a, m, l, O^T)."""
    COL: gl.constexpr = gl.SliceLayout(0, MMA)
    if ((end % PART) == 0) | (end >= t_hi):  # this partition's last tile
        if ONE_PASS:
            big_m, big_l, big_a = _fold_t(big_m, big_l, big_a, m_i, l_i, o, COL)
            m_i = gl.full(m_i.shape, float("-inf"), gl.float32, COL)
            l_i = gl.zeros(l_i.shape, gl.float32, COL)
            o = gl.zeros(o.shape, gl.float32, MMA)
        elif BAL:
            if whole:
                big_m, big_l, big_a = _fold_t(big_m, big_l, big_a, m_i, l_i, o, COL)
            else:
                _park_t(ws_ml_ptr, ws_o_ptr, ws_row0 + ((end - 1) // PART) * R, m_i, l_i, o, R,
                        o.shape[0], COL, gl.SliceLayout(1, MMA), COL)
            m_i = gl.full(m_i.shape, float("-inf"), gl.float32, COL)
            l_i = gl.zeros(l_i.shape, gl.float32, COL)
            o = gl.zeros(o.shape, gl.float32, MMA)
        elif n_parts > 1:  # a single-partition sequence is finished by _epilogue_t
            _park_t(ws_ml_ptr, ws_o_ptr, ws_row0 + ((end - 1) // PART) * R, m_i, l_i, o, R,
                    o.shape[0], COL, gl.SliceLayout(1, MMA), COL)
            m_i = gl.full(m_i.shape, float("-inf"), gl.float32, COL)
            l_i = gl.zeros(l_i.shape, gl.float32, COL)
            o = gl.zeros(o.shape, gl.float32, MMA)
    return big_m, big_l, big_a, m_i, l_i, o


@gluon.jit
def _epilogue_t(out_ptr, lse_ptr, s, h, n_parts, m_i, l_i, o, big_m, big_l, big_a, Hq, LQ,
                stride_ob, stride_ot, stride_oh, G: gl.constexpr, R: gl.constexpr,
                ONE_PASS: gl.constexpr, RETURN_LSE: gl.constexpr, MMA: gl.constexpr,
                BAL: gl.constexpr = False, whole=False):
    """Store out (and lse) where this program finishes its sequence: one pass, a balanced
    program that owns its sequence (BAL and whole), or a split sequence of one partition (the
    state one pass would hold: one fold into the empty one)."""
    ROW: gl.constexpr = gl.SliceLayout(1, MMA)
    COL: gl.constexpr = gl.SliceLayout(0, MMA)
    if ONE_PASS:
        _finish_t(out_ptr, lse_ptr, s, h, big_m, big_l, big_a, Hq, LQ, stride_ob, stride_ot,
                  stride_oh, G, R, o.shape[0], RETURN_LSE, ROW, COL)
    elif BAL:
        if whole:
            _finish_t(out_ptr, lse_ptr, s, h, big_m, big_l, big_a, Hq, LQ, stride_ob, stride_ot,
                      stride_oh, G, R, o.shape[0], RETURN_LSE, ROW, COL)
    elif n_parts == 1:
        big_m, big_l, big_a = _fold_t(big_m, big_l, big_a, m_i, l_i, o, COL)
        _finish_t(out_ptr, lse_ptr, s, h, big_m, big_l, big_a, Hq, LQ, stride_ob, stride_ot,
                  stride_oh, G, R, o.shape[0], RETURN_LSE, ROW, COL)


@gluon.jit
def decode_sm90_swap(
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
    G: gl.constexpr, R: gl.constexpr, NQ: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr,
    PART: gl.constexpr, BLOCK_N: gl.constexpr, NS: gl.constexpr, ONE_PASS: gl.constexpr,
    MULTI: gl.constexpr, CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr, PDL: gl.constexpr,
    BAL: gl.constexpr, NB_BLOCK: gl.constexpr, GUARD: gl.constexpr, HAS_ERR: gl.constexpr,
    num_warps: gl.constexpr,
):
    # GUARD: as ``_decode_gluon_kernel.decode_sm90``
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    TPC: gl.constexpr = D // 8  # threads per row of a 16-byte-per-thread copy
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPC, TPC], [num_warps, 1], [1, 0])
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, NQ, 16])
    ROW_S: gl.constexpr = gl.SliceLayout(1, MMA)  # keys of S^T, head dim of O^T
    COL_S: gl.constexpr = gl.SliceLayout(0, MMA)  # query rows
    KV_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], dtype)
    Q_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([NQ, D], dtype)
    P_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([NQ, BLOCK_N], dtype)

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
    q_smem = gl.allocate_shared_memory(dtype, [NQ, D], Q_SMEM)  # Q [NQ, D]
    k_ring = gl.allocate_shared_memory(dtype, [NS, BLOCK_N, D], KV_SMEM)
    v_ring = gl.allocate_shared_memory(dtype, [NS, BLOCK_N, D], KV_SMEM)
    p_smem = gl.allocate_shared_memory(dtype, [NQ, BLOCK_N], P_SMEM)  # P [NQ, BLOCK_N]

    whole = p < 0  # balanced launch: this program owns its sequence (folds, writes out)
    if BAL:
        (s, seq_len, n_parts, p, t_lo, t_hi, whole, none, ids_nx, n_tiles, lim,
         bt_row) = _ring_plan(
            q_smem, q_ptr, k_ring, v_ring, kc_h, vc_h, bt_ptr, lens_ptr, lens0, j0, s, seq_len,
            LQ, h, NB, FILL_N, SLOTS, FINE, stride_qb, stride_qt, stride_qh, stride_bt, sb_k,
            sb_v, stride_kt, stride_vt, k_tok, v_tok, r, dcol, G, NQ, PAGE, PART, BLOCK_N,
            NS - 1, LD, NB_BLOCK, CAUSAL, CAP, NBLK, GUARD)
        if none:
            return
        bad_len = bad_len & (gl.program_id(1) < NB)  # an extra share's sequence is valid
    else:
        ids_nx = _ring_start(q_smem, q_ptr + s * stride_qb, k_ring, v_ring, kc_h, vc_h, bt_row,
                             t_lo, t_hi, LQ, h, stride_qt, stride_qh, sb_k, sb_v, stride_kt,
                             stride_vt, k_tok, v_tok, r, dcol, NBLK, G, NQ, PAGE, BLOCK_N,
                             NS - 1, LD, GUARD)
    l0 = 0.0
    if GUARD:  # as decode_sm90: a bad id (or length) poisons the state (l NaN)
        bad = bad_len | _bad_ids(bt_row, t_lo // PAGE, (t_hi + PAGE - 1) // PAGE, NBLK,
                                 num_warps)
        l0 = gl.where(bad, float("nan"), 0.0)
        if HAS_ERR:  # the guards' count: each guarded row once (never the data's NaN)
            if bad:  # counted by the sequence's first guarded program
                later = _bad_ids(bt_row, 0, (t_lo + PAGE - 1) // PAGE, NBLK, num_warps)
                if bad_len | ~later:
                    gl.atomic_add(err_ptr, R)

    qrow = gl.arange(0, NQ, layout=COL_S)
    pos = seq_len - LQ + qrow // G  # [NQ] absolute query position of each row
    keys = gl.arange(0, BLOCK_N, layout=ROW_S)
    ws_row0 = (s * gl.num_programs(0) + h) * P * R  # int64: (s, h, partition 0, row 0)
    m_i = gl.full([NQ], float("-inf"), gl.float32, COL_S)
    l_i = gl.zeros([NQ], gl.float32, COL_S) + l0
    o = gl.zeros([D, NQ], gl.float32, MMA)  # O^T
    big_m = gl.full([NQ], float("-inf"), gl.float32, COL_S)
    big_l = gl.zeros([NQ], gl.float32, COL_S) + l0
    big_a = gl.zeros([D, NQ], gl.float32, MMA)
    for t in range(n_tiles):
        start = t_lo + t * BLOCK_N
        nx = start + (NS - 1) * BLOCK_N
        # refill first: NS tiles in flight during the wait, for one more barrier
        gl.thread_barrier()  # every warp done with tile t - 1's slot and P^T
        _issue_kv(k_ring.index((t + NS - 1) % NS), v_ring.index((t + NS - 1) % NS), kc_h,
                  vc_h, ids_nx, nx, t_hi, sb_k, sb_v, stride_kt, stride_vt, k_tok, v_tok, r,
                  dcol, PAGE, BLOCK_N)
        ids_nx = _ids(bt_row, nx + BLOCK_N, t_hi, r, PAGE, BLOCK_N, NBLK, GUARD)
        _landed(NS - 1)  # tile t

        # S^T [BLOCK_N, NQ] = K_t Q^T
        sc = warpgroup_mma(k_ring.index(t % NS), q_smem.permute((1, 0)),
                           gl.zeros([BLOCK_N, NQ], gl.float32, MMA), use_acc=False)
        m_i, l_i, o, pr = _softmax_t(sc, m_i, l_i, o, start, lim, t_hi, keys, pos, qk_scale,
                                     CAUSAL)
        p_smem.permute((1, 0)).store(pr.to(dtype))
        fence_async_shared()
        gl.thread_barrier()  # every warp's P^T rows
        # O^T [D, NQ] += V_t^T P^T
        o = warpgroup_mma(v_ring.index(t % NS).permute((1, 0)), p_smem.permute((1, 0)), o)

        big_m, big_l, big_a, m_i, l_i, o = _end_tile_t(
            ws_ml_ptr, ws_o_ptr, ws_row0, start + BLOCK_N, t_hi, n_parts, m_i, l_i, o, big_m,
            big_l, big_a, R, PART, ONE_PASS, MMA, BAL, whole)
    async_copy.wait_group(0)  # no copy outlives the program

    _epilogue_t(out_ptr, lse_ptr, s, h, n_parts, m_i, l_i, o, big_m, big_l, big_a, Hq, LQ,
                stride_ob, stride_ot, stride_oh, G, R, ONE_PASS, RETURN_LSE, MMA, BAL, whole)
