"""Paged decode for sm_90 in Gluon, warp-specialized (``PAGEDATTN_DECODE_GLUON_FORM=ws``).

Why (bench/results/2026-12-01-h200-s14, ``timeline_cycles_5245f87.txt``): a lone decode program
spends ~32 % of its loop issuing the next tile's copies and ~63 % computing, and waits for
memory only ~4.5 %: one warp per scheduler runs both in series, so a program cannot go faster
than ~30 GB/s when the others finish (the (1, 32768) tail), while a bare cp.async ring reads
62-78 GB/s per SM (``sm_read_probe_acdec09.md``). Here a producer warpgroup issues the copies
(block ids, cp.async, an arrival on the slot's ``full`` barrier) while the consumer warpgroup
runs ``_decode_gluon_swap``'s tile arithmetic (keys on the wgmma's M side) and frees each slot
on its ``empty`` barrier: issue and compute overlap.

Same grid, partitions, workspace, fold and combine as ``_decode_gluon_kernel.decode_sm90``;
the same tile arithmetic as ``decode_sm90_swap`` (one-pass and split launches are bitwise
equal).

Measured (H200, session 14, ab_ws_2f1eee5.md, before the planner counted its registers):
0.84-1.02x ``decode_sm90``; a lone program's 1 MB loop 33.2 us (37.7 before). An A/B form
(``PAGEDATTN_DECODE_GLUON_FORM=ws``), not a default.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared,
                                                              mbarrier, warpgroup_mma)

from pagedattn.triton_kernels._decode_gluon_ring import _kv_base, _program, _stamp
from pagedattn.triton_kernels._decode_gluon_swap import _end_tile_t, _epilogue_t, _softmax_t
from pagedattn.triton_kernels._extend_gluon import _ids, _issue, _load_q
from pagedattn.triton_kernels._extend_gluon_ws import ring_barriers

P_WARPS = gl.constexpr(4)  # the producer warpgroup
P_REGS = gl.constexpr(80)  # its registers per thread (a tile's block ids, row addresses)
MAXNREG = 128  # registers per thread at launch (two programs of 8 warps per SM); the producer
# gives back down to P_REGS and the consumer takes the rest (setmaxnreg)


def smem_bytes(head_dim: int, block_n: int, ns: int, rows: int, elem: int = 2) -> int:
    """Shared memory of one program, an upper bound for the planner: Q, the rings, P^T,
    reduction scratch, 4 NS + 1 mbarriers and 256 bytes for the partitions' own scratch."""
    from pagedattn.triton_kernels._decode_gluon_swap import smem_bytes as swap_bytes
    return swap_bytes(head_dim, block_n, ns, rows, elem) + 8 * (4 * ns + 1) + 256


