"""Paged decode attention in Triton: one-pass (v1) and split-KV (v2) + combine (reference §1.4).

Grid and work split
-------------------
One program per (KV head, sequence[, partition]) computes all G = Hq/Hkv query heads of the group
(times Lq query tokens for speculative decode): R = G*Lq rows padded to BLOCK_M >= 16 for
``tl.dot``, so each KV byte is read once (§1.4.4). A sequence is cut into partitions of
PARTITION_SIZE tokens (512; 256 when G > 15; ``partition_size=`` overrides); each partition runs
the online softmax over KV tiles of BLOCK_N tokens and yields (m_p, l_p, acc_p), and the
partitions are merged in order by :func:`_merge`, an online merge: with M' = max(M, m_p),
L' = L exp2(M - M') + l_p exp2(m_p - M') and likewise for the output accumulator (§1.4.3).

Two launch shapes evaluate exactly this arithmetic:

* split (v2): grid (Hkv, B, P_max), one program per partition; a sequence with one partition
  writes out/lse directly, a longer one parks (m_p, l_p, acc_p) in a float32 workspace and a
  combine launch on (Hkv, B, R) merges them. Used when B * Hkv does not fill the GPU.
* one-pass (v1): grid (Hkv, B); the program streams its whole sequence through ONE pipelined
  tile loop and merges each partition's state into registers at the partition's last tile (no
  workspace, no second launch). Used when B * Hkv >= dispatch.core.FILL * SMs.

NOTE batch invariance: split points depend only on the sequence and the partition size (never
on the batch); both launch shapes run the same tile code on the same tiles and the same merge
(explicit FMAs) in the same partition order, and a partition with no key is an exact no-op of
the merge. So a sequence's output is bitwise identical whatever else is in the batch and
whichever launch shape the batch size selects.
"""
import os

import torch
import triton
import triton.language as tl

from pagedattn import layouts as L
from pagedattn.dispatch import core as _dispatch
from pagedattn.reference import FP8_DTYPES
from pagedattn.triton_kernels._common import (LN2, LOG2E, alibi_bias, finalize_state, kv_offset,
                                              online_softmax_step, soft_cap, visible)

try:  # grid dependency control (programmatic dependent launch), NVIDIA sm_90+
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # older triton: PDL stays off (_pdl), the names are never traced
    gdc_launch_dependents = gdc_wait = None

FORCE_MODE = None  # tests/bench: "one_pass" | "split" | None (rule); env PAGEDATTN_DECODE_MODE


