"""Paged decode for sm_90 in Gluon: one warpgroup, wgmma over 64 rows, a cp.async page ring.

Why (bench/NOTES.md, sessions 3-12): the Triton decode loop (``_decode_kernels._attend``) runs
mma.sync on 16-row tiles with its KV tile split over the 4 warps, so every tile takes cross-warp
max and sum reductions and a P layout change through shared memory. Here the group's G * Lq rows
are zero-padded to the 64 rows of one warpgroup wgmma: S = Q K_t^T reads K straight from the
ring, each warp owns 16 rows, so the softmax reductions stay inside a warp, P feeds the P V wgmma
from registers and V is read from the ring too. The tensor work is 64 / (G Lq) times the useful
one, well under the tile's memory time on the H200. Measured (H200, session 12): level with the
Triton kernel on the GQA one-pass rows, steadier and up to 4 % faster on MHA and on 64-token
pages, 2-3 % slower on GQA split rows with 16-token pages (``decode.variant`` picks by that).

Same grid, partitions, workspace and merge arithmetic as ``_decode_kernels._decode_kernel``
(``decode.py`` holds the design): grid (Hkv, B, partitions | partition groups | 1); one-pass
programs fold each partition's state into registers at its last tile with the explicit FMAs of
``_decode_kernels._merge``; split programs park (m_p, l_p, acc_p) for the Triton combine, which
folds them in the same order: outputs are bitwise equal across launch shapes (batch invariance).
This kernel never serves a call half-way: the gate (:func:`unsupported`) does not depend on the
batch, so a sequence always runs the same kernel. Split programs let the combine launch early
(griddepcontrol.launch_dependents, as the Triton kernel; Gluon has no call for it: inline PTX).

Scope: sm_90 under triton 3.6, fp16/bf16 q, caches and out of one dtype, head_dim 64 or 128, a
cache whose head dim is contiguous (bhsd, bshd), any block size, G * Lq <= 64 rows,
partitions a multiple of the tile; no window, soft-cap, ALiBi, sinks or fp8 (those calls keep
the Triton kernel).

Pipeline (NS ring slots, one cp.async group per tile {K_t, V_t}):

  iteration t: wait tile t | fence, barrier | issue tile t + NS - 1 into the slot of tile t - 1 |
               S = Q K_t^T | softmax | O = O alpha + P V_t | partition end: fold or park
  EARLY (the default): barrier | issue tile t + NS - 1 | wait tile t | fence, barrier | ...
"""
import os

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared,
                                                              warpgroup_mma, warpgroup_mma_wait)

from pagedattn._triton import interpreter_enabled
from pagedattn.triton_kernels import _replay
from pagedattn.triton_kernels._extend_gluon import _ids, _issue, _load_q

_LN2 = gl.constexpr(0.6931471805599453)
BLOCK_M = 64  # one warpgroup's wgmma rows
_BLOCK_M = gl.constexpr(BLOCK_M)  # jit code reads globals only as constexpr
NUM_WARPS = 4
# (BLOCK_N, NS): KV tokens per tile, ring slots. H200, session 12 call 1 (ab_gluon_8ee400b.md):
# of (64, 3), (32, 3), (32, 4) and (64, 2), (64, 2) was the fastest on 12 of the 20 issue rows and
# within 2 % of the fastest on 19
TILE = (64, 2)
_ALIGN = 8  # elements: every row a cp.async reads starts on 16 bytes
ENV_TILE = "PAGEDATTN_DECODE_GLUON_TILE"
ENV_EARLY = "PAGEDATTN_DECODE_GLUON_EARLY"
ENV_FORM = "PAGEDATTN_DECODE_GLUON_FORM"
ENV_PIPE = "PAGEDATTN_DECODE_GLUON_PIPE"
# an int64 CUDA tensor of >= 4 entries per program makes the next launches write %globaltimer
# stamps into it (scripts/decode_timeline.py); None: no stamps (the kernel has none compiled in)
TIMELINE = None
# int64 per program in TIMELINE: 4 %globaltimer stamps (_stamp), the SM id, and the loop's
# %clock64 cycles spent issuing copies, waiting for tiles and computing (decode_sm90 only)
STAMPS = 8
_STAMPS = gl.constexpr(STAMPS)


