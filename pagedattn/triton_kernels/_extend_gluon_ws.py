"""The warp-specialized form of the sm_90 extend kernel (``_extend_gluon.py`` launches it, with
its helpers): a producer warpgroup gathers the pages into the K and V rings, the consumers only
compute (:func:`extend_fwd_sm90_ws`)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy,
                                                              mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from pagedattn.triton_kernels._extend_gluon import (_epilogue, _head_bases, _ids, _issue,
                                                    _key_range, _load_q, _program, _softmax)
from pagedattn.triton_kernels._extend_gluon_guard import nan_rows, nan_span, request_ok


@gluon.jit
def ring_barriers(NS: gl.constexpr, P_WARPS: gl.constexpr, CONSUMERS: gl.constexpr):
    """(q_bar, k_full, k_empty, v_full, v_empty) of a warp-specialized K/V ring of NS slots
    (the extend and decode ``ws`` kernels): q's and the full barriers count one cp.async arrival
    per producer thread (P_WARPS warps); the empty ones one arrival per consumer partition
    (Gluon's mbarrier.arrive syncs the partition and arrives from one thread)."""
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=P_WARPS * 32)
    for i in gl.static_range(NS):
        mbarrier.init(k_full.index(i), count=P_WARPS * 32)
        mbarrier.init(v_full.index(i), count=P_WARPS * 32)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)
        mbarrier.init(v_empty.index(i), count=CONSUMERS)
    return q_bar, k_full, k_empty, v_full, v_empty


