"""Extend attention for sm_90 in Gluon: a producer warpgroup gathers the pages, two consumer
warpgroups run the softmax of tile t under the P @ V wgmma of tile t-1.

Why (bench/NOTES_extend.md, sessions 5, 10 and 11): the Triton loop runs its two wgmmas and the
softmax of a tile back to back, so a 128 x 128 tile costs the tensor time (~1.4 us at the
matmul rate) plus the softmax (~0.8 us). Here each consumer iteration issues S_t = Q K_t^T and
O += P_{t-1} V_{t-1} together, waits for S_t only, and computes the softmax of tile t while the
P V wgmma runs (FA3's intra-warpgroup overlap); two 4-warp consumers of 64 rows each drift out of
phase, so one's softmax also runs under the other's wgmmas. Everything is explicit: the layouts,
3-slot shared-memory rings for K and V filled by cp.async from the paged cache, mbarriers, the
wgmma waits.

Two kernels (``PAGEDATTN_EXTEND_GLUON_WS``, :func:`warp_specialized`): ``extend_fwd_sm90_ws``
in ``_extend_gluon_ws.py`` (the default; producer + two consumers, or + one 8-warp consumer) and
:func:`extend_fwd_sm90` here (one role: the same loop with every warp issuing the copies;
measured slower, kept for the A/B). This module also holds the helpers both use.

Scope (the launcher checks it: :func:`unsupported`): sm_90 under triton 3.6, fp16/bf16 q and
cache of the same dtype, head_dim 64 or 128, a cache whose head dim is contiguous (bhsd, bshd),
at least one 128-row block of queries, new keys read from the cache, no custom mask, window,
soft-cap, ALiBi or sinks. Grid and row order as ``extend._extend_fwd``: (query blocks
last-first, KV head, request); a program owns BLOCK_M = BLOCK_Q x GROUP_P rows (query token
major, GQA head minor).

Single-role pipeline, 3 slots per ring; cp.async group G_t = {K_t, V_{t-1}} (G_0 also holds Q):

  iteration t:  wait G_t | barrier | S_t = Q K_t^T (async) | O += P_{t-1} V_{t-1} (async)
                issue K_{t+2}, V_{t+1} (slots freed by tiles t-1, t-2) | wait S_t
                softmax(S_t) -> P_t, alpha_t | wait P V | O *= alpha_t
"""
import os

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared,
                                                              warpgroup_mma, warpgroup_mma_wait)

from pagedattn._triton import interpreter_enabled
from pagedattn.triton_kernels._common import LN2, LOG2E

_LN2 = gl.constexpr(LN2)  # jit code reads globals only as constexpr

BLOCK_M, BLOCK_N, NUM_WARPS = 128, 128, 8
# producer registers of the warp-specialized form: the least with no spill (sm_90, triton 3.6:
# 96 spills 4 bytes); the consumers get (65536 - 128 * 104) / 256 -> 200 and need ~200
P_REGS = 104
C_REGS = 200  # the second consumer of the split form (the first gets 208)
_ALIGN = 8  # elements: every row a cp.async reads starts on 16 bytes


def unsupported(call, ks, vs, family: str, group_p: int, max_q: int) -> list:
    """Reasons this kernel cannot serve a validated ExtendCall ([] = it can)."""
    q, g, o = call.q, call.geom, call.opts
    why = []
    if family != "sm90" or interpreter_enabled() or not q.is_cuda \
            or torch.cuda.get_device_capability(q.device) != (9, 0):  # wgmma: sm_90 only
        why.append("not an sm_90 GPU")
    if q.dtype not in (torch.float16, torch.bfloat16) or call.k_cache.dtype != q.dtype \
            or call.v_cache.dtype != q.dtype or call.out.dtype != q.dtype:
        why.append("q, caches and out must share one 16-bit dtype")
    if g.head_dim not in (64, 128):
        why.append(f"head_dim {g.head_dim} not 64 or 128")
    if call.k_new is not None or call.custom_mask is not None:
        why.append("k_new/v_new or a custom mask")
    if o.sliding_window is not None or o.logit_cap is not None or o.alibi_slopes is not None \
            or o.sinks is not None:
        why.append("window, soft-cap, ALiBi or sinks")
    if ks.x < g.head_dim or ks.dim_lo != 1 or vs.dim_lo != 1:
        why.append("the cache's head dim is not contiguous")
    if group_p > BLOCK_M or group_p * max_q < BLOCK_M:
        why.append("fewer query rows than one 128-row block")
    strides = (q.stride(0), q.stride(1), call.out.stride(0), call.out.stride(1), ks.block,
               ks.token, ks.head, vs.block, vs.token, vs.head)
    ptrs = (q, call.out, call.k_cache, call.v_cache)
    if any(x % _ALIGN for x in strides) or any(t.data_ptr() % 16 for t in ptrs) \
            or q.stride(2) != 1 or call.out.stride(2) != 1:
        why.append("rows not 16-byte aligned")
    return why


