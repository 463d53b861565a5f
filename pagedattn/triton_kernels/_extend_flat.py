"""``flat``: the persistent extend variant (PAGEDATTN_EXTEND_VARIANT=flat; opt-in, unmeasured).

Why: at 255 registers x 256 threads one program fills an SM, so each program's fixed cost
(launch, Q load, the pipeline fill of its first K/V tiles, a second fill for the diagonal loop,
the drain and the epilogue) overlaps nothing; short extends have 9-17 key tiles per program
(bench/NOTES_extend.md, session 3: 41-43 % of matmul against 52-54 % with 32+ tiles).

What: grid = min(units, SMs); a unit is two query blocks of one (request, KV head): m-blocks
NM2-1-j and j (NM2 = m-blocks rounded up to even), whose causal key counts sum to a constant per
request, so equal units give equal programs. Program p owns units p, p + G, p + 2G, ... and walks
all their key tiles in ONE pipelined loop (total trip count from a vectorised prologue):

  tile t:   K/V (ids carried from t-1) | advance the cursor: next tile, or the next item's
            tile 0 (its ids load now)  | QK, softmax (masked branch on diagonal tiles), PV
            at an item's last tile:      normalise, store out (lse), reset (m, l), load next Q

so the next item's first K/V tiles are in flight while the current item ends. acc needs no
reset: the first tile of an item has m_i = -inf, hence alpha = 0. Keys of a row are visited in
pipe_fma's order (tile by tile from 0), so results match it up to rounding of the row max.
Scope: cache-only K/V (k_new/v_new calls run pipe_fma), no custom mask, no window, page 2^k.
"""
import triton
import triton.language as tl

from pagedattn.triton_kernels._common import (LN2, LOG2E, alibi_bias, finalize_state, kv_offset,
                                              online_softmax_step, soft_cap, visible)
from pagedattn.triton_kernels._extend_variants import _dot, _page_ids, _rows

_LOG2E = tl.constexpr(LOG2E)
_LN2 = tl.constexpr(LN2)