def tile() -> tuple:
    """(BLOCK_N, NS); ``PAGEDATTN_DECODE_GLUON_TILE="BLOCK_N,NS"`` overrides (A/B runs)."""
    raw = os.environ.get(ENV_TILE, "")
    if not raw:
        return TILE
    try:
        block_n, ns = (int(x) for x in raw.split(","))
    except ValueError:
        raise ValueError(f"{ENV_TILE}={raw!r}: expected 'BLOCK_N,NS'") from None
    if block_n not in (16, 32, 64, 128) or not 2 <= ns <= 6:
        raise ValueError(f"{ENV_TILE}={raw!r}: BLOCK_N in 16/32/64/128, NS in 2..6")
    return block_n, ns


def early() -> bool:
    """``PAGEDATTN_DECODE_GLUON_EARLY`` (default 1; 0 for A/B runs): each iteration refills its
    ring slot before it waits for its tile (NS tiles in flight during the wait instead of
    NS - 1; one more barrier per tile). Same values. H200, session 12 (ab_gluon2_340439b.md):
    faster on 13 of the 20 issue rows, slower on 6 by at most 1.0 %."""
    raw = os.environ.get(ENV_EARLY, "1")
    if raw not in ("0", "1"):
        raise ValueError(f"{ENV_EARLY}={raw!r}: expected 0 or 1")
    return raw == "1"


def pipe(ns: int) -> bool:
    """``PAGEDATTN_DECODE_GLUON_PIPE`` (default 0; 1 for A/B runs, with EARLY and >= 3 ring
    slots): :func:`decode_sm90` leaves tile t's P V wgmma in flight under tile t + 1's refill,
    tile wait and Q K wgmma, and keeps one ring slot for its V (one tile fewer ahead). Same
    values (the same wgmmas, waited for later)."""
    raw = os.environ.get(ENV_PIPE, "0")
    if raw not in ("0", "1"):
        raise ValueError(f"{ENV_PIPE}={raw!r}: expected 0 or 1")
    return raw == "1" and ns >= 3 and early()


def form(rows: int, block_n: int) -> str:
    """``PAGEDATTN_DECODE_GLUON_FORM`` (A/B runs): which Gluon kernel serves a call.

    * ``rows`` (default): :func:`decode_sm90`, the rows padded to the wgmma's 64 M rows;
    * ``swap``: ``_decode_gluon_swap.decode_sm90_swap``, keys on the M side;
    * ``ws``: ``_decode_gluon_ws.decode_sm90_ws``, the swap's arithmetic with a producer
      warpgroup issuing the copies.

    ``swap`` and ``ws`` serve calls of <= 32 rows (group x q_len) on tiles of a multiple of 64
    tokens; others keep ``rows``. Depends on the model, q_len and the tile, never on the batch.
    """
    raw = os.environ.get(ENV_FORM, "") or "rows"
    if raw not in ("rows", "swap", "ws"):
        raise ValueError(f"{ENV_FORM}={raw!r}: expected rows, swap or ws")
    if rows > 32 or block_n % 64:  # _decode_gluon_swap.MAX_ROWS; wgmma M
        return "rows"
    return raw


def occupancy(rows: int, block_n: int) -> tuple:
    """(warps, registers per thread at launch or None) of one program of the :func:`form` that
    serves ``rows``: what the split planner needs besides shared memory."""
    if form(rows, block_n) == "ws":
        from pagedattn.triton_kernels import _decode_gluon_ws as W
        return NUM_WARPS + W.P_WARPS.value, W.MAXNREG
    return NUM_WARPS, None


def smem_bytes(head_dim: int, block_n: int, ns: int, elem: int = 2, rows: int = BLOCK_M) -> int:
    """Shared memory of one program of the :func:`form` that serves ``rows``."""
    which = form(rows, block_n)
    if which == "swap":
        from pagedattn.triton_kernels import _decode_gluon_swap as S
        return S.smem_bytes(head_dim, block_n, ns, rows, elem, NUM_WARPS)
    if which == "ws":
        from pagedattn.triton_kernels import _decode_gluon_ws as W
        return W.smem_bytes(head_dim, block_n, ns, rows, elem)
    return (BLOCK_M + 2 * ns * block_n) * head_dim * elem  # Q and the K and V rings


def is_sm90(device) -> bool:
    """wgmma is sm_90 only (not sm_100+)."""
    return (device.type == "cuda" and not interpreter_enabled()
            and not getattr(torch.version, "hip", None)
            and torch.cuda.get_device_capability(device) == (9, 0))