@gluon.jit
def _producer(q_ptr, kc_h, vc_h, bt_row, q_smem, k_ring, v_ring, q_bar, k_full, k_empty,
              v_full, v_empty, LQ, h, t_lo, t_hi, n_tiles, stride_qt, stride_qh, sb_k,
              stride_kt, sb_v, stride_vt, G: gl.constexpr, NQ: gl.constexpr, D: gl.constexpr,
              PAGE: gl.constexpr, BLOCK_N: gl.constexpr, NS: gl.constexpr):
    """cp.async Q, then K_j and V_j into ring slot j % NS once the consumer freed it; each
    thread's copies arrive on the slot's ``full`` barrier when they land. A tile's block ids
    load before the wait for its slot."""
    TPC: gl.constexpr = D // 8
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPC, TPC], [P_WARPS, 1], [1, 0])
    dcol = gl.arange(0, D, layout=gl.SliceLayout(0, LD))
    _load_q(q_smem, q_ptr, 0, 0, LQ, h, stride_qt, stride_qh, dcol, G, G, NQ, LD)
    async_copy.mbarrier_arrive(q_bar, increment_count=False)
    r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LD))
    TPP: gl.constexpr = PAGE if PAGE < BLOCK_N else BLOCK_N  # tile rows per page
    k_tok = (r % TPP) * stride_kt
    v_tok = (r % TPP) * stride_vt
    for j in range(n_tiles):
        slot = j % NS
        ph = ((j // NS) & 1) ^ 1  # the consumer's release of this slot's previous tile
        start = t_lo + j * BLOCK_N
        ids = _ids(bt_row, start, t_hi, r, PAGE, BLOCK_N)  # in flight during the wait
        mbarrier.wait(k_empty.index(slot), ph, pred=j >= NS)
        _issue(k_ring.index(slot), kc_h, ids, start, t_hi, sb_k, stride_kt, k_tok, r, dcol,
               PAGE, BLOCK_N)
        async_copy.mbarrier_arrive(k_full.index(slot), increment_count=False)
        mbarrier.wait(v_empty.index(slot), ph, pred=j >= NS)
        _issue(v_ring.index(slot), vc_h, ids, start, t_hi, sb_v, stride_vt, v_tok, r, dcol,
               PAGE, BLOCK_N)
        async_copy.mbarrier_arrive(v_full.index(slot), increment_count=False)


@gluon.jit
def _consumer(out_ptr, lse_ptr, ws_ml_ptr, ws_o_ptr, tl_ptr, q_smem, k_ring, v_ring, p_smem,
              q_bar, k_full, k_empty, v_full, v_empty, s, h, seq_len, t_lo, t_hi, lim, n_tiles,
              n_parts, P, Hq, LQ, qk_scale, stride_ob, stride_ot, stride_oh, G: gl.constexpr,
              R: gl.constexpr, NQ: gl.constexpr, D: gl.constexpr, PART: gl.constexpr,
              BLOCK_N: gl.constexpr, NS: gl.constexpr, ONE_PASS: gl.constexpr,
              CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr, TIMELINE: gl.constexpr,
              C_WARPS: gl.constexpr):
    """``decode_sm90_swap``'s tile loop and epilogue without the copies."""
    dtype: gl.constexpr = q_smem.dtype
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[C_WARPS, 1],
                                                  instr_shape=[16, NQ, 16])
    ROW_S: gl.constexpr = gl.SliceLayout(1, MMA)  # keys of S^T, head dim of O^T
    COL_S: gl.constexpr = gl.SliceLayout(0, MMA)  # query rows
    qrow = gl.arange(0, NQ, layout=COL_S)
    pos = seq_len - LQ + qrow // G  # [NQ] absolute query position of each row
    keys = gl.arange(0, BLOCK_N, layout=ROW_S)
    ws_row0 = (s * gl.num_programs(0) + h) * P * R  # int64: (s, h, partition 0, row 0)
    m_i = gl.full([NQ], float("-inf"), gl.float32, COL_S)
    l_i = gl.zeros([NQ], gl.float32, COL_S)
    o = gl.zeros([D, NQ], gl.float32, MMA)  # O^T
    big_m = gl.full([NQ], float("-inf"), gl.float32, COL_S)
    big_l = gl.zeros([NQ], gl.float32, COL_S)
    big_a = gl.zeros([D, NQ], gl.float32, MMA)
    mbarrier.wait(q_bar, 0)
    for t in range(n_tiles):
        slot = t % NS
        ph = (t // NS) & 1
        start = t_lo + t * BLOCK_N
        mbarrier.wait(k_full.index(slot), ph)
        fence_async_shared()  # cp.async writes, read by the wgmma's async proxy
        if TIMELINE:
            if t == 0:
                _stamp(tl_ptr, 1, h)
        # S^T [BLOCK_N, NQ] = K_t Q^T
        sc = warpgroup_mma(k_ring.index(slot), q_smem.permute((1, 0)),
                           gl.zeros([BLOCK_N, NQ], gl.float32, MMA), use_acc=False)
        mbarrier.arrive(k_empty.index(slot))
        m_i, l_i, o, pr = _softmax_t(sc, m_i, l_i, o, start, lim, t_hi, keys, pos, qk_scale,
                                     CAUSAL)
        gl.thread_barrier()  # every warp's wgmma of tile t - 1 read P^T
        p_smem.permute((1, 0)).store(pr.to(dtype))
        fence_async_shared()
        gl.thread_barrier()  # every warp's P^T rows
        mbarrier.wait(v_full.index(slot), ph)
        fence_async_shared()
        # O^T [D, NQ] += V_t^T P^T
        o = warpgroup_mma(v_ring.index(slot).permute((1, 0)), p_smem.permute((1, 0)), o)
        mbarrier.arrive(v_empty.index(slot))

        big_m, big_l, big_a, m_i, l_i, o = _end_tile_t(
            ws_ml_ptr, ws_o_ptr, ws_row0, start + BLOCK_N, t_hi, n_parts, m_i, l_i, o, big_m,
            big_l, big_a, R, PART, ONE_PASS, MMA)
    if TIMELINE:
        _stamp(tl_ptr, 2, h)
    _epilogue_t(out_ptr, lse_ptr, s, h, n_parts, m_i, l_i, o, big_m, big_l, big_a, Hq, LQ,
                stride_ob, stride_ot, stride_oh, G, R, ONE_PASS, RETURN_LSE, MMA)


@gluon.jit
def decode_sm90_ws(
    q_ptr,  # [B, LQ, Hq, D] (strides)
    kc_ptr, vc_ptr,  # paged caches, head dim contiguous (bhsd, bshd)
    bt_ptr, lens_ptr,  # int32 block table [B, W], seq_lens [B]
    out_ptr,  # [B, LQ, Hq, D]
    lse_ptr,  # float32 [B, LQ, Hq]
    ws_ml_ptr, ws_o_ptr,  # float32 [B, Hkv, P, R, 2], [B, Hkv, P, R, D]
    tl_ptr,  # int64 [programs, STAMPS]: TIMELINE stamps (else any pointer, never touched)
    qk_scale,  # sm_scale * log2(e)
    LQ, Hq, P, PPP,
    stride_qb, stride_qt, stride_qh, stride_ob, stride_ot, stride_oh, stride_bt,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    G: gl.constexpr, R: gl.constexpr, NQ: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr,
    PART: gl.constexpr, BLOCK_N: gl.constexpr, NS: gl.constexpr, ONE_PASS: gl.constexpr,
    MULTI: gl.constexpr, CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr, EARLY: gl.constexpr,
    PDL: gl.constexpr, TIMELINE: gl.constexpr, num_warps: gl.constexpr,
):
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    KV_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], dtype)
    Q_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([NQ, D], dtype)
    P_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([NQ, BLOCK_N], dtype)

    h, s, seq_len, n_parts, p, t_lo, t_hi = _program(tl_ptr, lens_ptr, PPP, PART, ONE_PASS,
                                                     MULTI, PDL, TIMELINE)
    if p >= n_parts:  # split: past the sequence's last partition
        if TIMELINE:
            _stamp(tl_ptr, 3, h)
        return
    n_tiles, lim, bt_row, kc_h, vc_h, sb_k, sb_v = _kv_base(
        bt_ptr, kc_ptr, vc_ptr, s, h, seq_len, t_lo, t_hi, LQ, stride_bt, stride_kb, stride_kh,
        stride_vb, stride_vh, BLOCK_N, CAUSAL)

    q_smem = gl.allocate_shared_memory(dtype, [NQ, D], Q_SMEM)  # Q [NQ, D]
    k_ring = gl.allocate_shared_memory(dtype, [NS, BLOCK_N, D], KV_SMEM)
    v_ring = gl.allocate_shared_memory(dtype, [NS, BLOCK_N, D], KV_SMEM)
    p_smem = gl.allocate_shared_memory(dtype, [NQ, BLOCK_N], P_SMEM)  # P [NQ, BLOCK_N]
    q_bar, k_full, k_empty, v_full, v_empty = ring_barriers(NS, P_WARPS, 1)
    # NOTE the partition arguments are written out: a tuple bound to a name first loses its
    # constexprs (triton 3.6)
    gl.warp_specialize([
        (_consumer, (out_ptr, lse_ptr, ws_ml_ptr, ws_o_ptr, tl_ptr, q_smem, k_ring, v_ring,
                     p_smem, q_bar, k_full, k_empty, v_full, v_empty, s, h, seq_len, t_lo, t_hi,
                     lim, n_tiles, n_parts, P, Hq, LQ, qk_scale, stride_ob, stride_ot,
                     stride_oh, G, R, NQ, D, PART, BLOCK_N, NS, ONE_PASS, CAUSAL, RETURN_LSE,
                     TIMELINE, num_warps)),
        (_producer, (q_ptr + s * stride_qb, kc_h, vc_h, bt_row, q_smem, k_ring, v_ring, q_bar,
                     k_full, k_empty, v_full, v_empty, LQ, h, t_lo, t_hi, n_tiles, stride_qt,
                     stride_qh, sb_k, stride_kt, sb_v, stride_vt, G, NQ, D, PAGE, BLOCK_N,
                     NS))],
        [P_WARPS], [P_REGS])
    if TIMELINE:
        _stamp(tl_ptr, 3, h)