def warp_specialized() -> int:
    """``PAGEDATTN_EXTEND_GLUON_WS`` (A/B runs): 2 (default) a producer warpgroup and two 4-warp
    consumers of 64 rows each (``_extend_gluon_ws.extend_fwd_sm90_ws``, SPLIT), 1 one 8-warp
    consumer, 0 the single-role loop (:func:`extend_fwd_sm90`). H200, session 11 call 7, % of the
    matmul rate on the four issue shapes: 2: 67.0 / 60.1 / 50.4 / 50.4, 1: 53.3 / 50.7 / 44.0 /
    47.3, `early` (Triton) 57.7 / 55.2 / 43.9 / 46.9."""
    raw = os.environ.get("PAGEDATTN_EXTEND_GLUON_WS", "2")
    if raw not in ("0", "1", "2"):
        raise ValueError(f"PAGEDATTN_EXTEND_GLUON_WS={raw!r}: expected 0, 1 or 2")
    return int(raw)


def launch(call, ks, vs, group: int, group_p: int, max_q: int, lse):
    """Run the kernel for a call :func:`unsupported` accepted; writes call.out (and lse)."""
    q, g = call.q, call.geom
    ret = bool(call.return_lse)
    grid = (triton.cdiv(max_q, BLOCK_M // group_p), g.num_kv_heads, call.num_seqs)
    ws = warp_specialized()
    extra = dict(P_REGS=P_REGS, SPLIT=ws == 2, C_REGS=C_REGS) if ws else {}
    # the warp-specialized form imports this module's helpers: loaded here, not at the top
    from pagedattn.triton_kernels._extend_gluon_ws import extend_fwd_sm90_ws
    (extend_fwd_sm90_ws if ws else extend_fwd_sm90)[grid](
        q, call.k_cache, call.v_cache, call.out, lse, call.block_table, call.cu_seqlens_q,
        call.seq_lens, float(call.opts.scale) * LOG2E, q.stride(0), q.stride(1),
        call.out.stride(0), call.out.stride(1), lse.stride(0) if ret else 0,
        lse.stride(1) if ret else 0, call.block_table.stride(0), ks.block, ks.token, ks.head,
        vs.block, vs.token, vs.head, GROUP=group, GROUP_P=group_p, HEAD_DIM=g.head_dim,
        PAGE=g.block_size, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=bool(call.causal),
        RETURN_LSE=ret, LOOP_FENCE=os.environ.get("PAGEDATTN_EXTEND_GLUON_FENCE", "") == "1",
        num_warps=NUM_WARPS // 2 if ws == 2 else NUM_WARPS, **extra)


@gluon.jit
def _head_bases(kc_ptr, vc_ptr, kvh, stride_kh, stride_vh, stride_kb, stride_vb):
    """(this KV head's K and V bases, the caches' block strides as int64 of their uint32)."""
    return (kc_ptr + kvh.to(gl.int64) * stride_kh, vc_ptr + kvh.to(gl.int64) * stride_vh,
            stride_kb.to(gl.uint32).to(gl.int64), stride_vb.to(gl.uint32).to(gl.int64))


@gluon.jit
def _copy_rows(stride_kt, stride_vt, D: gl.constexpr, PAGE: gl.constexpr,
               BLOCK_N: gl.constexpr, LD: gl.constexpr):
    """(head-dim columns, key rows of a tile, the rows' loop-invariant K and V token offsets:
    int32, within one page) of the cp.async copies in layout LD."""
    dcol = gl.arange(0, D, layout=gl.SliceLayout(0, LD))
    r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LD))  # key row within a tile
    TPP: gl.constexpr = PAGE if PAGE < BLOCK_N else BLOCK_N  # tile rows per page
    return dcol, r, (r % TPP) * stride_kt, (r % TPP) * stride_vt


@gluon.jit
def _ids(bt_row, start, hi, r, PAGE: gl.constexpr, BLOCK_N: gl.constexpr):
    """Block ids of the tile at ``start`` (a multiple of BLOCK_N; 0 past hi: never loaded): an
    int32 [N] per key row when pages are smaller than the tile, else one scalar."""
    if PAGE < BLOCK_N:
        return gl.load(bt_row + (start // PAGE + r // PAGE), mask=start + r < hi, other=0)
    else:
        return gl.load(bt_row + start // PAGE, mask=start < hi, other=0)


@gluon.jit
def _issue(dst, base, ids, start, hi, stride_b, stride_t, tok, r, dcol,
           PAGE: gl.constexpr, BLOCK_N: gl.constexpr):
    """cp.async the BLOCK_N rows at ``start`` into dst; rows at or past hi are zero-filled.

    stride_b: the block stride as a zero-extended int64 and ids >= 0, so id * stride_b is one
    32 x 32 -> 64-bit multiply; tok: the loop-invariant token-in-page term [N] (int32).
    """
    if PAGE <= BLOCK_N:
        t_off = tok
    else:  # the tile is part of one page
        t_off = (start % PAGE) * stride_t + tok
    row = ids.to(gl.uint32).to(gl.int64) * stride_b + t_off  # [N]
    async_copy.async_copy_global_to_shared(dst, base + (row[:, None] + dcol[None, :]),
                                           mask=(start + r < hi)[:, None])


@gluon.jit
def _softmax(s, m_i, l_i, start, full, hi, row_pos, qk_scale, CAUSAL: gl.constexpr,
             BLOCK_N: gl.constexpr, COL: gl.constexpr):
    """Fold tile s [M, N] (raw q.k) into (m, l); returns (m, l, alpha, p), log2 domain.

    Tiles below ``full`` are visible to every row: one FFMA per logit. Others (the diagonal,
    the tail) are masked. Every row sees key 0 in tile 0, so m is finite from the first tile
    on and no -inf guard is needed.
    """
    if start >= full:
        j = start + gl.arange(0, BLOCK_N, layout=COL)
        vis = (j < hi)[None, :]
        if CAUSAL:
            vis = vis & (j[None, :] <= row_pos[:, None])
        s = gl.where(vis, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        p = gl.exp2(s - m_new[:, None])
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    return m_new, l_i * alpha + gl.sum(p, 1), alpha, p


@gluon.jit
def _program(cu_ptr, lens_ptr, BLOCK_Q: gl.constexpr):
    """(request b, KV head, first query token, q0, Lq, Lk) of this program: grid (query blocks
    last-first, KV head, request), as ``extend._extend_fwd``."""
    b = gl.program_id(2)
    kvh = gl.program_id(1)
    tok0 = (gl.num_programs(0) - 1 - gl.program_id(0)) * BLOCK_Q  # last query block first
    q0 = gl.load(cu_ptr + b)
    lq = gl.load(cu_ptr + b + 1) - q0
    return b, kvh, tok0, q0, lq, gl.load(lens_ptr + b)


@gluon.jit
def _key_range(tok0, lq, lk, CAUSAL: gl.constexpr, BLOCK_Q: gl.constexpr,
               BLOCK_N: gl.constexpr):
    """(prefix, hi, full, n_tiles) of the query block at tok0: keys [0, hi) are read, tiles below
    ``full`` are visible to every row; n_tiles >= 1 when tok0 < lq (then lk >= lq > tok0)."""
    prefix = lk - lq
    if CAUSAL:
        hi = gl.minimum(lk, prefix + tok0 + BLOCK_Q)  # past the block's last query position
        full = (prefix + tok0 + 1) // BLOCK_N * BLOCK_N  # keys every row of the block sees
    else:
        hi = lk
        full = lk // BLOCK_N * BLOCK_N
    return prefix, hi, full, gl.cdiv(hi, BLOCK_N)


@gluon.jit
def _load_q(q_smem, q_ptr, q0, tok0, lq, kvh, stride_qt, stride_qh, dcol, GROUP: gl.constexpr,
            GROUP_P: gl.constexpr, BLOCK_M: gl.constexpr, LD: gl.constexpr):
    """cp.async the block's BLOCK_M query rows (token major, GQA head minor) into q_smem; rows
    past lq or past the group are zero-filled."""
    qr = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LD))
    q_tok = tok0 + qr // GROUP_P
    q_ok = (q_tok < lq) & (qr % GROUP_P < GROUP)
    q_head = kvh * GROUP + qr % GROUP_P
    q_row = (q0 + q_tok).to(gl.int64) * stride_qt + q_head.to(gl.int64) * stride_qh
    async_copy.async_copy_global_to_shared(q_smem, q_ptr + (q_row[:, None] + dcol[None, :]),
                                           mask=q_ok[:, None])


@gluon.jit
def _epilogue(out_ptr, lse_ptr, o, m_i, l_i, q0, tok0, lq, kvh, stride_ot, stride_oh, stride_lt,
              stride_lh, GROUP: gl.constexpr, GROUP_P: gl.constexpr, HEAD_DIM: gl.constexpr,
              ROW0: gl.constexpr, M: gl.constexpr, RETURN_LSE: gl.constexpr,
              ROW_O: gl.constexpr, COL_O: gl.constexpr):
    """Normalise and store the valid rows of [ROW0, ROW0 + M) (and the natural-log lse)."""
    dtype: gl.constexpr = out_ptr.dtype.element_ty
    l_o = gl.convert_layout(l_i, ROW_O)
    o = o * gl.where(l_o > 0, 1.0 / gl.where(l_o > 0, l_o, 1.0), 0.0)[:, None]
    ro = ROW0 + gl.arange(0, M, layout=ROW_O)
    o_tok = tok0 + ro // GROUP_P
    o_head = kvh * GROUP + ro % GROUP_P
    o_ok = (o_tok < lq) & (ro % GROUP_P < GROUP)
    do = gl.arange(0, HEAD_DIM, layout=COL_O)
    o_tok64 = (q0 + o_tok).to(gl.int64)
    o_row = o_tok64 * stride_ot + o_head.to(gl.int64) * stride_oh
    gl.store(out_ptr + (o_row[:, None] + do[None, :]), o.to(dtype),
             mask=o_ok[:, None] & (do < HEAD_DIM)[None, :])
    if RETURN_LSE:
        m_o = gl.convert_layout(m_i, ROW_O)
        lse = gl.where(l_o > 0, m_o + gl.log2(gl.where(l_o > 0, l_o, 1.0)), float("-inf")) * _LN2
        gl.store(lse_ptr + (o_tok64 * stride_lt + o_head.to(gl.int64) * stride_lh), lse,
                 mask=o_ok)


@gluon.jit
def extend_fwd_sm90(
    q_ptr, kc_ptr, vc_ptr, out_ptr, lse_ptr,  # q/out [T, Hq, D]; caches: any D-contiguous layout
    bt_ptr, cu_ptr, lens_ptr,  # int32 block table [B, W], cu_seqlens_q [B + 1], seq_lens [B]
    qk_scale,  # sm_scale * log2(e)
    stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, stride_lh, stride_bt,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    GROUP: gl.constexpr, GROUP_P: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
    RETURN_LSE: gl.constexpr, LOOP_FENCE: gl.constexpr, num_warps: gl.constexpr,
):
    BLOCK_Q: gl.constexpr = BLOCK_M // GROUP_P
    NS: gl.constexpr = 3  # ring slots (STAGES)
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    TPC: gl.constexpr = HEAD_DIM // 8  # threads per row of a 16-byte-per-thread copy
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPC, TPC], [num_warps, 1], [1, 0])
    MMA_S: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                    instr_shape=[16, BLOCK_N, 16])
    MMA_O: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                    instr_shape=[16, HEAD_DIM, 16])
    P_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_O, k_width=2)
    ROW_S: gl.constexpr = gl.SliceLayout(1, MMA_S)
    ROW_O: gl.constexpr = gl.SliceLayout(1, MMA_O)
    KV_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    Q_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)

    b, kvh, tok0, q0, lq, lk = _program(cu_ptr, lens_ptr, BLOCK_Q)
    if tok0 >= lq:
        return
    prefix, hi, full, n_tiles = _key_range(tok0, lq, lk, CAUSAL, BLOCK_Q, BLOCK_N)

    bt_row = bt_ptr + b.to(gl.int64) * stride_bt
    kc_h, vc_h, sb_k, sb_v = _head_bases(kc_ptr, vc_ptr, kvh, stride_kh, stride_vh, stride_kb,
                                         stride_vb)
    dcol, r, k_tok, v_tok = _copy_rows(stride_kt, stride_vt, HEAD_DIM, PAGE, BLOCK_N, LD)
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], Q_SMEM)
    k_ring = gl.allocate_shared_memory(dtype, [NS, BLOCK_N, HEAD_DIM], KV_SMEM)
    v_ring = gl.allocate_shared_memory(dtype, [NS, BLOCK_N, HEAD_DIM], KV_SMEM)

    # prologue: G_0 = {Q, K_0}, G_1 = {K_1, V_0}; then (slots never used) G_2 = {K_2, V_1}
    ids0 = _ids(bt_row, 0, hi, r, PAGE, BLOCK_N)
    ids1 = _ids(bt_row, BLOCK_N, hi, r, PAGE, BLOCK_N)
    ids_v = _ids(bt_row, 2 * BLOCK_N, hi, r, PAGE, BLOCK_N)
    _load_q(q_smem, q_ptr, q0, tok0, lq, kvh, stride_qt, stride_qh, dcol, GROUP, GROUP_P, BLOCK_M,
            LD)
    _issue(k_ring.index(0), kc_h, ids0, 0, hi, sb_k, stride_kt, k_tok, r, dcol,
           PAGE, BLOCK_N)
    async_copy.commit_group()
    _issue(k_ring.index(1), kc_h, ids1, BLOCK_N, hi, sb_k, stride_kt, k_tok, r, dcol,
           PAGE, BLOCK_N)
    _issue(v_ring.index(0), vc_h, ids0, 0, hi, sb_v, stride_vt, v_tok, r, dcol,
           PAGE, BLOCK_N)
    async_copy.commit_group()
    ids_k = _ids(bt_row, 3 * BLOCK_N, hi, r, PAGE, BLOCK_N)
    async_copy.wait_group(1)
    fence_async_shared()
    gl.thread_barrier()
    _issue(k_ring.index(2), kc_h, ids_v, 2 * BLOCK_N, hi, sb_k, stride_kt, k_tok, r, dcol,
           PAGE, BLOCK_N)
    _issue(v_ring.index(1), vc_h, ids1, BLOCK_N, hi, sb_v, stride_vt, v_tok, r, dcol,
           PAGE, BLOCK_N)
    async_copy.commit_group()

    rows = gl.arange(0, BLOCK_M, layout=ROW_S)
    row_pos = prefix + tok0 + rows // GROUP_P  # [M] absolute query position
    s = warpgroup_mma(q_smem, k_ring.index(0).permute((1, 0)),
                      gl.zeros([BLOCK_M, BLOCK_N], gl.float32, MMA_S), use_acc=False)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, ROW_S)
    l_i = gl.zeros([BLOCK_M], gl.float32, ROW_S)
    m_i, l_i, alpha, p = _softmax(s, m_i, l_i, 0, full, hi, row_pos, qk_scale, CAUSAL, BLOCK_N,
                                  gl.SliceLayout(0, MMA_S))
    p16 = gl.convert_layout(p.to(dtype), P_OP)
    o = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, MMA_O)
    for t in range(1, n_tiles):
        async_copy.wait_group(1)  # G_t: K_t and V_{t-1} landed (this thread's copies)
        if LOOP_FENCE:  # A/B knob; Triton's own pipelines fence only before their loops
            fence_async_shared()
        gl.thread_barrier()  # every thread's copies; every warp past tile t-1's waits
        s = warpgroup_mma(q_smem, k_ring.index(t % NS).permute((1, 0)), s, use_acc=False,
                          is_async=True)
        o = warpgroup_mma(p16, v_ring.index((t - 1) % NS), o, is_async=True)
        # under the wgmmas: refill the slots of tiles t-1 (K) and t-2 (V), fetch later ids
        _issue(k_ring.index((t + 2) % NS), kc_h, ids_k, (t + 2) * BLOCK_N, hi, sb_k, stride_kt,
               k_tok, r, dcol, PAGE, BLOCK_N)
        _issue(v_ring.index((t + 1) % NS), vc_h, ids_v, (t + 1) * BLOCK_N, hi, sb_v, stride_vt,
               v_tok, r, dcol, PAGE, BLOCK_N)
        async_copy.commit_group()
        ids_v = ids_k
        ids_k = _ids(bt_row, (t + 3) * BLOCK_N, hi, r, PAGE, BLOCK_N)  # used one tile later
        s = warpgroup_mma_wait(1, deps=[s])
        m_i, l_i, alpha, p = _softmax(s, m_i, l_i, t * BLOCK_N, full, hi, row_pos, qk_scale,
                                      CAUSAL, BLOCK_N, gl.SliceLayout(0, MMA_S))
        o, p16 = warpgroup_mma_wait(0, deps=[o, p16])
        o = o * gl.convert_layout(alpha, ROW_O)[:, None]
        p16 = gl.convert_layout(p.to(dtype), P_OP)
    async_copy.wait_group(0)
    fence_async_shared()
    gl.thread_barrier()
    o = warpgroup_mma(p16, v_ring.index((n_tiles - 1) % NS), o)

    _epilogue(out_ptr, lse_ptr, o, m_i, l_i, q0, tok0, lq, kvh, stride_ot, stride_oh, stride_lt,
              stride_lh, GROUP, GROUP_P, HEAD_DIM, 0, BLOCK_M, RETURN_LSE, ROW_O,
              gl.SliceLayout(0, MMA_O))