def unsupported(call, ks, vs, rows: int, part: int, block_n: int) -> list:
    """Reasons this kernel cannot serve a validated DecodeCall on tiles of ``block_n`` tokens
    ([] = it can); never depends on the batch (batch invariance)."""
    q, g, o = call.q, call.geom, call.opts
    why = []
    if not is_sm90(q.device):
        why.append("not an sm_90 GPU")
    if q.dtype not in (torch.float16, torch.bfloat16) or call.k_cache.dtype != q.dtype \
            or call.v_cache.dtype != q.dtype or call.out.dtype != q.dtype:
        why.append("q, caches and out must share one 16-bit dtype")
    if g.head_dim not in (64, 128):
        why.append(f"head_dim {g.head_dim} not 64 or 128")
    if rows > BLOCK_M:
        why.append(f"group * q_len = {rows} rows > {BLOCK_M}")
    if o.sliding_window is not None or o.logit_cap is not None or o.alibi_slopes is not None \
            or o.sinks is not None:
        why.append("window, soft-cap, ALiBi or sinks")
    if ks.x < g.head_dim or ks.dim_lo != 1 or vs.dim_lo != 1:
        why.append("the cache's head dim is not contiguous")
    if part % block_n:
        why.append(f"partition size {part} not a multiple of the {block_n}-token tile")
    q4 = q if q.dim() == 4 else q.unsqueeze(1)
    strides = (q4.stride(0), q4.stride(1), q4.stride(2), ks.block, ks.token, ks.head, vs.block,
               vs.token, vs.head)
    ptrs = (q, call.k_cache, call.v_cache)
    if any(x % _ALIGN for x in strides) or any(t.data_ptr() % 16 for t in ptrs) \
            or q.stride(-1) != 1 or call.out.stride(-1) != 1:
        why.append("rows not 16-byte aligned")
    return why


def launch(call, ks, vs, q4, out4, lse, ws_ml, ws_o, grid, group, rows, part, n_part_max, ppp,
           one_pass, pdl, block_n, ns, rec=None):
    """Run the kernel on ``grid`` (as decode.run's Triton launch) for a call the gate accepted,
    on the :func:`tile` (block_n, ns); pdl: the combine follows as a programmatic dependent
    launch (this grid lets it start); rec: an ``_replay.Recorder`` or None."""
    d = call.geom.head_dim
    stamps = TIMELINE
    if stamps is not None and stamps.numel() < STAMPS * grid[0] * grid[1] * grid[2]:
        raise ValueError(f"_decode_gluon.TIMELINE: {stamps.numel()} int64 < {STAMPS} per "
                         "program")
    kernel, nq, pipe_kw = decode_sm90, {}, dict(PIPE=pipe(ns))
    which = form(rows, block_n)
    if which != "rows":
        from pagedattn.triton_kernels import _decode_gluon_swap as S
        from pagedattn.triton_kernels import _decode_gluon_ws as W
        kernel = S.decode_sm90_swap if which == "swap" else W.decode_sm90_ws
        nq, pipe_kw = dict(NQ=S.rows_padded(rows)), {}
        if which == "ws":  # 128 registers at launch: two 8-warp programs per SM
            nq["maxnreg"] = W.MAXNREG
    _replay.launch(
        rec, kernel, grid,
        q4, call.k_cache, call.v_cache, call.block_table, call.seq_lens, out4, lse, ws_ml, ws_o,
        stamps if stamps is not None else lse, float(call.opts.scale) * 1.4426950408889634,
        q4.shape[1], q4.shape[2], n_part_max, ppp,
        q4.stride(0), q4.stride(1), q4.stride(2), out4.stride(0), out4.stride(1),
        out4.stride(2), call.block_table.stride(0), ks.block, ks.token, ks.head, vs.block,
        vs.token, vs.head, G=group, R=rows, D=d, PAGE=call.geom.block_size, PART=part,
        BLOCK_N=block_n, NS=ns, ONE_PASS=one_pass, MULTI=ppp > 1, CAUSAL=q4.shape[1] > 1,
        RETURN_LSE=bool(call.return_lse), EARLY=early(), PDL=pdl, **pipe_kw,
        TIMELINE=stamps is not None, num_warps=NUM_WARPS, **nq)