@triton.jit
def _tile_block_ids(bt_row_ptr, start, hi, offs_n, BS: tl.constexpr, ONE_BLOCK: tl.constexpr):
    """int64 block ids of the KV tile starting at ``start``: a scalar when the tile lies inside
    one block, else [BLOCK_N, 1]. Masked to keys < hi (seq_len, or the table's width for the
    first tile): never reads past the table row. Ids read from the slack past seq_len may hold
    anything; they only address K/V lanes that are masked off."""
    if ONE_BLOCK:
        blk = tl.load(bt_row_ptr + start // BS, mask=start < hi, other=0).to(tl.int64)
    else:
        j = start + offs_n
        blk = tl.load(bt_row_ptr + j // BS, mask=j < hi, other=0).to(tl.int64)[:, None]
    return blk


@triton.jit
def _merge(big_m, big_l, big_a, m_p, l_p, acc_p):
    """Fold one partition's state (m_p, l_p, acc_p) into the running (big_m, big_l, big_a).

    §1.4.3 as an online merge in partition order: with M' = max(M, m_p), a = exp2(M - M') and
    b = exp2(m_p - M'): L' = L a + l_p b, A' = A a + acc_p b. The FMAs are explicit, so every
    kernel that merges (the one-pass loop, the split combine) rounds the same way: outputs are
    bitwise equal across launch shapes. A neutral state (m_p = -inf, l_p = 0, acc_p = 0) is an
    exact identity (a = 1, b = 0), so partitions with no key may be skipped or merged alike.
    m_p, l_p: [M]; acc_p [M, D] (unnormalised).
    """
    m_new = tl.maximum(big_m, m_p)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # never -inf - -inf
    a = tl.exp2(big_m - m_safe)
    b = tl.exp2(m_p - m_safe)
    big_l = tl.fma(l_p, b, big_l * a)
    big_a = tl.fma(acc_p, b[:, None], big_a * a[:, None])
    return m_new, big_l, big_a


@triton.jit
def _park(ws_ml_ptr, ws_o_ptr, row, row_ok, m, l, acc, d, d_mask, D: tl.constexpr):
    """Store one partition's state (m_p, l_p, acc_p) at workspace rows ``row`` for the combine."""
    tl.store(ws_ml_ptr + 2 * row, m, mask=row_ok)
    tl.store(ws_ml_ptr + 2 * row + 1, l, mask=row_ok)
    tl.store(ws_o_ptr + row[:, None] * D + d[None, :], acc,
             mask=row_ok[:, None] & d_mask[None, :])


@triton.jit
def _attend(q, t_lo, t_hi, blk_n, h, pos, slope2, d, d_mask, bt_row_ptr, k_ptr, v_ptr, qk_scale,
            cap, window, ws_ml_ptr, ws_o_ptr, ws_row0, rows, row_ok, n_parts,
            stride_kb: tl.int64, stride_kt: tl.int64, stride_kh: tl.int64,
            stride_kdh: tl.int64, stride_kdl: tl.int64,
            stride_vb: tl.int64, stride_vt: tl.int64, stride_vh: tl.int64,
            stride_vdh: tl.int64, stride_vdl: tl.int64,
            K_X: tl.constexpr, K_SPLIT: tl.constexpr, K_LO_ONE: tl.constexpr,
            V_LO_ONE: tl.constexpr, BS: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, STEP: tl.constexpr,
            PART: tl.constexpr, ONE_BLOCK: tl.constexpr, ONE_PASS: tl.constexpr,
            PARK: tl.constexpr, R: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
            HAS_WINDOW: tl.constexpr, HAS_CAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
            IEEE: tl.constexpr):
    """Online softmax of the group rows over keys [t_lo, t_hi), one tile of STEP keys at a time.

    t_lo is a multiple of STEP, and STEP divides PART, so no tile straddles a partition. Split
    launch: [t_lo, t_hi) is one partition; returns its state (m, l, acc). One-pass launch: the
    whole sequence; at each partition's last tile its state is merged (:func:`_merge`) into the
    running (M, L, A) and restarted, so the K/V stream never leaves the pipelined loop; returns
    (M, L, A). PARK (split programs that own several partitions): when the sequence has more
    than one partition, each partition's state is stored to the workspace at its last tile and
    restarted, exactly what one program per partition stores. blk_n: the block ids of the first
    tile (:func:`_tile_block_ids`, loaded by the caller). q [BLOCK_M, BLOCK_D]; pos [BLOCK_M]
    absolute query positions; slope2 [BLOCK_M] ALiBi slopes (log2 domain). m, l: [BLOCK_M]
    (log2 domain); acc [BLOCK_M, BLOCK_D] float32.
    """
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    big_m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    big_l = tl.zeros((BLOCK_M,), tl.float32)
    big_a = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    # NOTE the block ids of tile t+1 are loaded in iteration t: when the K/V addresses of a tile
    # depend on an id loaded in the same iteration, the pipeliner drains every copy at the top
    # of the loop (async_wait num=0 in the sm_90 TTGIR) and each tile pays the full latency.
    for start in range(t_lo, t_hi, STEP):
        j = start + offs_n  # [BLOCK_N] key positions
        j_ok = j < t_hi
        if STEP < BLOCK_N:  # partitions shorter than a tile: the lanes past STEP are the next's
            j_ok = j_ok & (offs_n < STEP)
        tok = (j % BS).to(tl.int64)  # [BLOCK_N]
        kv_mask = j_ok[:, None] & d_mask[None, :]  # [BLOCK_N, BLOCK_D]
        k_off = kv_offset(blk_n, tok[:, None], h, d[None, :], stride_kb, stride_kt,
                          stride_kh, stride_kdh, stride_kdl, K_X, K_SPLIT, K_LO_ONE)
        k = tl.load(k_ptr + k_off, mask=kv_mask, other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_D]
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")  # [BLOCK_M, BLOCK_N]
        else:
            s = tl.dot(q, tl.trans(k))
        if HAS_CAP:
            s = soft_cap(s * qk_scale, cap) * 1.4426950408889634
        else:
            s = s * qk_scale  # qk_scale already holds log2(e)
        if HAS_ALIBI:
            s += alibi_bias(slope2[:, None], j[None, :], pos[:, None])
        ok = visible(j[None, :], pos[:, None], t_hi, window, CAUSAL, HAS_WINDOW)
        if STEP < BLOCK_N:
            ok = ok & j_ok[None, :]
        s = tl.where(ok, s, float("-inf"))
        m_i, l_i, alpha, p = online_softmax_step(m_i, l_i, s)
        v_off = kv_offset(blk_n, tok[:, None], h, d[None, :], stride_vb, stride_vt,
                          stride_vh, stride_vdh, stride_vdl, BLOCK_D, False, V_LO_ONE)
        v = tl.load(v_ptr + v_off, mask=kv_mask, other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_D]
        blk_n = _tile_block_ids(bt_row_ptr, start + STEP, t_hi, offs_n, BS, ONE_BLOCK)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v)
        if ONE_PASS or PARK:
            end = start + STEP
            last = ((end % PART) == 0) | (end >= t_hi)  # the partition's last tile
            if PARK:  # a single-partition sequence is finished by the caller
                last = last & (n_parts > 1)
            if last:
                if ONE_PASS:
                    big_m, big_l, big_a = _merge(big_m, big_l, big_a, m_i, l_i, acc)
                else:
                    _park(ws_ml_ptr, ws_o_ptr, ws_row0 + ((end - 1) // PART) * R + rows, row_ok,
                          m_i, l_i, acc, d, d_mask, D)
                m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
                l_i = tl.zeros((BLOCK_M,), tl.float32)
                acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    if ONE_PASS:
        return big_m, big_l, big_a
    else:
        return m_i, l_i, acc


@triton.jit
def _store_rows(out_ptr, lse_ptr, o, lse2, s, qi, qh, d, row_ok, lse_ok, d_mask, v_scale, Hq,
                LQ, stride_ob: tl.int64, stride_ot: tl.int64, stride_oh: tl.int64,
                RETURN_LSE: tl.constexpr):
    """out[s, qi, qh, :] = o * v_scale; lse[s, qi, qh] = natural log (contiguous [B, LQ, Hq])."""
    o_off = s * stride_ob + qi[:, None] * stride_ot + qh[:, None] * stride_oh + d[None, :]
    tl.store(out_ptr + o_off, (o * v_scale).to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_mask[None, :])
    if RETURN_LSE:
        l_off = (s * LQ + qi) * Hq + qh
        tl.store(lse_ptr + l_off, lse2 * 0.6931471805599453, mask=lse_ok)


@triton.jit
def _decode_kernel(
        q_ptr,  # [B, LQ, Hq, D] (strides; LQ dim stride 0 for 3-D q)
        k_ptr, v_ptr,  # paged caches, any layout (addressed through kv_offset)
        block_table_ptr,  # int32 [B, max_blocks]
        seq_lens_ptr,  # int32 [B]
        k_scale_ptr, v_scale_ptr,  # float32 [Hkv] (fp8 caches) or dummies
        slopes_ptr, sinks_ptr,  # float32 [Hq] or dummies
        out_ptr,  # [B, LQ, Hq, D]
        lse_ptr,  # float32 [B, LQ, Hq]
        ws_ml_ptr,  # float32 [B, Hkv, P, R, 2]: (m_p, l_p) per partition and row
        ws_o_ptr,  # float32 [B, Hkv, P, R, D]: acc_p (unnormalised)
        scale, cap, window, Hq, LQ, P, BT_W, PPP,
        stride_qb: tl.int64, stride_qt: tl.int64, stride_qh: tl.int64,
        stride_ob: tl.int64, stride_ot: tl.int64, stride_oh: tl.int64,
        stride_bt: tl.int64,
        stride_kb: tl.int64, stride_kt: tl.int64, stride_kh: tl.int64, stride_kdh: tl.int64,
        stride_kdl: tl.int64,
        stride_vb: tl.int64, stride_vt: tl.int64, stride_vh: tl.int64, stride_vdh: tl.int64,
        stride_vdl: tl.int64,
        G: tl.constexpr, R: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, PART: tl.constexpr,
        K_X: tl.constexpr, K_SPLIT: tl.constexpr, K_LO_ONE: tl.constexpr, V_LO_ONE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        ONE_BLOCK: tl.constexpr, ONE_PASS: tl.constexpr, MULTI: tl.constexpr,
        PDL: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_CAP: tl.constexpr,
        HAS_ALIBI: tl.constexpr, HAS_SINK: tl.constexpr, HAS_KV_SCALE: tl.constexpr,
        RETURN_LSE: tl.constexpr, IEEE: tl.constexpr):
    # grid: (Hkv, B, P) in split mode (axis 2 = partition), (Hkv, B, 1) in one-pass mode;
    # split with MULTI: (Hkv, B, cdiv(P, PPP)), program p owns partitions [p * PPP, p * PPP + PPP)
    if PDL:  # the combine launch may start now; it waits for this grid before reading
        gdc_launch_dependents()
    h = tl.program_id(0)
    s = tl.program_id(1).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + s).to(tl.int32)
    n_parts = tl.maximum((seq_len + PART - 1) // PART, 1)
    rows = tl.arange(0, BLOCK_M)  # row r = (query token r // G, head h*G + r % G)
    row_ok = rows < R
    qi = rows // G
    qh = h * G + rows % G
    d = tl.arange(0, BLOCK_D)
    d_mask = d < D
    q_off = s * stride_qb + qi[:, None] * stride_qt + qh[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & d_mask[None, :], other=0.0)
    pos = seq_len - LQ + qi  # [BLOCK_M] absolute position of each row's query
    lo = 0
    if HAS_WINDOW:  # first key any row can see; earlier tiles are skipped
        lo = tl.maximum(seq_len - LQ + 1 - window, 0)
    qk_scale = scale  # k_scale folds in here; log2(e) too unless the soft-cap needs natural logits
    v_scale = 1.0
    if HAS_KV_SCALE:  # per KV head = this program's head: scalars
        qk_scale = qk_scale * tl.load(k_scale_ptr + h)
        v_scale = tl.load(v_scale_ptr + h)
    if not HAS_CAP:
        qk_scale = qk_scale * 1.4426950408889634
    slope2 = tl.zeros((BLOCK_M,), tl.float32)
    if HAS_ALIBI:
        slope2 = tl.load(slopes_ptr + qh, mask=row_ok, other=0.0) * 1.4426950408889634
    sink2 = tl.zeros((BLOCK_M,), tl.float32)
    if HAS_SINK:
        sink2 = tl.load(sinks_ptr + qh, mask=row_ok, other=0.0) * 1.4426950408889634
    bt_row_ptr = block_table_ptr + s * stride_bt
    ws_row0 = ((s * tl.num_programs(0) + h) * P) * R  # int64: (s, h, partition 0, row 0)
    STEP: tl.constexpr = BLOCK_N if BLOCK_N <= PART else PART  # keys per tile
    first = lo // STEP * STEP  # the first tile holding a visible key
    if ONE_PASS:
        p = 0
        t_lo = first
        t_hi = seq_len
    elif MULTI:
        p = tl.program_id(2) * PPP  # this program's first partition
        t_lo = tl.maximum(p * PART, first)
        t_hi = tl.minimum((p + PPP) * PART, seq_len)
        if HAS_WINDOW:  # partitions wholly before the window: neutral states
            if n_parts > 1:
                for pe in range(p, tl.minimum(first // PART, p + PPP)):
                    _park(ws_ml_ptr, ws_o_ptr, ws_row0 + pe * R + rows, row_ok,
                          tl.full((BLOCK_M,), float("-inf"), tl.float32),
                          tl.zeros((BLOCK_M,), tl.float32),
                          tl.zeros((BLOCK_M, BLOCK_D), tl.float32), d, d_mask, D)
    else:
        p = tl.program_id(2)
        t_lo = tl.maximum(p * PART, first)
        t_hi = tl.minimum(p * PART + PART, seq_len)
    # the first tile's block ids, masked by the table's width only: this load does not wait for
    # seq_len (K/V lanes past seq_len are masked off by _attend), one round trip less per program
    blk0 = _tile_block_ids(bt_row_ptr, t_lo, BT_W * BS, tl.arange(0, BLOCK_N), BS, ONE_BLOCK)
    if p < n_parts:  # split: programs past the sequence's last partition have nothing to do
        m, l, acc = _attend(
            q, t_lo, t_hi, blk0, h, pos, slope2, d, d_mask, bt_row_ptr, k_ptr, v_ptr, qk_scale,
            cap, window, ws_ml_ptr, ws_o_ptr, ws_row0, rows, row_ok, n_parts, stride_kb, stride_kt,
            stride_kh, stride_kdh, stride_kdl, stride_vb, stride_vt, stride_vh, stride_vdh,
            stride_vdl, K_X, K_SPLIT, K_LO_ONE, V_LO_ONE, BS, BLOCK_M, BLOCK_N, BLOCK_D, STEP,
            PART, ONE_BLOCK, ONE_PASS, MULTI, R, D, CAUSAL, HAS_WINDOW, HAS_CAP, HAS_ALIBI, IEEE)
        if ONE_PASS or n_parts == 1:
            if not ONE_PASS:  # the state one-pass would hold: one merge into the empty state
                m, l, acc = _merge(tl.full((BLOCK_M,), float("-inf"), tl.float32),
                                   tl.zeros((BLOCK_M,), tl.float32),
                                   tl.zeros((BLOCK_M, BLOCK_D), tl.float32), m, l, acc)
            o, lse2 = finalize_state(m, l, acc, sink2, HAS_SINK)
            _store_rows(out_ptr, lse_ptr, o, lse2, s, qi, qh, d, row_ok, row_ok, d_mask, v_scale,
                        Hq, LQ, stride_ob, stride_ot, stride_oh, RETURN_LSE)
        elif not MULTI:  # park (m_p, l_p, acc_p) for the combine (MULTI parked in the loop)
            _park(ws_ml_ptr, ws_o_ptr, ws_row0 + p * R + rows, row_ok, m, l, acc, d, d_mask, D)


@triton.jit
def _max2(a, b):
    return tl.maximum(a, b)


@triton.jit
def _combine_kernel(seq_lens_ptr,  # int32 [B]
                    v_scale_ptr, sinks_ptr,  # float32 [Hkv], [Hq] or dummies
                    out_ptr, lse_ptr,  # [B, LQ, Hq, D], float32 [B, LQ, Hq]
                    ws_ml_ptr, ws_o_ptr,  # float32 [B, Hkv, P, R, 2], [B, Hkv, P, R, D]
                    Hq, LQ, P, PART,
                    stride_ob: tl.int64, stride_ot: tl.int64, stride_oh: tl.int64,
                    G: tl.constexpr, R: tl.constexpr, D: tl.constexpr,
                    BLOCK_D: tl.constexpr, UNROLL: tl.constexpr, DSPLIT: tl.constexpr,
                    C_STAGES: tl.constexpr, PDL: tl.constexpr,
                    HAS_SINK: tl.constexpr, HAS_KV_SCALE: tl.constexpr,
                    RETURN_LSE: tl.constexpr):
    """Merge the partition states of one output row in partition order (:func:`_merge`, the
    one-pass loop's arithmetic) and write out/lse.

    grid: (Hkv, B, R * DSPLIT): program (r, dc) merges columns [dc, dc + 1) * BLOCK_D / DSPLIT
    of row r (the merge is elementwise in d; every program recomputes the row's scalars, the
    same numbers); sequences with a single partition were finished by _decode_kernel.
    UNROLL partitions per group: their states in one load (with one warp a thread holds all
    UNROLL rows of its columns, so pulling a row out takes no shuffles), the group's running
    maxima by a cumulative max and every exp2 of the merges at once; only L' = L a + l b and
    A' = A a + acc b stay a chain (two FMA-deep per partition). Same values as :func:`_merge`
    step by step: max is exact in any order, the exp2 arguments are the same numbers, the FMAs
    are explicit. Cost on the H200: (1, 32768) 32/8, 64 partitions: 8.5 us with the scalars
    spread over lanes (session 4), 3.2 us with them in-thread and (32, 1, 4, 1) (session 5, see
    SPLIT_COMBINE). The group loop is not pipelined (C_STAGES 1; more stages measured slower).
    PDL (NVIDIA sm_90+): launched as a programmatic dependent of the decode kernel, the
    program starts while the decode grid drains and waits (griddepcontrol.wait) only before
    its first workspace read; seq_lens is an input, safe to read before.
    """
    h = tl.program_id(0)
    s = tl.program_id(1).to(tl.int64)
    r = tl.program_id(2) // DSPLIT
    dc = tl.program_id(2) % DSPLIT
    seq_len = tl.load(seq_lens_ptr + s).to(tl.int32)
    n_parts = tl.maximum((seq_len + PART - 1) // PART, 1)
    if PDL:
        gdc_wait()  # every write of the decode grid is visible past this point
    if n_parts > 1:
        BLOCK_DC: tl.constexpr = BLOCK_D // DSPLIT
        d = dc * BLOCK_DC + tl.arange(0, BLOCK_DC)
        d_mask = d < D
        v_scale = 1.0
        if HAS_KV_SCALE:
            v_scale = tl.load(v_scale_ptr + h)
        row0 = ((s * tl.num_programs(0) + h) * P) * R + r
        # every per-partition scalar is broadcast over the group's [UNROLL, BLOCK_DC] tile: with
        # one warp a thread then holds all UNROLL rows of its columns, so the running maxima (a
        # scan along axis 0) and pulling row u out (a sum with zeros along axis 0) stay inside
        # the thread; [UNROLL] vectors would be spread over lanes and cost warp shuffles per
        # partition (session 5: 3 shuffle reductions per partition in the SASS)
        big_m = tl.full((1, BLOCK_DC), float("-inf"), tl.float32)
        big_l = tl.zeros((1, BLOCK_DC), tl.float32)
        big_a = tl.zeros((1, BLOCK_DC), tl.float32)
        u_idx = tl.arange(0, UNROLL)
        for p0 in tl.range(0, n_parts, UNROLL, num_stages=C_STAGES):
            # the scalars of _merge for the whole group at once: running maxima by a cumulative
            # max (exact), then a_u = exp2(M_before - M_after), b_u = exp2(m_u - M_after)
            pp = p0 + u_idx
            ok = pp < n_parts
            row = row0 + pp * R  # [UNROLL] int64
            # scalar loads (declared contiguity 1): the tile then takes the plain layout of the
            # broadcast scalars below, not a vectorised one that would need a conversion each
            # partition
            o_off = tl.multiple_of(row[:, None] * D + d[None, :], [1, 1])
            acc_g = tl.load(ws_o_ptr + o_off, mask=ok[:, None] & d_mask[None, :], other=0.0,
                            cache_modifier=".cg")  # [UNROLL, BLOCK_DC]: one round trip a group
            m_g = tl.load(ws_ml_ptr + 2 * row, mask=ok, other=float("-inf"), cache_modifier=".cg")
            l_g = tl.load(ws_ml_ptr + 2 * row + 1, mask=ok, other=0.0, cache_modifier=".cg")
            m_sh = tl.load(ws_ml_ptr + 2 * (row - R), mask=(u_idx > 0) & (pp - 1 < n_parts),
                           other=float("-inf"), cache_modifier=".cg")  # m_{u-1}
            m_g = tl.broadcast_to(m_g[:, None], (UNROLL, BLOCK_DC))
            l_g = tl.broadcast_to(l_g[:, None], (UNROLL, BLOCK_DC))
            m_sh = tl.broadcast_to(m_sh[:, None], (UNROLL, BLOCK_DC))
            m_after = tl.maximum(tl.associative_scan(m_g, 0, _max2), big_m)
            m_before = tl.maximum(tl.associative_scan(m_sh, 0, _max2), big_m)
            m_safe = tl.where(m_after == float("-inf"), 0.0, m_after)
            a_g = tl.exp2(m_before - m_safe)
            b_g = tl.exp2(m_g - m_safe)
            for u in tl.static_range(UNROLL):  # the L / A chain, in partition order
                sel = (u_idx == u)[:, None]  # pulling one row out by a sum with zeros is exact
                a_u = tl.sum(tl.where(sel, a_g, 0.0), axis=0, keep_dims=True)  # [1, BLOCK_DC]
                b_u = tl.sum(tl.where(sel, b_g, 0.0), axis=0, keep_dims=True)
                l_u = tl.sum(tl.where(sel, l_g, 0.0), axis=0, keep_dims=True)
                acc_u = tl.sum(tl.where(sel, acc_g, 0.0), axis=0, keep_dims=True)
                big_l = tl.fma(l_u, b_u, big_l * a_u)
                big_a = tl.fma(acc_u, b_u, big_a * a_u)
            big_m = tl.maximum(big_m, tl.max(m_g, axis=0, keep_dims=True))
        # every column holds the same scalars: one per row (an exact max)
        big_m = tl.max(big_m, axis=1)
        big_l = tl.max(big_l, axis=1)
        one = tl.arange(0, 1)
        qi = one * 0 + r // G
        qh = one * 0 + h * G + r % G
        sink2 = tl.zeros((1,), tl.float32)
        if HAS_SINK:
            sink2 = tl.load(sinks_ptr + qh) * 1.4426950408889634
        o, lse2 = finalize_state(big_m, big_l, big_a, sink2, HAS_SINK)
        _store_rows(out_ptr, lse_ptr, o, lse2, s, qi, qh, d, one == 0, (one + dc) == 0,
                    d_mask, v_scale, Hq, LQ, stride_ob, stride_ot, stride_oh, RETURN_LSE)


# ----------------------------------------------------------------------------------------------
# launcher
# ----------------------------------------------------------------------------------------------

# (BLOCK_N, num_warps, num_stages) keyed by (padded head dim, rows bucket). One config serves
# both launch shapes (batch invariance needs the same tiles). NVIDIA, rows <= 16: KV tiles of 32
# tokens, 4 warps, 3 stages. The H200 sweeps of session 3 (bench/results/2026-11-30-h200-s3/
# decode_config_sweep.log) weighed it against (16, 1, 3): 16-token tiles take 24 KB of shared
# memory (9 programs per SM, not 4), so (8, 8192) 32/8's 1024 split programs run in one wave:
# 69 vs 84 us; but they lose 1.6x on the latency-bound (1, 4096) (29 vs 18 us) and 3-4 % at
# (1, 32768) and (64, 4096). AMD/DCU: fewer stages.
_CONFIGS = {
    "nvidia": {(128, 16): (32, 4, 3), (128, 64): (64, 4, 3), (128, 256): (32, 8, 2),
               (256, 16): (32, 4, 2), (256, 64): (32, 4, 2), (256, 256): (16, 8, 2)},
    "amd": {(128, 16): (64, 4, 1), (128, 64): (64, 4, 1), (128, 256): (32, 8, 1),
            (256, 16): (32, 4, 1), (256, 64): (32, 4, 1), (256, 256): (16, 8, 1)},
}
_TORCH_TO_FAMILY = {True: "amd", False: "nvidia"}
MAX_ROWS = 256  # G * Lq rows per program
# The split launch's combine kernel: (states per load, warps, column blocks per row, pipeline
# stages of the group loop). One warp with >= 32 columns per program keeps a group's rows and
# every per-partition scalar in each thread's registers: the running maxima and pulling row u out
# cost no shuffles and no layout conversions (session 5: the old form, scalars spread over lanes,
# did 3 warp-shuffle reductions per partition: ~0.09 us per partition). H200, session 5
# (bench/results/2026-11-30-h200-s5/combine_*.log), (1, 32768) 32/8 from CUDA graphs: 44.1 us
# with (8, 1, 1, 1), 40.2 with (8, 1, 4, 1), 40.6 with (16, 1, 4, 1), 38.9 with (32, 1, 4, 1)
# (combine kernel 8.5 -> 3.2 us); (8, 8192) and (1, 4096) within 1 %. _combine_config caps
# UNROLL at the batch's largest partition count: with 32 always, B32 L2048 (4 partitions) lost
# 5-8 % (ab_decode_cuda_graph.md). Pipelining the group loop measured slower (session 4); launching
# the combine as a programmatic dependent (_pdl) saved 0.4-0.7 us.
# PAGEDATTN_DECODE_COMBINE="UNROLL,WARPS[,DSPLIT[,STAGES]]" overrides (A/B runs); outputs are the
# same bits for every value.
SPLIT_COMBINE = (32, 1, 4, 1)


def _combine_config(block_d, n_part_max):
    env = os.environ.get("PAGEDATTN_DECODE_COMBINE")
    cfg = tuple(int(x) for x in env.split(",")) if env else SPLIT_COMBINE
    unroll, warps, dsplit, stages = (cfg + SPLIT_COMBINE[len(cfg):])[:4]
    # no larger than the longest sequence's partition count: the group loop is unrolled, so
    # neutral rows past it cost time (same bits for any group size); >= 32 columns per program:
    # one warp then holds whole columns (no shuffles)
    return (min(unroll, max(2, _next_pow2(n_part_max))), warps,
            max(1, min(dsplit, block_d // 32)), max(1, stages))


def _pdl(device):
    """Programmatic dependent launch of the combine (NVIDIA sm_90+; PAGEDATTN_DECODE_PDL=0 off)."""
    if device.type != "cuda" or getattr(torch.version, "hip", None) or gdc_wait is None:
        return False
    if os.environ.get("PAGEDATTN_DECODE_PDL", "1") == "0":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def _next_pow2(n):
    return 1 << max(0, (int(n) - 1).bit_length())


def _config(block_d, rows, device):
    env = os.environ.get("PAGEDATTN_DECODE_CONFIG")  # "BLOCK_N,num_warps,num_stages" (tuning)
    if env:
        return tuple(int(x) for x in env.split(","))
    fam = _TORCH_TO_FAMILY[bool(getattr(torch.version, "hip", None))]
    bucket = 16 if rows <= 16 else 64 if rows <= 64 else 256
    return _CONFIGS[fam][(128 if block_d <= 128 else 256, bucket)]


def _num_sms(device):
    if device.type != "cuda":
        return 1  # interpreter: any rule is fine; tests force both modes
    return torch.cuda.get_device_properties(device).multi_processor_count


def default_partition_size(group):
    """PARTITION_SIZE rule (§5.2.5): 512, 256 when the GQA group is larger than 15."""
    return 256 if group > 15 else 512


def unsupported(q=None, k_cache=None, geom=None, **_):
    """Reasons this kernel cannot serve the call ([] = it can)."""
    why = []
    if q is not None and geom is not None:
        lq = 1 if q.dim() == 3 else q.shape[1]
        rows = (q.shape[-2] // geom.num_kv_heads) * lq
        if rows > MAX_ROWS:
            why.append(f"group*q_len = {rows} rows exceeds {MAX_ROWS}")
        if geom.head_dim > 256:
            why.append(f"head_dim {geom.head_dim} > 256")
    return why


def _parts_per_program(programs, n_part_max, block_m, block_n, block_d, warps, stages, kv_bytes,
                       device):
    """Partitions per split program (PAGEDATTN_DECODE_PPP: an integer, or ``auto``, the default).

    ``auto``: as few as keep the split grid within one wave of resident programs (shared memory
    of the K/V stages, warps per SM); the outputs are the same bits for any value, since each
    partition's state and the combine's order do not change. H200 A/B of 2026-11-30
    (bench/results/2026-11-30-h200-s4/ppp_sweep.log): (8, 8192) 32/8 84.9 -> 72.9 us, (1, 32768)
    and (1, 4096) unchanged (one wave already).
    """
    raw = os.environ.get("PAGEDATTN_DECODE_PPP", "auto")
    if raw != "auto":
        try:
            ppp = int(raw)
        except ValueError:
            ppp = 0
        if ppp < 1:
            raise ValueError(f"PAGEDATTN_DECODE_PPP={raw!r}: expected a positive integer or auto")
        return min(ppp, n_part_max)
    if device.type != "cuda":
        return 1
    props = torch.cuda.get_device_properties(device)
    smem = stages * block_n * block_d * 2 * kv_bytes + block_m * block_d * 2
    limit = getattr(props, "shared_memory_per_multiprocessor", 0) or 228 * 1024
    per_sm = max(1, min(limit // max(smem, 1), 64 // warps))
    slots = props.multi_processor_count * per_sm
    return min(n_part_max, max(1, -(-programs // slots)))


def _mode(num_seqs, num_kv_heads, device):
    forced = FORCE_MODE or os.environ.get("PAGEDATTN_DECODE_MODE") or None
    if forced:
        if forced not in ("one_pass", "split"):
            raise ValueError(f"PAGEDATTN_DECODE_MODE: expected one_pass or split, got {forced!r}")
        return forced
    # one pass only when the (head, sequence) programs alone make many waves (dispatch.core.FILL,
    # measured); both launch shapes give bitwise-equal outputs
    return "one_pass" if num_seqs * num_kv_heads >= _dispatch.FILL * _num_sms(device) else "split"


def run(call):
    """Launch the decode kernel(s) for a validated DecodeCall; write call.out.

    Returns float32 lse shaped ``q.shape[:-1]`` (natural log) when call.return_lse, else None.
    """
    q, out, g, o = call.q, call.out, call.geom, call.opts
    q4 = q if q.dim() == 4 else q.unsqueeze(1)  # views: strides kept
    out4 = out if out.dim() == 4 else out.unsqueeze(1)
    nb, lq, hq, d = q4.shape
    hkv, bs = g.num_kv_heads, g.block_size
    group = hq // hkv
    rows = group * lq
    dev = q.device
    part = call.partition_size or default_partition_size(group)
    block_d = max(16, _next_pow2(d))
    block_m = max(16, _next_pow2(rows))
    block_n, num_warps, num_stages = _config(block_d, rows, dev)
    if dev.type != "cuda":
        block_n = 16  # interpreter: small tiles so tiny test sequences still span several
    block_n = min(block_n, max(16, part))
    one_block = bs % block_n == 0 and part % block_n == 0
    n_part_max = max(1, triton.cdiv(call.block_table.shape[1] * bs, part))  # host bound, no sync
    mode = _mode(nb, hkv, dev)
    ks, vs = L.k_strides(call.k_cache, call.layout), L.v_strides(call.v_cache, call.layout)
    f32 = dict(dtype=torch.float32, device=dev)
    dummy = torch.empty(1, **f32)  # the pointer of every disabled input/output: never touched
    lse = torch.empty((nb, lq, hq), **f32) if call.return_lse else dummy
    if n_part_max > 1:
        ws_ml = torch.empty((nb, hkv, n_part_max, rows, 2), **f32)
        ws_o = torch.empty((nb, hkv, n_part_max, rows, d), **f32)
    else:
        ws_ml = ws_o = dummy  # every sequence fits one partition
    has_kv_scale = call.k_cache.dtype in FP8_DTYPES and o.k_scale is not None
    common = dict(G=group, R=rows, D=d, BLOCK_D=block_d,
                  HAS_SINK=o.sinks is not None, HAS_KV_SCALE=has_kv_scale,
                  RETURN_LSE=call.return_lse)
    # grid: (KV head, sequence, partition); one-pass folds the partition loop into the program
    ppp = 1
    if mode == "split" and n_part_max > 1:
        ppp = _parts_per_program(hkv * nb * n_part_max, n_part_max, block_m, block_n, block_d,
                                 num_warps, num_stages, call.k_cache.element_size(), dev)
    grid = (hkv, nb, 1 if mode == "one_pass" else triton.cdiv(n_part_max, ppp))
    pdl = mode == "split" and n_part_max > 1 and _pdl(dev)
    _decode_kernel[grid](
        q_ptr=q4, k_ptr=call.k_cache, v_ptr=call.v_cache, block_table_ptr=call.block_table,
        seq_lens_ptr=call.seq_lens,
        k_scale_ptr=o.k_scale if has_kv_scale else dummy,
        v_scale_ptr=o.v_scale if has_kv_scale else dummy,
        slopes_ptr=o.alibi_slopes if o.alibi_slopes is not None else dummy,
        sinks_ptr=o.sinks if o.sinks is not None else dummy,
        out_ptr=out4, lse_ptr=lse, ws_ml_ptr=ws_ml, ws_o_ptr=ws_o,
        scale=float(o.scale), cap=float(o.logit_cap or 1.0),
        window=int(o.sliding_window or 0), Hq=hq, LQ=lq, P=n_part_max,
        BT_W=call.block_table.shape[1], PART=part,
        stride_qb=q4.stride(0), stride_qt=q4.stride(1), stride_qh=q4.stride(2),
        stride_ob=out4.stride(0), stride_ot=out4.stride(1), stride_oh=out4.stride(2),
        stride_bt=call.block_table.stride(0),
        stride_kb=ks.block, stride_kt=ks.token, stride_kh=ks.head, stride_kdh=ks.dim_hi,
        stride_kdl=ks.dim_lo,
        stride_vb=vs.block, stride_vt=vs.token, stride_vh=vs.head, stride_vdh=vs.dim_hi,
        stride_vdl=vs.dim_lo,
        BS=bs, K_X=ks.x, K_SPLIT=ks.x < d, K_LO_ONE=ks.dim_lo == 1, V_LO_ONE=vs.dim_lo == 1,
        BLOCK_N=block_n, ONE_BLOCK=one_block, ONE_PASS=mode == "one_pass", MULTI=ppp > 1,
        PDL=pdl,
        PPP=ppp, CAUSAL=lq > 1,
        HAS_WINDOW=o.sliding_window is not None, HAS_CAP=o.logit_cap is not None,
        HAS_ALIBI=o.alibi_slopes is not None, IEEE=q.dtype == torch.float32,
        BLOCK_M=block_m, num_warps=num_warps, num_stages=num_stages,
        **common)
    if mode == "split" and n_part_max > 1:
        c_unroll, c_warps, c_dsplit, c_stages = _combine_config(block_d, n_part_max)
        # grid: (KV head, sequence, row x column block); single-partition sequences exit at once
        _combine_kernel[(hkv, nb, rows * c_dsplit)](
            seq_lens_ptr=call.seq_lens, v_scale_ptr=o.v_scale if has_kv_scale else dummy,
            sinks_ptr=o.sinks if o.sinks is not None else dummy, out_ptr=out4, lse_ptr=lse,
            ws_ml_ptr=ws_ml, ws_o_ptr=ws_o, Hq=hq, LQ=lq, P=n_part_max, PART=part,
            stride_ob=out4.stride(0), stride_ot=out4.stride(1), stride_oh=out4.stride(2),
            UNROLL=c_unroll, DSPLIT=c_dsplit, C_STAGES=c_stages, PDL=pdl, num_warps=c_warps,
            launch_pdl=pdl, **common)
    return lse.view(q.shape[:-1]) if call.return_lse else None