@gluon.jit
def _ws_producer(q_ptr, kc_h, vc_h, bt_row, q_smem, k_ring, v_ring, q_bar, k_full, k_empty,
                 v_full, v_empty, q0, tok0, lq, kvh, hi, n_tiles, stride_qt, stride_qh, sb_k,
                 stride_kt, sb_v, stride_vt, GROUP: gl.constexpr, GROUP_P: gl.constexpr,
                 HEAD_DIM: gl.constexpr, PAGE: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, NS: gl.constexpr, P_WARPS: gl.constexpr):
    """cp.async Q, then K_j and V_j into ring slot j % NS once the consumers freed it; each
    copy arrives on the slot's ``full`` barrier when it lands. A tile's block ids load before
    the wait for its slot (the consumers free a slot two tiles before they need its data)."""
    TPC: gl.constexpr = HEAD_DIM // 8
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPC, TPC], [P_WARPS, 1], [1, 0])
    dcol = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, LD))
    _load_q(q_smem, q_ptr, q0, tok0, lq, kvh, stride_qt, stride_qh, dcol, GROUP, GROUP_P, BLOCK_M,
            LD)
    async_copy.mbarrier_arrive(q_bar, increment_count=False)
    # a tile goes in two halves of SUB rows: 8 rows per producer thread at a time (registers)
    SUB: gl.constexpr = BLOCK_N // 2
    TPP: gl.constexpr = PAGE if PAGE < SUB else SUB
    r = gl.arange(0, SUB, layout=gl.SliceLayout(1, LD))
    for j in range(n_tiles):
        slot = j % NS
        ph = ((j // NS) & 1) ^ 1  # the consumers' release of this slot's previous tile
        start = j * BLOCK_N
        ids0 = _ids(bt_row, start, hi, r, PAGE, SUB)  # in flight during the wait
        ids1 = _ids(bt_row, start + SUB, hi, r, PAGE, SUB)
        mbarrier.wait(k_empty.index(slot), ph, pred=j >= NS)
        k_dst = k_ring.index(slot)
        _issue(k_dst.slice(0, SUB), kc_h, ids0, start, hi, sb_k, stride_kt,
               (r % TPP) * stride_kt, r, dcol, PAGE, SUB)
        _issue(k_dst.slice(SUB, SUB), kc_h, ids1, start + SUB, hi, sb_k, stride_kt,
               (r % TPP) * stride_kt, r, dcol, PAGE, SUB)
        async_copy.mbarrier_arrive(k_full.index(slot), increment_count=False)
        mbarrier.wait(v_empty.index(slot), ph, pred=j >= NS)
        v_dst = v_ring.index(slot)
        _issue(v_dst.slice(0, SUB), vc_h, ids0, start, hi, sb_v, stride_vt,
               (r % TPP) * stride_vt, r, dcol, PAGE, SUB)
        _issue(v_dst.slice(SUB, SUB), vc_h, ids1, start + SUB, hi, sb_v, stride_vt,
               (r % TPP) * stride_vt, r, dcol, PAGE, SUB)
        async_copy.mbarrier_arrive(v_full.index(slot), increment_count=False)


@gluon.jit
def _ws_consumer(out_ptr, lse_ptr, q_smem, k_ring, v_ring, q_bar, k_full, k_empty, v_full,
                 v_empty, q0, tok0, lq, kvh, prefix, hi, full, n_tiles, qk_scale, stride_ot,
                 stride_oh, stride_lt, stride_lh, GROUP: gl.constexpr, GROUP_P: gl.constexpr,
                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 NS: gl.constexpr, CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr,
                 C_WARPS: gl.constexpr, ROW0: gl.constexpr, M: gl.constexpr):
    """The consumer loop (no loads), for the block's rows
    [ROW0, ROW0 + M): S_t and P_{t-1} V_{t-1} in flight together, the softmax of tile t under
    the second; slots released once their wgmma is done."""
    dtype: gl.constexpr = q_smem.dtype
    MMA_S: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[C_WARPS, 1],
                                                    instr_shape=[16, BLOCK_N, 16])
    MMA_O: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[C_WARPS, 1],
                                                    instr_shape=[16, HEAD_DIM, 16])
    P_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_O, k_width=2)
    ROW_S: gl.constexpr = gl.SliceLayout(1, MMA_S)
    ROW_O: gl.constexpr = gl.SliceLayout(1, MMA_O)
    rows = ROW0 + gl.arange(0, M, layout=ROW_S)
    row_pos = prefix + tok0 + rows // GROUP_P
    q_mine = q_smem if M == BLOCK_M else q_smem.slice(ROW0, M)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_full.index(0), 0)
    s = warpgroup_mma(q_mine, k_ring.index(0).permute((1, 0)),
                      gl.zeros([M, BLOCK_N], gl.float32, MMA_S), use_acc=False)
    mbarrier.arrive(k_empty.index(0))
    m_i = gl.full([M], float("-inf"), gl.float32, ROW_S)
    l_i = gl.zeros([M], gl.float32, ROW_S)
    m_i, l_i, alpha, p = _softmax(s, m_i, l_i, 0, full, hi, row_pos, qk_scale, CAUSAL, BLOCK_N,
                                  gl.SliceLayout(0, MMA_S))
    p16 = gl.convert_layout(p.to(dtype), P_OP)
    o = gl.zeros([M, HEAD_DIM], gl.float32, MMA_O)
    for t in range(1, n_tiles):
        ks = t % NS
        vs = (t - 1) % NS
        mbarrier.wait(k_full.index(ks), (t // NS) & 1)
        s = warpgroup_mma(q_mine, k_ring.index(ks).permute((1, 0)), s, use_acc=False,
                          is_async=True)
        mbarrier.wait(v_full.index(vs), ((t - 1) // NS) & 1)
        o = warpgroup_mma(p16, v_ring.index(vs), o, is_async=True)
        s = warpgroup_mma_wait(1, deps=[s])
        mbarrier.arrive(k_empty.index(ks))
        m_i, l_i, alpha, p = _softmax(s, m_i, l_i, t * BLOCK_N, full, hi, row_pos, qk_scale,
                                      CAUSAL, BLOCK_N, gl.SliceLayout(0, MMA_S))
        o, p16 = warpgroup_mma_wait(0, deps=[o, p16])
        mbarrier.arrive(v_empty.index(vs))
        o = o * gl.convert_layout(alpha, ROW_O)[:, None]
        p16 = gl.convert_layout(p.to(dtype), P_OP)
    vs = (n_tiles - 1) % NS
    mbarrier.wait(v_full.index(vs), ((n_tiles - 1) // NS) & 1)
    o = warpgroup_mma(p16, v_ring.index(vs), o)
    _epilogue(out_ptr, lse_ptr, o, m_i, l_i, q0, tok0, lq, kvh, stride_ot, stride_oh, stride_lt,
              stride_lh, GROUP, GROUP_P, HEAD_DIM, ROW0, M, RETURN_LSE, ROW_O,
              gl.SliceLayout(0, MMA_O))


@gluon.jit
def extend_fwd_sm90_ws(
    q_ptr, kc_ptr, vc_ptr, out_ptr, lse_ptr, bt_ptr, cu_ptr, lens_ptr,
    err_ptr,  # int32 [1]: guarded rows are counted here (HAS_ERR), else any pointer
    qk_scale, T, BT_W, NBLK,  # q's rows, the block table's width, blocks in the cache (GUARD)
    stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, stride_lh, stride_bt,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    GROUP: gl.constexpr, GROUP_P: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
    RETURN_LSE: gl.constexpr, P_REGS: gl.constexpr, C_REGS: gl.constexpr,
    GUARD: gl.constexpr, HAS_ERR: gl.constexpr, num_warps: gl.constexpr,
):
    """Grid (query blocks last-first, KV head, request). One producer warpgroup (4 warps,
    P_REGS registers per thread) and two 4-warp consumers of 64 rows each (num_warps 4; the
    second gets C_REGS registers) whose phases drift apart, so one's softmax can run under the
    other's wgmmas."""
    BLOCK_Q: gl.constexpr = BLOCK_M // GROUP_P
    NS: gl.constexpr = 3
    P_WARPS: gl.constexpr = 4
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    KV_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    Q_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)

    b, kvh, tok0, q0, lq, lk = _program(cu_ptr, lens_ptr, BLOCK_Q)
    bt_row = bt_ptr + b.to(gl.int64) * stride_bt
    if GUARD:  # an invalid request: NaN rows (its first query block's program), no key loop
        if request_ok(cu_ptr, q0, lq, lk, bt_row, BT_W * PAGE, NBLK, T, num_warps, BLOCK_Q,
                      PAGE) == 0:
            if tok0 == 0:  # a bad cu_seqlens_q: request 0's program takes every row of q
                r0, nr = nan_span(cu_ptr, b, q0, lq, T, num_warps)
                nan_rows(out_ptr, lse_ptr, err_ptr, r0, nr, T, kvh, stride_ot, stride_oh,
                         stride_lt, stride_lh, GROUP, HEAD_DIM, RETURN_LSE, HAS_ERR, num_warps)
            return
    if tok0 >= lq:
        return
    prefix, hi, full, n_tiles = _key_range(tok0, lq, lk, CAUSAL, BLOCK_Q, BLOCK_N)
    kc_h, vc_h, sb_k, sb_v = _head_bases(kc_ptr, vc_ptr, kvh, stride_kh, stride_vh, stride_kb,
                                         stride_vb)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], Q_SMEM)
    k_ring = gl.allocate_shared_memory(dtype, [NS, BLOCK_N, HEAD_DIM], KV_SMEM)
    v_ring = gl.allocate_shared_memory(dtype, [NS, BLOCK_N, HEAD_DIM], KV_SMEM)
    q_bar, k_full, k_empty, v_full, v_empty = ring_barriers(NS, P_WARPS, 2)
    # NOTE the partition arguments are written out: a tuple bound to a name first loses its
    # constexprs (triton 3.6)
    HALF: gl.constexpr = BLOCK_M // 2
    gl.warp_specialize([
        (_ws_consumer, (out_ptr, lse_ptr, q_smem, k_ring, v_ring, q_bar, k_full, k_empty,
                        v_full, v_empty, q0, tok0, lq, kvh, prefix, hi, full, n_tiles,
                        qk_scale, stride_ot, stride_oh, stride_lt, stride_lh, GROUP, GROUP_P,
                        HEAD_DIM, BLOCK_M, BLOCK_N, NS, CAUSAL, RETURN_LSE,
                        num_warps, 0, HALF)),
        (_ws_consumer, (out_ptr, lse_ptr, q_smem, k_ring, v_ring, q_bar, k_full, k_empty,
                        v_full, v_empty, q0, tok0, lq, kvh, prefix, hi, full, n_tiles,
                        qk_scale, stride_ot, stride_oh, stride_lt, stride_lh, GROUP, GROUP_P,
                        HEAD_DIM, BLOCK_M, BLOCK_N, NS, CAUSAL, RETURN_LSE,
                        num_warps, HALF, HALF)),
        (_ws_producer, (q_ptr, kc_h, vc_h, bt_row, q_smem, k_ring, v_ring, q_bar, k_full,
                        k_empty, v_full, v_empty, q0, tok0, lq, kvh, hi, n_tiles, stride_qt,
                        stride_qh,
                        sb_k, stride_kt, sb_v, stride_vt, GROUP, GROUP_P, HEAD_DIM, PAGE,
                        BLOCK_M, BLOCK_N, NS, P_WARPS))],
        [num_warps, P_WARPS], [C_REGS, P_REGS])