@gluon.jit
def _stamp(tl_ptr, slot: gl.constexpr, x):
    """TIMELINE runs: %globaltimer (ns) into tl_ptr[program, slot] (slots: 0 start, 1 first
    tile landed, 2 loop done, 3 exit); at slot 0 also %smid into slot 4 (which SM ran the
    program); x: any int32 scalar (the asm needs an operand)."""
    ns = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [x], dtype=gl.int64,
                                   is_pure=False, pack=1)
    pid = (gl.program_id(2) * gl.num_programs(1) + gl.program_id(1)) * gl.num_programs(0) \
        + gl.program_id(0)
    gl.store(tl_ptr + pid.to(gl.int64) * _STAMPS + slot, ns)
    if slot == 0:
        sm = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [x], dtype=gl.int32,
                                       is_pure=False, pack=1)
        gl.store(tl_ptr + pid.to(gl.int64) * _STAMPS + 4, sm.to(gl.int64))


@gluon.jit
def _clock(x):
    """TIMELINE runs: the SM's %clock64."""
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [x], dtype=gl.int64,
                                     is_pure=False, pack=1)


@gluon.jit
def _fold(big_m, big_l, big_a, m_p, l_p, acc_p, ROW_O: gl.constexpr):
    """``_decode_kernels._merge`` (the same operations, the same FMAs): fold one partition's
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
    """Store one partition's state for the combine at workspace rows row0 + [0, R)."""
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
    store out (and the natural-log lse) of rows [0, R)."""
    m_safe = gl.where(m == float("-inf"), 0.0, m)
    r = gl.full(m.shape, 1.0, gl.float32, ROW_O)
    inv = gl.where(l > 0, r / gl.where(l > 0, l, 1.0), 0.0)
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
        gl.store(lse_ptr + ((s * LQ + qi) * Hq + qh), lse2 * _LN2, mask=ok)


@gluon.jit
def decode_sm90(
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
    G: gl.constexpr, R: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr, PART: gl.constexpr,
    BLOCK_N: gl.constexpr, NS: gl.constexpr, ONE_PASS: gl.constexpr, MULTI: gl.constexpr,
    CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr, EARLY: gl.constexpr, PDL: gl.constexpr,
    TIMELINE: gl.constexpr, PIPE: gl.constexpr, num_warps: gl.constexpr,
):
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    # tiles issued ahead of the one computed; PIPE keeps one more slot for the P V in flight
    LEAD: gl.constexpr = NS - 2 if PIPE else NS - 1
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

    # grid: (Hkv, B, P) split, (Hkv, B, cdiv(P, PPP)) split with MULTI, (Hkv, B, 1) one pass
    h = gl.program_id(0)
    if TIMELINE:
        _stamp(tl_ptr, 0, h)
    if PDL:  # the combine launch may start now; it waits for this grid before reading
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents;\n mov.u32 $0, $1;", "=r,r",
                                  [h], dtype=gl.int32, is_pure=False, pack=1)
    s = gl.program_id(1).to(gl.int64)
    seq_len = gl.load(lens_ptr + s)
    n_parts = gl.maximum((seq_len + PART - 1) // PART, 1)
    if ONE_PASS:
        p = 0
        t_lo = 0
        t_hi = seq_len
    elif MULTI:
        p = gl.program_id(2) * PPP
        t_lo = p * PART
        t_hi = gl.minimum((p + PPP) * PART, seq_len)
    else:
        p = gl.program_id(2)
        t_lo = p * PART
        t_hi = gl.minimum(p * PART + PART, seq_len)
    if p >= n_parts:  # split: past the sequence's last partition
        if TIMELINE:
            _stamp(tl_ptr, 3, h)
        return
    n_tiles = gl.cdiv(t_hi - t_lo, BLOCK_N)
    lim = t_hi  # tiles ending past lim hold a key some row cannot see
    if CAUSAL:
        lim = gl.minimum(t_hi, seq_len - LQ + 1)

    bt_row = bt_ptr + s * stride_bt
    kc_h = kc_ptr + h.to(gl.int64) * stride_kh
    vc_h = vc_ptr + h.to(gl.int64) * stride_vh
    sb_k = stride_kb.to(gl.uint32).to(gl.int64)
    sb_v = stride_vb.to(gl.uint32).to(gl.int64)
    dcol = gl.arange(0, D, layout=gl.SliceLayout(0, LD))
    r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LD))  # key row within a tile
    TPP: gl.constexpr = PAGE if PAGE < BLOCK_N else BLOCK_N  # tile rows per page
    k_tok = (r % TPP) * stride_kt  # loop-invariant token terms (int32: within one page)
    v_tok = (r % TPP) * stride_vt
    q_smem = gl.allocate_shared_memory(dtype, [_BLOCK_M, D], Q_SMEM)
    k_ring = gl.allocate_shared_memory(dtype, [NS, BLOCK_N, D], KV_SMEM)
    v_ring = gl.allocate_shared_memory(dtype, [NS, BLOCK_N, D], KV_SMEM)

    # prologue: Q joins tile 0's group; tiles 1 .. LEAD-1 one group each. The extend kernel's Q
    # rows with one query block of LQ tokens: row r = (token r // G, head h * G + r % G)
    _load_q(q_smem, q_ptr + s * stride_qb, 0, 0, LQ, h, stride_qt, stride_qh, dcol, G, G,
            _BLOCK_M, LD)
    for i in gl.static_range(LEAD):
        start = t_lo + i * BLOCK_N
        ids = _ids(bt_row, start, t_hi, r, PAGE, BLOCK_N)
        _issue(k_ring.index(i), kc_h, ids, start, t_hi, sb_k, stride_kt, k_tok, r, dcol,
               PAGE, BLOCK_N)
        _issue(v_ring.index(i), vc_h, ids, start, t_hi, sb_v, stride_vt, v_tok, r, dcol,
               PAGE, BLOCK_N)
        async_copy.commit_group()
    ids_nx = _ids(bt_row, t_lo + LEAD * BLOCK_N, t_hi, r, PAGE, BLOCK_N)

    rows_s = gl.arange(0, _BLOCK_M, layout=ROW_S)
    pos = seq_len - LQ + rows_s // G  # [M] absolute query position of each row
    cols = gl.arange(0, BLOCK_N, layout=COL_S)
    ws_row0 = (s * gl.num_programs(0) + h) * P * R  # int64: (s, h, partition 0, row 0)
    m_i = gl.full([_BLOCK_M], float("-inf"), gl.float32, ROW_S)
    l_i = gl.zeros([_BLOCK_M], gl.float32, ROW_S)
    o = gl.zeros([_BLOCK_M, D], gl.float32, MMA_O)
    big_m = gl.full([_BLOCK_M], float("-inf"), gl.float32, ROW_O)
    big_l = gl.zeros([_BLOCK_M], gl.float32, ROW_O)
    big_a = gl.zeros([_BLOCK_M, D], gl.float32, MMA_O)
    if PIPE:  # P of the tile whose P V wgmma the next iteration issues (zeros: none pending)
        p16 = gl.zeros([_BLOCK_M, BLOCK_N], dtype, P_OP)
        pend = t_lo * 0  # 1: p16 holds tile t - 1's P
    if TIMELINE:  # cycles issuing, waiting, computing
        cyc_i = _clock(h) * 0
        cyc_w = cyc_i
        cyc_c = cyc_i
    for t in range(n_tiles):
        start = t_lo + t * BLOCK_N
        nx = start + LEAD * BLOCK_N
        if TIMELINE:
            c0 = _clock(h)
        if EARLY:  # refill first: NS tiles in flight during the wait, one more barrier
            gl.thread_barrier()  # every warp done with the slot refilled (tile t - 1; PIPE t - 2)
            _issue(k_ring.index((t + LEAD) % NS), kc_h, ids_nx, nx, t_hi, sb_k, stride_kt,
                   k_tok, r, dcol, PAGE, BLOCK_N)
            _issue(v_ring.index((t + LEAD) % NS), vc_h, ids_nx, nx, t_hi, sb_v, stride_vt,
                   v_tok, r, dcol, PAGE, BLOCK_N)
            async_copy.commit_group()
            ids_nx = _ids(bt_row, nx + BLOCK_N, t_hi, r, PAGE, BLOCK_N)
            if TIMELINE:
                c1 = _clock(h)
                cyc_i += c1 - c0
                c0 = c1
            async_copy.wait_group(LEAD)  # tile t landed (this thread's copies)
            fence_async_shared()
            gl.thread_barrier()  # every thread's copies
        else:
            async_copy.wait_group(NS - 2)  # tile t landed (this thread's copies)
            fence_async_shared()
            gl.thread_barrier()  # every thread's copies; every warp done with tile t - 1's slot
            _issue(k_ring.index((t + NS - 1) % NS), kc_h, ids_nx, nx, t_hi, sb_k, stride_kt,
                   k_tok, r, dcol, PAGE, BLOCK_N)
            _issue(v_ring.index((t + NS - 1) % NS), vc_h, ids_nx, nx, t_hi, sb_v, stride_vt,
                   v_tok, r, dcol, PAGE, BLOCK_N)
            async_copy.commit_group()
            ids_nx = _ids(bt_row, nx + BLOCK_N, t_hi, r, PAGE, BLOCK_N)  # used one tile later

        if TIMELINE:
            c1 = _clock(h)
            cyc_w += c1 - c0
            if t == 0:
                _stamp(tl_ptr, 1, h)
        sc = warpgroup_mma(q_smem, k_ring.index(t % NS).permute((1, 0)),
                           gl.zeros([_BLOCK_M, BLOCK_N], gl.float32, MMA_S), use_acc=False,
                           is_async=PIPE)
        if PIPE:  # tile t - 1's P V under S_t and the softmax (a zero P at a partition start)
            o = warpgroup_mma(p16, v_ring.index((t - pend) % NS), o, is_async=True)
            sc = warpgroup_mma_wait(1, deps=[sc])
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
        if PIPE:
            o, p16 = warpgroup_mma_wait(0, deps=[o, p16])
        o = o * gl.convert_layout(alpha, ROW_O)[:, None]
        if PIPE:
            p16 = gl.convert_layout(pr.to(dtype), P_OP)
            pend = 1
        else:
            o = warpgroup_mma(gl.convert_layout(pr.to(dtype), P_OP), v_ring.index(t % NS), o)

        end = start + BLOCK_N
        if ((end % PART) == 0) | (end >= t_hi):  # this partition's last tile
            if PIPE:  # the state needs tile t's P V now
                o = warpgroup_mma(p16, v_ring.index(t % NS), o)
                p16 = gl.zeros([_BLOCK_M, BLOCK_N], dtype, P_OP)
                pend = 0
            if ONE_PASS:
                big_m, big_l, big_a = _fold(big_m, big_l, big_a, m_i, l_i, o, ROW_O)
                m_i = gl.full([_BLOCK_M], float("-inf"), gl.float32, ROW_S)
                l_i = gl.zeros([_BLOCK_M], gl.float32, ROW_S)
                o = gl.zeros([_BLOCK_M, D], gl.float32, MMA_O)
            elif n_parts > 1:  # a single-partition sequence is finished below
                _park(ws_ml_ptr, ws_o_ptr, ws_row0 + ((end - 1) // PART) * R, m_i, l_i, o, R, D,
                      ROW_S, ROW_O, COL_O)
                m_i = gl.full([_BLOCK_M], float("-inf"), gl.float32, ROW_S)
                l_i = gl.zeros([_BLOCK_M], gl.float32, ROW_S)
                o = gl.zeros([_BLOCK_M, D], gl.float32, MMA_O)
        if TIMELINE:
            cyc_c += _clock(h) - c1
    async_copy.wait_group(0)  # no copy outlives the program
    if TIMELINE:
        _stamp(tl_ptr, 2, h)
        pid = (gl.program_id(2) * gl.num_programs(1) + gl.program_id(1)) * gl.num_programs(0) + h
        gl.store(tl_ptr + pid.to(gl.int64) * _STAMPS + 5, cyc_i)
        gl.store(tl_ptr + pid.to(gl.int64) * _STAMPS + 6, cyc_w)
        gl.store(tl_ptr + pid.to(gl.int64) * _STAMPS + 7, cyc_c)

    if ONE_PASS:
        _finish(out_ptr, lse_ptr, s, h, big_m, big_l, big_a, Hq, LQ, stride_ob, stride_ot,
                stride_oh, G, R, D, RETURN_LSE, ROW_O, COL_O)
    elif n_parts == 1:  # the state one pass would hold: one fold into the empty state
        big_m, big_l, big_a = _fold(big_m, big_l, big_a, m_i, l_i, o, ROW_O)
        _finish(out_ptr, lse_ptr, s, h, big_m, big_l, big_a, Hq, LQ, stride_ob, stride_ot,
                stride_oh, G, R, D, RETURN_LSE, ROW_O, COL_O)
    if TIMELINE:
        _stamp(tl_ptr, 3, h)
