"""The split-KV combine of the Triton decode launch (``decode.py``): the parked partition states
of each output row merged in partition order with the one-pass loop's arithmetic."""
import triton
import triton.language as tl

from pagedattn.triton_kernels._common import finalize_state
from pagedattn.triton_kernels._decode_kernels import _store_rows, gdc_wait
from pagedattn.triton_kernels._decode_state import batch_lens, plan, runs_whole, valid_len


@triton.jit
def _max2(a, b):
    return tl.maximum(a, b)


@triton.jit
def _combine_kernel(seq_lens_ptr,  # int32 [B]
                    v_scale_ptr, sinks_ptr,  # float32 [Hkv], [Hq] or dummies
                    out_ptr, lse_ptr,  # [B, LQ, Hq, D], float32 [B, LQ, Hq]
                    # float32 [B, Hkv * HSPLIT, P, R, 2], [B, Hkv * HSPLIT, P, R, D]
                    ws_ml_ptr, ws_o_ptr,
                    Hq, LQ, P, PART, NB, FILL_N, SLOTS, FINE, BT_W, BS,
                    stride_ob: tl.int64, stride_ot: tl.int64, stride_oh: tl.int64,
                    G: tl.constexpr, R: tl.constexpr, D: tl.constexpr,
                    BLOCK_D: tl.constexpr, UNROLL: tl.constexpr, DSPLIT: tl.constexpr,
                    C_STAGES: tl.constexpr, PDL: tl.constexpr,
                    HAS_SINK: tl.constexpr, HAS_KV_SCALE: tl.constexpr,
                    RETURN_LSE: tl.constexpr, BAL: tl.constexpr, NB_BLOCK: tl.constexpr,
                    GUARD: tl.constexpr, HSPLIT: tl.constexpr):
    """Merge the partition states of one output row in partition order (``_decode_state.merge``,
    the one-pass loop's arithmetic) and write out/lse.

    D here is V's head dim (the output's). Axis 0 is the decode kernel's (KV head, row chunk)
    with HSPLIT chunks of R rows per KV head; row r of chunk c is group row c * R + r.
    grid: (Hkv, B, R * DSPLIT): program (r, dc) merges columns [dc, dc + 1) * BLOCK_D / DSPLIT
    of row r (the merge is elementwise in d; every program recomputes the row's scalars, the
    same numbers); sequences with a single partition were finished by _decode_kernel, and
    under the balanced launch (BAL) those one program owned whole (``plan``, same inputs).
    UNROLL partitions per group: their states in one load (with one warp a thread holds all
    UNROLL rows of its columns, so pulling a row out takes no shuffles), the group's running
    maxima by a cumulative max and every exp2 of the merges at once; only L' = L a + l b and
    A' = A a + acc b stay a chain (two FMA-deep per partition). Same values as ``merge``
    step by step: max is exact in any order, the exp2 arguments are the same numbers, the FMAs
    are explicit. Cost on the H200: (1, 32768) 32/8, 64 partitions: 8.5 us with the scalars
    spread over lanes, 3.2 us with them in-thread and (32, 1, 4, 1) (see SPLIT_COMBINE). The
    group loop is not pipelined (C_STAGES 1; more stages measured slower).
    PDL (NVIDIA sm_90+): launched as a programmatic dependent of the decode kernel, the
    program starts while the decode grid drains and waits (griddepcontrol.wait) only before
    its first workspace read; seq_lens is an input, safe to read before.
    """
    hv = tl.program_id(0)
    h = hv // HSPLIT  # the KV head
    s = tl.program_id(1).to(tl.int64)
    r = tl.program_id(2) // DSPLIT
    dc = tl.program_id(2) % DSPLIT
    seq_len = tl.load(seq_lens_ptr + s).to(tl.int32)
    CAP = BT_W * BS
    if BAL:
        j0 = tl.arange(0, NB_BLOCK)
        lens0 = batch_lens(seq_lens_ptr, NB, j0, CAP, LQ)
    if GUARD:  # an invalid length runs as 0: its one program wrote the NaN rows
        seq_len = valid_len(seq_len, CAP, LQ)[0]
    n_parts = tl.maximum((seq_len + PART - 1) // PART, 1)
    if BAL:  # reads inputs only: before the wait
        ppp, fill, _ = plan(lens0, j0, seq_lens_ptr, NB, tl.num_programs(0), FILL_N, SLOTS,
                            FINE, PART, CAP, LQ, NB_BLOCK)
        n_parts = tl.where(runs_whole(n_parts, ppp, fill), 1, n_parts)
    if PDL:
        if BAL:
            # a program with nothing to merge reads no workspace and exits at once (a one-pass
            # batch launches this grid for nothing); program 0 still waits, so that this grid
            # ends after the decode grid (the stream's next kernel relies on it)
            first = (hv == 0) & (s == 0) & (tl.program_id(2) == 0)
            if (n_parts > 1) | first:
                gdc_wait()
        else:
            gdc_wait()  # every write of the decode grid is visible past this point
    gr = (hv % HSPLIT) * R + r  # the group row
    if (n_parts > 1) & (gr < G * LQ):
        BLOCK_DC: tl.constexpr = BLOCK_D // DSPLIT
        d = dc * BLOCK_DC + tl.arange(0, BLOCK_DC)
        d_mask = d < D
        v_scale = 1.0
        if HAS_KV_SCALE:
            v_scale = tl.load(v_scale_ptr + h)
        row0 = ((s * tl.num_programs(0) + hv) * P) * R + r
        # every per-partition scalar is broadcast over the group's [UNROLL, BLOCK_DC] tile: with
        # one warp a thread then holds all UNROLL rows of its columns, so the running maxima (a
        # scan along axis 0) and pulling row u out (a sum with zeros along axis 0) stay inside
        # the thread; [UNROLL] vectors would be spread over lanes and cost warp shuffles per
        # partition (3 shuffle reductions per partition in the SASS)
        big_m = tl.full((1, BLOCK_DC), float("-inf"), tl.float32)
        big_l = tl.zeros((1, BLOCK_DC), tl.float32)
        big_a = tl.zeros((1, BLOCK_DC), tl.float32)
        u_idx = tl.arange(0, UNROLL)
        for p0 in tl.range(0, n_parts, UNROLL, num_stages=C_STAGES):
            # the scalars of merge for the whole group at once: running maxima by a cumulative
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
        qi = one * 0 + gr // G
        qh = one * 0 + h * G + gr % G
        sink = tl.zeros((1,), tl.float32)
        if HAS_SINK:
            sink = tl.load(sinks_ptr + qh)
        o, lse2 = finalize_state(big_m, big_l, big_a, sink, HAS_SINK)
        # a partition parked poisoned (l NaN: the guards) makes the row NaN through the merge
        _store_rows(out_ptr, lse_ptr, o, lse2, s, qi, qh, d, one == 0,
                    (one + dc) == 0, d_mask, v_scale, Hq, LQ, stride_ob, stride_ot, stride_oh,
                    RETURN_LSE)
