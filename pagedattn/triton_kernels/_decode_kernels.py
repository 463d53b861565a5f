"""The Triton paged-decode kernels: the tile loop and the decode kernel (both launch shapes).
The split-KV combine: ``_decode_combine.py``. The launcher and the launch-shape rules:
``decode.py`` (its docstring holds the design: grid, partitions, merge order, batch
invariance); the tile configs: ``_decode_configs.py``."""
import triton
import triton.language as tl

from pagedattn.triton_kernels._common import (alibi_bias, finalize_state, first_tile, kv_offset,
                                              online_softmax_step, soft_cap, visible)
from pagedattn.triton_kernels._decode_state import (balanced_share, batch_lens, merge as _merge,
                                                    park as _park, park_neutral, valid_len)

SCAN = tl.constexpr(128)  # table entries a guarded program judges per load (_bad_ids)

try:  # grid dependency control (programmatic dependent launch), NVIDIA sm_90+
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # older triton: PDL stays off (decode._pdl), the names are never traced
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def _tile_block_ids(bt_row_ptr, start, hi, offs_n, BS: tl.constexpr, ONE_BLOCK: tl.constexpr):
    """int64 block ids of the KV tile starting at ``start``: a scalar when the tile lies inside
    one block, else [BLOCK_N, 1]. Masked to keys < hi (seq_len, or the table's width for the
    first tile): never reads past the table row. Ids read from the slack past seq_len may hold
    anything; they only address K/V lanes that are masked off. A guarded program checks every
    id it will use before its tile loop (:func:`_bad_ids`) and runs no tile when one is bad."""
    if ONE_BLOCK:
        blk = tl.load(bt_row_ptr + start // BS, mask=start < hi, other=0).to(tl.int64)
    else:
        j = start + offs_n
        blk = tl.load(bt_row_ptr + j // BS, mask=j < hi, other=0).to(tl.int64)[:, None]
    return blk


@triton.jit
def _ids_bad(bt_row_ptr, pg, pg_hi, nblk):
    """int1 per table entry pg (page indices; entries at or past pg_hi are not read): the id is
    outside [0, nblk)."""
    ids = tl.load(bt_row_ptr + pg, mask=pg < pg_hi, other=0).to(tl.int64)
    return ((ids < 0) | (ids >= nblk)) & (pg < pg_hi)


@triton.jit
def _bad_ids(bt_row_ptr, pg_lo, pg_hi, nblk, SCAN: tl.constexpr):
    """Whether any table entry in [pg_lo, pg_hi) (the pages of the keys a program reads) holds an
    id outside [0, nblk), SCAN entries a load (scalar int1). Run before the tile loop, beside
    the first tile's id load: a program with a bad id runs no tile, so no K/V address is ever
    formed from one, and the loop carries no check (the fp8 loop holds 255 registers: any
    per-tile flag spills there)."""
    bad = pg_lo < 0
    for pg0 in range(pg_lo, pg_hi, SCAN):
        pg = pg0 + tl.arange(0, SCAN)
        bad = bad | (tl.max(_ids_bad(bt_row_ptr, pg, pg_hi, nblk).to(tl.int32)) > 0)
    return bad


@triton.jit(noinline=True)
def _count_guarded(err_ptr, bt_row_ptr, bad_len, first, t_lo, nblk, n_rows, BS: tl.constexpr):
    """Add a guarded program's n_rows to the error count when no program of its sequence with
    earlier keys was guarded too (an invalid length: the first share; a bad block id: none of
    the pages before this program's keys is bad), so each guarded row counts once. Not inlined:
    the scan's registers stay out of the tile loop's allocation (inlined, the fp8 balanced
    loop spills 112 bytes under triton 3.6)."""
    later = _bad_ids(bt_row_ptr, first // BS, (t_lo + BS - 1) // BS, nblk, SCAN)
    if tl.where(bad_len, t_lo <= first, ~later):
        tl.atomic_add(err_ptr, n_rows)


@triton.jit
def _fp16_q(q, q2, HAS_TAIL: tl.constexpr):
    """(q * 2^-e, q2 * 2^-e in fp16, 2^e) for a bf16 q tile (and its tail tile q2 when
    HAS_TAIL; else q2 is passed through) over an fp8 cache (F16_DOT, decode._f16_dot).

    Every e4m3 and e5m2 value is exact in fp16, and fp8 -> fp16 is one cvt per pair on sm_89+,
    where fp8 -> bf16 takes several instructions per element: a decode loop that converts every
    K/V element is instruction-bound (H200: fp8 caches ran at 0.33-0.47 of the read ceiling).
    q is scaled by an exact power of 2 so that max |q| < 2^15 fits fp16 (e = 0 for any sane q),
    and 2^e joins the logit scale; fp16 keeps 3 more mantissa bits than bf16. P in [0, 1] also
    runs in fp16. One exponent for both tiles, so the two dots share one logit scale.
    """
    qf = q.to(tl.float32)
    amax = tl.max(tl.max(tl.abs(qf), axis=1), axis=0)
    q2f = q2.to(tl.float32)
    if HAS_TAIL:
        amax = tl.maximum(amax, tl.max(tl.max(tl.abs(q2f), axis=1), axis=0))
    e = tl.maximum(((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 141, 0)  # 127 + 14
    down = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2^-e, exact
    up = ((127 + e) << 23).to(tl.float32, bitcast=True)  # 2^e
    return (qf * down).to(tl.float16), (q2f * down).to(tl.float16), up


@triton.jit
def _attend(q, q2, t_lo, t_hi, blk_n, l0, h, pos, slope2, d, d_mask, d2, d2_mask, dv, dv_mask,
            bt_row_ptr, k_ptr, v_ptr,
            qk_scale, cap, window, ws_ml_ptr, ws_o_ptr, ws_row0, rows, row_ok, n_parts,
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
            IEEE: tl.constexpr, LAZY_L: tl.constexpr, HAS_TAIL: tl.constexpr,
            BLOCK_DT: tl.constexpr, DV: tl.constexpr, BLOCK_DV: tl.constexpr,
            V_IS_K: tl.constexpr):
    """Online softmax of the group rows over keys [t_lo, t_hi), one tile of STEP keys at a time.
    A guarded caller checked every block id of [t_lo, t_hi) first (:func:`_bad_ids`); when one
    is outside the cache (or the length is invalid) it passes an empty range and l0 = NaN (the
    state's starting l, else 0): the returned state is then poisoned, and finalize_state and
    the combine turn it into NaN rows.

    t_lo is a multiple of STEP, and STEP divides PART, so no tile straddles a partition. Split
    launch: [t_lo, t_hi) is one partition; returns its state (m, l, acc). One-pass launch: the
    whole sequence; at each partition's last tile its state is merged (:func:`_merge`) into the
    running (M, L, A) and restarted, so the K/V stream never leaves the pipelined loop; returns
    (M, L, A). PARK (split programs that own several partitions): when the sequence has more
    than one partition, each partition's state is stored to the workspace at its last tile and
    restarted, exactly what one program per partition stores. blk_n: the block ids of the first
    tile (:func:`_tile_block_ids`, loaded by the caller). q [BLOCK_M, BLOCK_D]; pos [BLOCK_M]
    absolute query positions; slope2 [BLOCK_M] ALiBi slopes (log2 domain). m, l: [BLOCK_M]
    (log2 domain); acc [BLOCK_M, BLOCK_D] float32. LAZY_L (``decode._lazy_rowsum``): the row sums
    stay per key lane ([BLOCK_M, BLOCK_N], rescaled like acc) and are summed over the lanes only
    at a partition's end: the tiles then cross warps once (the row max), not twice.
    HAS_TAIL: K's head dim is a main tile d [BLOCK_D] and a tail tile d2 [BLOCK_DT] (576 =
    512 + 64; q2 [BLOCK_M, BLOCK_DT] is q's tail), two dots summed, instead of one tile padded
    to the next power of 2. V is dv [BLOCK_DV] wide (acc [BLOCK_M, BLOCK_DV]); V_IS_K: V is
    the K cache's first DV = BLOCK_D columns (MLA's latent cache), so the K tile is V's.
    """
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32) + l0
    l_v = tl.zeros((BLOCK_M, BLOCK_N), tl.float32) + l0
    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    big_m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    big_l = tl.zeros((BLOCK_M,), tl.float32) + l0
    big_a = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
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
        if HAS_TAIL:  # K's columns [BLOCK_D, D): one more dot, summed
            k2_off = kv_offset(blk_n, tok[:, None], h, d2[None, :], stride_kb, stride_kt,
                               stride_kh, stride_kdh, stride_kdl, K_X, K_SPLIT, K_LO_ONE)
            k2 = tl.load(k_ptr + k2_off, mask=j_ok[:, None] & d2_mask[None, :],
                         other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_DT]
            if IEEE:
                s += tl.dot(q2, tl.trans(k2), input_precision="ieee")
            else:
                s += tl.dot(q2, tl.trans(k2))
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
        if LAZY_L:  # online_softmax_step without the sum over the lanes
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_v = l_v * alpha[:, None] + p
            m_i = m_new
        else:
            m_i, l_i, alpha, p = online_softmax_step(m_i, l_i, s)
        if V_IS_K:  # the latent cache's first DV columns: the K tile already holds them
            v = k
        else:
            v_off = kv_offset(blk_n, tok[:, None], h, dv[None, :], stride_vb, stride_vt,
                              stride_vh, stride_vdh, stride_vdl, BLOCK_DV, False, V_LO_ONE)
            v = tl.load(v_ptr + v_off, mask=j_ok[:, None] & dv_mask[None, :],
                        other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_DV]
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
                if LAZY_L:
                    l_i = tl.sum(l_v, 1)
                if ONE_PASS:
                    big_m, big_l, big_a = _merge(big_m, big_l, big_a, m_i, l_i, acc)
                else:
                    _park(ws_ml_ptr, ws_o_ptr, ws_row0 + ((end - 1) // PART) * R + rows, row_ok,
                          m_i, l_i, acc, dv, dv_mask, DV)
                m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
                l_i = tl.zeros((BLOCK_M,), tl.float32)
                l_v = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
                acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    if ONE_PASS:
        return big_m, big_l, big_a
    else:
        if LAZY_L:
            l_i = tl.sum(l_v, 1)
        return m_i, l_i, acc


@triton.jit
def _store_rows(out_ptr, lse_ptr, o, lse2, s, qi, qh, d, row_ok, lse_ok, d_mask, v_scale,
                Hq, LQ, stride_ob: tl.int64, stride_ot: tl.int64, stride_oh: tl.int64,
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
        out_ptr,  # [B, LQ, Hq, DV]
        lse_ptr,  # float32 [B, LQ, Hq]
        ws_ml_ptr,  # float32 [B, Hkv * HSPLIT, P, R, 2]: (m_p, l_p) per partition and row
        ws_o_ptr,  # float32 [B, Hkv * HSPLIT, P, R, DV]: acc_p (unnormalised)
        err_ptr,  # int32 [1]: guarded rows are counted here (HAS_ERR), else a dummy
        scale, cap, window, Hq, LQ, P, BT_W, PPP, NB, FILL_N, SLOTS, FINE, NBLK,
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
        LAZY_L: tl.constexpr, PDL: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
        HAS_CAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SINK: tl.constexpr,
        HAS_KV_SCALE: tl.constexpr, RETURN_LSE: tl.constexpr, IEEE: tl.constexpr,
        F16_DOT: tl.constexpr, BAL: tl.constexpr, NB_BLOCK: tl.constexpr, GUARD: tl.constexpr,
        HAS_ERR: tl.constexpr, DV: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_TAIL: tl.constexpr,
        BLOCK_DT: tl.constexpr, V_IS_K: tl.constexpr, HSPLIT: tl.constexpr):
    # Preconditions (launcher): BT_W * BS and NBLK * the block stride fit their types; q, out,
    # caches and workspace hold the shapes above. GUARD: the device metadata is not trusted: a
    # length outside {0} u [LQ, BT_W * BS] runs as 0, and a program whose keys' block ids are
    # not all in [0, NBLK) reads no tile; either makes the sequence's rows NaN (out and lse),
    # counted in err_ptr. Nothing outside the given tensors is read or written whatever the
    # metadata holds.
    # Head dims: q and K are D wide (a BLOCK_D tile, plus a BLOCK_DT tail tile when HAS_TAIL),
    # V and out DV (BLOCK_DV). Axis 0 is (KV head, row chunk): HSPLIT programs per KV head, each
    # owning R of the group's G * LQ rows (decode._head_split); "Hkv" below counts them.
    # grid: (Hkv, B, P) in split mode (axis 2 = partition), (Hkv, B, 1) in one-pass mode;
    # split with MULTI: (Hkv, B, cdiv(P, PPP)), program p owns partitions [p * PPP, p * PPP + PPP)
    # balanced (BAL): (Hkv, B + decode._balance_extra, 1): program y < B runs sequence y's first
    # share, program B + e the batch's extra share e (_decode_state.plan and extra_share, inputs
    # NB, FILL_N, SLOTS, FINE); share a owns partitions [a * ppp, a * ppp + ppp)
    if PDL:  # the combine launch may start now; it waits for this grid before reading
        gdc_launch_dependents()
    hv = tl.program_id(0)
    h = hv // HSPLIT  # the KV head
    y = tl.program_id(1)
    s = y.to(tl.int64)
    if BAL:  # an extra share's sequence comes from the plan (below)
        s = tl.minimum(s, NB - 1)
    seq_len = tl.load(seq_lens_ptr + s).to(tl.int32)
    CAP = BT_W * BS  # the table's capacity in tokens
    if BAL:  # the batch's lengths, issued beside seq_len: one round trip for both
        j0 = tl.arange(0, NB_BLOCK)
        lens0 = batch_lens(seq_lens_ptr, NB, j0, CAP, LQ)
    bad_len = False
    if GUARD:
        seq_len, len_ok = valid_len(seq_len, CAP, LQ)
        bad_len = len_ok == 0
    rows = tl.arange(0, BLOCK_M)
    gr = (hv % HSPLIT) * R + rows  # group row = (query token gr // G, head h*G + gr % G)
    row_ok = (rows < R) & (gr < G * LQ)
    qi = gr // G
    qh = h * G + gr % G
    d = tl.arange(0, BLOCK_D)
    d_mask = d < D
    d2 = BLOCK_D + tl.arange(0, BLOCK_DT)  # the tail tile's columns (HAS_TAIL)
    d2_mask = d2 < D
    dv = tl.arange(0, BLOCK_DV)
    dv_mask = dv < DV
    q_off = qi[:, None] * stride_qt + qh[:, None] * stride_qh + d[None, :]
    q2_off = qi[:, None] * stride_qt + qh[:, None] * stride_qh + d2[None, :]
    q_ok = row_ok[:, None] & d_mask[None, :]
    q_pre = row_ok
    if BAL:  # an extra program loads nothing before the plan gives its sequence
        q_pre = row_ok & (rows < tl.where(y < NB, BLOCK_M, 0))
    q = tl.load(q_ptr + s * stride_qb + q_off, mask=q_pre[:, None] & d_mask[None, :], other=0.0)
    q2 = tl.zeros((BLOCK_M, BLOCK_DT), q.dtype)
    if HAS_TAIL:
        q2 = tl.load(q_ptr + s * stride_qb + q2_off, mask=q_pre[:, None] & d2_mask[None, :],
                     other=0.0)
    STEP: tl.constexpr = BLOCK_N if BLOCK_N <= PART else PART  # keys per tile
    if BAL:
        # a first share starts at the first visible tile: its ids load before the plan arrives
        blk_pre = _tile_block_ids(block_table_ptr + s * stride_bt,
                                  first_tile(seq_len, LQ, window, HAS_WINDOW, STEP),
                                  tl.where(y < NB, BT_W * BS, 0), tl.arange(0, BLOCK_N), BS,
                                  ONE_BLOCK)
        s, seq_len, whole, p, pp, _ = balanced_share(y, s, seq_len, lens0, j0, seq_lens_ptr, NB,
                                                     tl.num_programs(0), FILL_N, SLOTS, FINE,
                                                     PART, CAP, LQ, NB_BLOCK)
        if y >= NB:  # an extra share (of a valid sequence): its sequence's q
            q = tl.load(q_ptr + s * stride_qb + q_off, mask=q_ok, other=0.0)
            if HAS_TAIL:
                q2 = tl.load(q_ptr + s * stride_qb + q2_off,
                             mask=row_ok[:, None] & d2_mask[None, :], other=0.0)
            if GUARD:
                bad_len = y < 0
    n_parts = tl.maximum((seq_len + PART - 1) // PART, 1)
    pos = seq_len - LQ + qi  # [BLOCK_M] absolute position of each row's query
    qk_scale = scale  # k_scale folds in here; log2(e) too unless the soft-cap needs natural logits
    v_scale = 1.0
    if HAS_KV_SCALE:  # per KV head = this program's head: scalars
        qk_scale = qk_scale * tl.load(k_scale_ptr + h)
        v_scale = tl.load(v_scale_ptr + h)
    if F16_DOT:  # bf16 q over an fp8 cache: the dots run in fp16 (see _fp16_q)
        q, q2, q_mul = _fp16_q(q, q2, HAS_TAIL)
        qk_scale = qk_scale * q_mul
    if not HAS_CAP:
        qk_scale = qk_scale * 1.4426950408889634
    slope2 = tl.zeros((BLOCK_M,), tl.float32)
    if HAS_ALIBI:
        slope2 = tl.load(slopes_ptr + qh, mask=row_ok, other=0.0) * 1.4426950408889634
    sink = tl.zeros((BLOCK_M,), tl.float32)
    if HAS_SINK:
        sink = tl.load(sinks_ptr + qh, mask=row_ok, other=0.0)
    bt_row_ptr = block_table_ptr + s * stride_bt
    ws_row0 = ((s * tl.num_programs(0) + hv) * P) * R  # int64: (s, hv, partition 0, row 0)
    first = first_tile(seq_len, LQ, window, HAS_WINDOW, STEP)  # the first with a visible key
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
                park_neutral(ws_ml_ptr, ws_o_ptr, ws_row0, p, tl.minimum(first // PART, p + PPP),
                             rows, row_ok, dv, dv_mask, R, DV, BLOCK_M, BLOCK_DV)
    elif BAL:
        t_lo = tl.maximum(p * PART, first)  # (p, pp, whole: balanced_share)
        t_hi = tl.minimum((p + pp) * PART, seq_len)
        if HAS_WINDOW:  # a share's partitions wholly before the window: neutral states
            if not whole:
                park_neutral(ws_ml_ptr, ws_o_ptr, ws_row0, p, tl.minimum(first // PART, p + pp),
                             rows, row_ok, dv, dv_mask, R, DV, BLOCK_M, BLOCK_DV)
    else:
        p = tl.program_id(2)
        t_lo = tl.maximum(p * PART, first)
        t_hi = tl.minimum(p * PART + PART, seq_len)
    # the first tile's block ids, masked by the table's width only: this load does not wait for
    # seq_len (K/V lanes past seq_len are masked off by _attend), one round trip less per program
    if BAL:
        blk0 = blk_pre  # a first share's (t_lo = first)
        if y >= NB:
            blk0 = _tile_block_ids(bt_row_ptr, t_lo, BT_W * BS, tl.arange(0, BLOCK_N), BS,
                                   ONE_BLOCK)
    else:
        blk0 = _tile_block_ids(bt_row_ptr, t_lo, BT_W * BS, tl.arange(0, BLOCK_N), BS, ONE_BLOCK)
    l0 = 0.0
    if GUARD:  # every id this program will read, checked beside the first tile's id load
        bad = bad_len | _bad_ids(bt_row_ptr, t_lo // BS, (t_hi + BS - 1) // BS, NBLK, SCAN)
        t_hi = tl.where(bad, t_lo, t_hi)  # a bad id: no tile at all
        l0 = tl.where(bad, float("nan"), 0.0)  # and a poisoned state
        if HAS_ERR:  # the guards' count: each guarded row once (never the data's NaN)
            if bad:
                _count_guarded(err_ptr, bt_row_ptr, bad_len, first, t_lo, NBLK,
                               tl.sum(row_ok.to(tl.int32)), BS)

    if p < n_parts:  # split: programs past the sequence's last partition have nothing to do
        if BAL:  # one loop per kind of program, each with its launch shape's registers
            if whole:  # the one-pass loop
                m, l, acc = _attend(
                    q, q2, t_lo, t_hi, blk0, l0, h, pos, slope2, d, d_mask, d2, d2_mask, dv, dv_mask,
                    bt_row_ptr, k_ptr, v_ptr,
                    qk_scale, cap, window, ws_ml_ptr, ws_o_ptr, ws_row0, rows, row_ok,
                    n_parts, stride_kb, stride_kt, stride_kh, stride_kdh, stride_kdl,
                    stride_vb, stride_vt, stride_vh, stride_vdh, stride_vdl, K_X, K_SPLIT, K_LO_ONE,
                    V_LO_ONE, BS, BLOCK_M, BLOCK_N, BLOCK_D, STEP, PART, ONE_BLOCK, True, False,
                    R, D, CAUSAL, HAS_WINDOW, HAS_CAP, HAS_ALIBI, IEEE, LAZY_L, HAS_TAIL, BLOCK_DT, DV, BLOCK_DV, V_IS_K)
            else:  # a share: the split loop, parking every partition (n_parts > 1 here)
                m, l, acc = _attend(
                    q, q2, t_lo, t_hi, blk0, l0, h, pos, slope2, d, d_mask, d2, d2_mask, dv, dv_mask,
                    bt_row_ptr, k_ptr, v_ptr,
                    qk_scale, cap, window, ws_ml_ptr, ws_o_ptr, ws_row0, rows, row_ok,
                    n_parts, stride_kb, stride_kt, stride_kh, stride_kdh, stride_kdl,
                    stride_vb, stride_vt, stride_vh, stride_vdh, stride_vdl, K_X, K_SPLIT, K_LO_ONE,
                    V_LO_ONE, BS, BLOCK_M, BLOCK_N, BLOCK_D, STEP, PART, ONE_BLOCK, False, True,
                    R, D, CAUSAL, HAS_WINDOW, HAS_CAP, HAS_ALIBI, IEEE, LAZY_L, HAS_TAIL, BLOCK_DT, DV, BLOCK_DV, V_IS_K)
        else:
            m, l, acc = _attend(
                q, q2, t_lo, t_hi, blk0, l0, h, pos, slope2, d, d_mask, d2, d2_mask, dv, dv_mask,
                    bt_row_ptr, k_ptr, v_ptr,
                qk_scale, cap, window, ws_ml_ptr, ws_o_ptr, ws_row0, rows, row_ok, n_parts,
                stride_kb, stride_kt, stride_kh, stride_kdh, stride_kdl, stride_vb, stride_vt,
                stride_vh,
                stride_vdh, stride_vdl, K_X, K_SPLIT, K_LO_ONE, V_LO_ONE, BS, BLOCK_M, BLOCK_N,
                BLOCK_D, STEP, PART, ONE_BLOCK, ONE_PASS, MULTI, R, D, CAUSAL, HAS_WINDOW, HAS_CAP,
                HAS_ALIBI, IEEE, LAZY_L, HAS_TAIL, BLOCK_DT, DV, BLOCK_DV, V_IS_K)
        if GUARD:
            if MULTI or BAL:  # partitions the loop would have parked: l is NaN
                n_mine = PPP
                if BAL:
                    n_mine = tl.where(whole, 0, pp)
                if tl.max((l != l).to(tl.int32)) > 0:  # poisoned: no tile ran
                    for pe in range(p, tl.minimum(p + n_mine, n_parts)):
                        tl.store(ws_ml_ptr + 2 * (ws_row0 + pe * R + rows) + 1, float("nan"),
                                 mask=row_ok)
        if BAL:
            if whole:
                o, lse2 = finalize_state(m, l, acc, sink, HAS_SINK)
                _store_rows(out_ptr, lse_ptr, o, lse2, s, qi, qh, dv, row_ok, row_ok,
                            dv_mask, v_scale, Hq, LQ, stride_ob, stride_ot, stride_oh,
                            RETURN_LSE)
        elif ONE_PASS or n_parts == 1:
            if not ONE_PASS:  # the state one-pass would hold: one merge into the empty state
                m, l, acc = _merge(tl.full((BLOCK_M,), float("-inf"), tl.float32),
                                   tl.zeros((BLOCK_M,), tl.float32),
                                   tl.zeros((BLOCK_M, BLOCK_DV), tl.float32), m, l, acc)
            o, lse2 = finalize_state(m, l, acc, sink, HAS_SINK)
            _store_rows(out_ptr, lse_ptr, o, lse2, s, qi, qh, dv, row_ok, row_ok, dv_mask,
                        v_scale, Hq, LQ, stride_ob, stride_ot, stride_oh, RETURN_LSE)
        elif not MULTI:  # park (m_p, l_p, acc_p) for the combine (MULTI parked in the loop)
            _park(ws_ml_ptr, ws_o_ptr, ws_row0 + p * R + rows, row_ok, m, l, acc, dv, dv_mask, DV)