@triton.jit
def _item(s, pid, n_prog, NM2: tl.constexpr, hkv):
    """(b, kv head, m-block) of the program's s-th item (any int tensor shape)."""
    unit = pid + n_prog * (s // 2)
    grp = unit // (NM2 // 2)  # (request, kv head) group
    j = unit % (NM2 // 2)
    mb = tl.where(s % 2 == 0, NM2 - 1 - j, j)  # long block first, then its complement
    return grp // hkv, grp % hkv, mb


@triton.jit
def _next(s, n_tiles, ITEMS: tl.constexpr):
    """Index of the first item after s with key tiles (ITEMS if none)."""
    idx = tl.arange(0, ITEMS)
    return tl.min(tl.where((idx > s) & (n_tiles > 0), idx, ITEMS), 0)


@triton.jit
def _masked_step(m_i, l_i, qk, scale, logit_cap, alibi_ptr, head, hg, jpos, row_pos, lk,
                 GROUP: tl.constexpr, CAUSAL: tl.constexpr, HAS_CAP: tl.constexpr,
                 HAS_ALIBI: tl.constexpr):
    """pipe_fma's general step on qk [M, N]: soft-cap, ALiBi, the causal / key-range mask."""
    if HAS_CAP:
        sl = soft_cap(qk * scale, logit_cap) * _LOG2E
    else:
        sl = qk * (scale * _LOG2E)
    if HAS_ALIBI:
        slope2 = tl.load(alibi_ptr + head, mask=hg < GROUP, other=0.0) * _LOG2E  # [M]
        sl += alibi_bias(slope2[:, None], jpos[None, :], row_pos[:, None])
    vis = visible(jpos[None, :], row_pos[:, None], lk, 0, CAUSAL, False)  # [M, N]
    return online_softmax_step(m_i, l_i, tl.where(vis, sl, float("-inf")))


@triton.jit
def _extend_flat(
    q_ptr,  # [T, Hq, D]
    kc_ptr, vc_ptr,  # paged K / V caches, any layout (addressed through kv_offset)
    out_ptr,  # [T, Hq, D]
    lse_ptr,  # [T, Hq] float32 (dummy unless RETURN_LSE)
    bt_ptr,  # int32 [B, max_blocks]
    cu_ptr,  # int32 [B + 1] query row offsets
    lens_ptr,  # int32 [B] Lk
    kscale_ptr, vscale_ptr,  # float32 [Hkv] (dummy unless KV_FP8)
    alibi_ptr, sinks_ptr,  # float32 [Hq] (dummy unless HAS_ALIBI / HAS_SINKS)
    sm_scale, logit_cap,
    num_units,  # B * Hkv * NM2 / 2
    hkv,  # KV heads
    stride_qt: tl.int64, stride_qh: tl.int64, stride_ot: tl.int64, stride_oh: tl.int64,
    stride_lt: tl.int64, stride_lh: tl.int64, stride_bt: tl.int64,
    stride_kb: tl.int64, stride_kt: tl.int64, stride_kh: tl.int64, stride_kdh: tl.int64,
    stride_kdl: tl.int64, stride_vb: tl.int64, stride_vt: tl.int64, stride_vh: tl.int64,
    stride_vdh: tl.int64, stride_vdl: tl.int64,
    NM2: tl.constexpr,  # m-blocks per (request, KV head), rounded up to even
    ITEMS: tl.constexpr,  # power of 2 >= 2 x units per program
    K_X: tl.constexpr, K_SPLIT: tl.constexpr, K_LO_ONE: tl.constexpr, V_LO_ONE: tl.constexpr,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_CAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_SINKS: tl.constexpr, KV_FP8: tl.constexpr, RETURN_LSE: tl.constexpr, IEEE: tl.constexpr,
):
    # Preconditions (launcher): as _extend_fwd's, plus cache-only K/V, PAGE a power of 2.
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP_P
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)

    # Prologue: the key-tile count of each of this program's items, vectorised over [ITEMS].
    si = tl.arange(0, ITEMS)
    bv, _, mbv = _item(si, pid, n_prog, NM2, hkv)
    ok = pid + n_prog * (si // 2) < num_units
    q0v = tl.load(cu_ptr + bv, mask=ok, other=0)
    lqv = tl.load(cu_ptr + bv + 1, mask=ok, other=0) - q0v
    lkv = tl.load(lens_ptr + bv, mask=ok, other=0)
    if CAUSAL:
        hiv = tl.minimum(lkv, lkv - lqv + mbv * BLOCK_Q + BLOCK_Q)
    else:
        hiv = lkv
    n_tiles = tl.where(ok & (mbv * BLOCK_Q < lqv), (hiv + BLOCK_N - 1) // BLOCK_N, 0)  # [ITEMS]
    total = tl.sum(n_tiles, 0)

    rows = tl.arange(0, BLOCK_M)
    rtok = rows // GROUP_P  # [M] token within the block
    hg = rows % GROUP_P  # [M] head within the group
    d = tl.arange(0, HEAD_DIM_P)
    d_ok = d < HEAD_DIM
    n = tl.arange(0, BLOCK_N)
    zero = tl.zeros([], tl.int64)
    dk = kv_offset(zero, 0, 0, d[:, None], stride_kb, stride_kt, stride_kh, stride_kdh,
                   stride_kdl, K_X, K_SPLIT, K_LO_ONE)  # [D_P, 1]
    dv = kv_offset(zero, 0, 0, d[None, :], stride_vb, stride_vt, stride_vh, stride_vdh,
                   stride_vdl, HEAD_DIM_P, False, V_LO_ONE)  # [1, D_P]
    PAD_D: tl.constexpr = HEAD_DIM_P != HEAD_DIM

    # The cursor: item s (its request b, KV head h, query block tok0) and the tile at start.
    s = _next(-1, n_tiles, ITEMS)
    b, h, mb = _item(s, pid, n_prog, NM2, hkv)
    b = b.to(tl.int64)
    h = h.to(tl.int64)
    tok0 = (mb * BLOCK_Q).to(tl.int64)
    q0 = tl.load(cu_ptr + b, mask=s < ITEMS, other=0).to(tl.int64)
    lq = tl.load(cu_ptr + b + 1, mask=s < ITEMS, other=0).to(tl.int64) - q0
    lk = tl.load(lens_ptr + b, mask=s < ITEMS, other=0).to(tl.int64)
    start = zero
    row_tok = tok0 + rtok
    row_ok = (row_tok < lq) & (hg < GROUP)
    head = h * GROUP + hg  # [M] query head
    q_off = (q0 + row_tok)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [M, D_P]
    nxt = _page_ids(bt_ptr + b * stride_bt, start, (lk + PAGE - 1) // PAGE, PAGE, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
    for _ in range(0, total):
        # -- K/V of tile (s, start); ids loaded one iteration earlier
        prefix = lk - lq
        if CAUSAL:
            hi = tl.minimum(lk, prefix + tok0 + BLOCK_Q)
            full = (prefix + tok0 + 1) // BLOCK_N * BLOCK_N  # keys every row sees
        else:
            hi = lk
            full = lk // BLOCK_N * BLOCK_N
        jpos = start + n  # [N] absolute key position
        rk = _rows(nxt, start, stride_kb, stride_kt, PAGE, BLOCK_N)  # [N]
        rv = _rows(nxt, start, stride_vb, stride_vt, PAGE, BLOCK_N)
        k_ptrs = kc_ptr + h * stride_kh + (rk[None, :] + dk)  # [D_P, N]
        v_ptrs = vc_ptr + h * stride_vh + (rv[:, None] + dv)  # [N, D_P]
        k = tl.load(k_ptrs, mask=(jpos < lk)[None, :] & d_ok[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=(jpos < lk)[:, None] & d_ok[None, :], other=0.0)
        if KV_FP8:
            k = k.to(q.dtype)
            v = v.to(q.dtype)

        # -- advance the cursor; the next tile's ids load now (its K/V next iteration)
        last = start + BLOCK_N >= hi
        s2 = s
        b2 = b
        h2 = h
        tok2 = tok0
        q02 = q0
        lq2 = lq
        lk2 = lk
        start2 = start + BLOCK_N
        if last:
            s2 = _next(s, n_tiles, ITEMS)
            bb, hh, mm = _item(s2, pid, n_prog, NM2, hkv)
            b2 = bb.to(tl.int64)
            h2 = hh.to(tl.int64)
            tok2 = (mm * BLOCK_Q).to(tl.int64)
            q02 = tl.load(cu_ptr + b2, mask=s2 < ITEMS, other=0).to(tl.int64)
            lq2 = tl.load(cu_ptr + b2 + 1, mask=s2 < ITEMS, other=0).to(tl.int64) - q02
            lk2 = tl.load(lens_ptr + b2, mask=s2 < ITEMS, other=0).to(tl.int64)
            start2 = zero
        nxt = _page_ids(bt_ptr + b2 * stride_bt, start2, (lk2 + PAGE - 1) // PAGE, PAGE, BLOCK_N)

        # -- the online softmax; the mask only on the diagonal (and the partial last) tiles
        k_sc = 1.0
        if KV_FP8:
            k_sc = tl.load(kscale_ptr + h)
        qk = _dot(q, k, IEEE)  # [M, N] fp32
        row_pos = prefix + tok0 + rtok  # [M]
        head = h * GROUP + hg  # [M] query head
        if HAS_CAP or HAS_ALIBI:
            m_new, l_new, alpha, p = _masked_step(m_i, l_i, qk, sm_scale * k_sc, logit_cap,
                                                  alibi_ptr, head, hg, jpos, row_pos, lk,
                                                  GROUP, CAUSAL, HAS_CAP, HAS_ALIBI)
        elif start >= full:  # the diagonal or the partial last tile
            m_new, l_new, alpha, p = _masked_step(m_i, l_i, qk, sm_scale * k_sc, logit_cap,
                                                  alibi_ptr, head, hg, jpos, row_pos, lk,
                                                  GROUP, CAUSAL, False, False)
        else:  # every key visible: the FFMA form of pipe_fma (m_new finite)
            sc = sm_scale * k_sc * _LOG2E
            m_new = tl.maximum(m_i, tl.max(qk, 1) * sc)  # [M]
            p = tl.math.exp2(qk * sc - m_new[:, None])  # [M, N]
            alpha = tl.math.exp2(m_i - m_new)
            l_new = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        l_i = l_new
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)

        # -- the item's last tile: epilogue, then the next item's state and Q
        if last:
            row_tok = tok0 + rtok  # rebuilt here, not carried (registers)
            row_ok = (row_tok < lq) & (hg < GROUP)
            head = h * GROUP + hg
            sink2 = tl.zeros([BLOCK_M], dtype=tl.float32)
            if HAS_SINKS:
                sink2 = tl.load(sinks_ptr + head, mask=hg < GROUP, other=0.0) * _LOG2E
            o, lse2 = finalize_state(m_i, l_i, acc, sink2, HAS_SINKS)  # [M, D_P], [M]
            if KV_FP8:
                o = o * tl.load(vscale_ptr + h)
            o_off = (q0 + row_tok)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
            tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty),
                     mask=row_ok[:, None] & d_ok[None, :])
            if RETURN_LSE:
                tl.store(lse_ptr + (q0 + row_tok) * stride_lt + head * stride_lh, lse2 * _LN2,
                         mask=row_ok)
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # alpha = 0 clears acc
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            row2 = tok2 + rtok
            ok2 = (row2 < lq2) & (hg < GROUP)  # lq2 = 0 past the last item
            q_off = (q02 + row2)[:, None] * stride_qt + (h2 * GROUP + hg)[:, None] * stride_qh \
                + d[None, :]
            q = tl.load(q_ptr + q_off, mask=ok2[:, None] & d_ok[None, :], other=0.0)
        s = s2
        b = b2
        h = h2
        tok0 = tok2
        q0 = q02
        lq = lq2
        lk = lk2
        start = start2


def grid_shape(n_units: int, n_sm: int):
    """(programs, ITEMS): one program per SM (fewer if fewer units), <= 32 units each."""
    g = max(1, min(n_units, n_sm))
    g = max(g, triton.cdiv(n_units, 32))
    return g, triton.next_power_of_2(2 * triton.cdiv(n_units, g))


def launch(args: dict, cfg, *, num_seqs: int, num_kv_heads: int, max_q: int, group_p: int,
           device) -> None:
    """Launch :func:`_extend_flat` with _extend_fwd's keyword arguments ``args`` (the extra ones
    are dropped) and the tile config ``cfg`` (launcher: extend.run)."""
    nm2 = triton.cdiv(max_q, cfg.block_m // group_p)
    nm2 += nm2 % 2
    n_units = num_seqs * num_kv_heads * nm2 // 2
    g, items = grid_shape(n_units, _sm_count(device))
    kw = {k: v for k, v in args.items() if k in _extend_flat.arg_names}
    # grid = (min(SMs, units) programs, or cdiv(units, 32) when more): units p, p + G, ...
    _extend_flat[(g,)](**kw, num_units=n_units, hkv=num_kv_heads, NM2=nm2, ITEMS=items,
                       BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
                       num_stages=cfg.num_stages)


_INTERP_PROGRAMS = 3  # the interpreter: few programs, so each walks several units


def _sm_count(device) -> int:
    import torch

    if device.type != "cuda":
        return _INTERP_PROGRAMS
    return torch.cuda.get_device_properties(device).multi_processor_count
