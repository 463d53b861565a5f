"""Program setup and the cp.async page ring shared by the Gluon decode forms
(``_decode_gluon_kernel.decode_sm90``, ``_decode_gluon_swap``): which (sequence, partitions) a
program serves, the balanced launch's plan, the ring's prologue.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy, fence_async_shared

from pagedattn.triton_kernels._decode_state import balanced_share, batch_lens, valid_len
from pagedattn.triton_kernels._extend_gluon import _head_bases, _ids, _issue, _load_q

BLOCK_M = 64  # one warpgroup's wgmma rows
_BLOCK_M = gl.constexpr(BLOCK_M)  # jit code reads globals only as constexpr
NUM_WARPS = 4
@gluon.jit
def _program(lens_ptr, PPP, CAP, LQ, PART: gl.constexpr, ONE_PASS: gl.constexpr,
             MULTI: gl.constexpr, PDL: gl.constexpr, GUARD: gl.constexpr, BAL: gl.constexpr = False,
             NB=1):
    """What a program of every Gluon decode form serves: (KV head h, sequence s, seq_len, its
    partition count, the program's first partition p, its tokens [t_lo, t_hi)). Grid: (Hkv, B,
    P) split, (Hkv, B, cdiv(P, PPP)) split with MULTI, (Hkv, B, 1) one pass; p >= the count:
    nothing to do. Balanced (BAL, grid (Hkv, B + extra shares, 1)): a first share's start, from
    key 0 (:func:`_ring_plan` settles it). Lets the combine launch (PDL). GUARD: the length as
    ``_decode_state.valid_len`` runs it (an invalid one runs as 0); also returns whether it was
    invalid (the rows are then written as NaN)."""
    h = gl.program_id(0)
    if PDL:  # the combine launch may start now; it waits for this grid before reading
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents;\n mov.u32 $0, $1;", "=r,r",
                                  [h], dtype=gl.int32, is_pure=False, pack=1)
    s = gl.program_id(1).to(gl.int64)
    if BAL:  # an extra share's sequence comes from the plan
        s = gl.minimum(s, NB - 1)
    seq_len = gl.load(lens_ptr + s)
    bad_len = s < 0
    if GUARD:
        seq_len, len_ok = valid_len(seq_len, CAP, LQ)
        bad_len = len_ok == 0
    n_parts = gl.maximum((seq_len + PART - 1) // PART, 1)
    if ONE_PASS or BAL:
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
    return h, s, seq_len, n_parts, p, t_lo, t_hi, bad_len


@gluon.jit
def _bal_lens(lens_ptr, NB, CAP, LQ, NB_BLOCK: gl.constexpr, num_warps: gl.constexpr):
    """(the first NB_BLOCK lengths, their indices) for the balanced launch's plan."""
    JL: gl.constexpr = gl.BlockedLayout([NB_BLOCK // (32 * num_warps)], [32], [num_warps], [0])
    j0 = gl.arange(0, NB_BLOCK, layout=JL)
    return batch_lens(lens_ptr, NB, j0, CAP, LQ), j0


@gluon.jit
def _ring_plan(q_smem, q_ptr, k_ring, v_ring, kc_h, vc_h, bt_ptr, lens_ptr, lens0, j0, s,
               seq_len, LQ, h, NB, FILL_N, SLOTS, FINE, stride_qb, stride_qt, stride_qh,
               stride_bt, sb_k, sb_v, stride_kt, stride_vt, k_tok, v_tok, r, dcol,
               G: gl.constexpr, M: gl.constexpr, PAGE: gl.constexpr, PART: gl.constexpr,
               BLOCK_N: gl.constexpr, LEAD: gl.constexpr, LD: gl.constexpr,
               NB_BLOCK: gl.constexpr, CAUSAL: gl.constexpr, CAP=0, nblk=0,
               GUARD: gl.constexpr = False):
    """The balanced launch's start (``_decode_state.plan``, ``extra_share``; grid (Hkv, B +
    extra shares, 1)): program y < B runs sequence y's first share, program B + e the batch's
    extra share e. A first share's ring starts before the plan arrives: its first LEAD + 1
    tiles are those of the whole sequence whenever a share spans a partition of at least
    LEAD + 1 tiles. Returns (s, seq_len, n_parts, p, t_lo, t_hi, whole, none, the block ids of
    tile LEAD, and :func:`_tiles` of the share); none: an extra program past the batch's last
    share (nothing issued). The head's K and V bases (kc_h, ...) do not depend on the plan.
    GUARD: every id issued is kept inside [0, nblk) (``_extend_gluon._ids``)."""
    y = gl.program_id(1)
    EARLY: gl.constexpr = (LEAD + 1) * BLOCK_N <= PART
    if PAGE < BLOCK_N:
        ids_nx = r * 0
    else:
        ids_nx = y * 0
    if EARLY:
        if y < NB:
            ids_nx = _ring_start(q_smem, q_ptr + s * stride_qb, k_ring, v_ring, kc_h, vc_h,
                                 bt_ptr + s * stride_bt, 0, seq_len, LQ, h, stride_qt,
                                 stride_qh, sb_k, sb_v, stride_kt, stride_vt, k_tok, v_tok, r,
                                 dcol, nblk, G, M, PAGE, BLOCK_N, LEAD, LD, GUARD)
    s, seq_len, whole, p, pp, none = balanced_share(y, s, seq_len, lens0, j0, lens_ptr, NB,
                                                    gl.num_programs(0), FILL_N, SLOTS, FINE,
                                                    PART, CAP, LQ, NB_BLOCK)
    n_parts = gl.maximum((seq_len + PART - 1) // PART, 1)
    t_lo = p * PART
    t_hi = gl.minimum((p + pp) * PART, seq_len)
    late = y >= NB
    if not EARLY:
        late = y >= 0
    n_tiles, lim, bt_row = _tiles(bt_ptr, s, seq_len, t_lo, t_hi, LQ, stride_bt, BLOCK_N, CAUSAL)
    if late & (none == 0):
        ids_nx = _ring_start(q_smem, q_ptr + s * stride_qb, k_ring, v_ring, kc_h, vc_h, bt_row,
                             t_lo, t_hi, LQ, h, stride_qt, stride_qh, sb_k, sb_v, stride_kt,
                             stride_vt, k_tok, v_tok, r, dcol, nblk, G, M, PAGE, BLOCK_N, LEAD,
                             LD, GUARD)
    return s, seq_len, n_parts, p, t_lo, t_hi, whole, none, ids_nx, n_tiles, lim, bt_row


@gluon.jit
def _tiles(bt_ptr, s, seq_len, t_lo, t_hi, LQ, stride_bt, BLOCK_N: gl.constexpr,
           CAUSAL: gl.constexpr):
    """(tile count, lim, the sequence's block table row) of a program's tokens [t_lo, t_hi).
    Tiles ending past lim hold a key some row cannot see."""
    n_tiles = gl.cdiv(t_hi - t_lo, BLOCK_N)
    lim = t_hi
    if CAUSAL:
        lim = gl.minimum(t_hi, seq_len - LQ + 1)
    return n_tiles, lim, bt_ptr + s * stride_bt


@gluon.jit
def _kv_base(bt_ptr, kc_ptr, vc_ptr, s, h, seq_len, t_lo, t_hi, LQ, stride_bt, stride_kb,
             stride_kh, stride_vb, stride_vh, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """What every form's tile loop addresses from: (:func:`_tiles`, this head's K and V bases,
    the block strides as int64 of their uint32)."""
    n_tiles, lim, bt_row = _tiles(bt_ptr, s, seq_len, t_lo, t_hi, LQ, stride_bt, BLOCK_N, CAUSAL)
    kc_h, vc_h, sb_k, sb_v = _head_bases(kc_ptr, vc_ptr, h, stride_kh, stride_vh, stride_kb,
                                         stride_vb)
    return n_tiles, lim, bt_row, kc_h, vc_h, sb_k, sb_v


@gluon.jit
def _issue_kv(k_slot, v_slot, kc_h, vc_h, ids, start, t_hi, sb_k, sb_v, stride_kt, stride_vt,
              k_tok, v_tok, r, dcol, PAGE: gl.constexpr, BLOCK_N: gl.constexpr):
    """K and V of the tile at ``start`` (block ids ``ids``) into their ring slots: one cp.async
    group."""
    _issue(k_slot, kc_h, ids, start, t_hi, sb_k, stride_kt, k_tok, r, dcol, PAGE, BLOCK_N)
    _issue(v_slot, vc_h, ids, start, t_hi, sb_v, stride_vt, v_tok, r, dcol, PAGE, BLOCK_N)
    async_copy.commit_group()


@gluon.jit
def _ring_start(q_smem, q_seq_ptr, k_ring, v_ring, kc_h, vc_h, bt_row, t_lo, t_hi, LQ, h,
                stride_qt, stride_qh, sb_k, sb_v, stride_kt, stride_vt, k_tok, v_tok, r, dcol,
                nblk, G: gl.constexpr, M: gl.constexpr, PAGE: gl.constexpr,
                BLOCK_N: gl.constexpr, LEAD: gl.constexpr, LD: gl.constexpr,
                GUARD: gl.constexpr):
    """The prologue of the cp.async ring: Q (its M rows: row r = (token r // G, head h * G +
    r % G), the extend kernel's rows for one query block of LQ tokens) joins tile 0's group,
    tiles 1 .. LEAD - 1 one group each. Returns the block ids of tile LEAD."""
    _load_q(q_smem, q_seq_ptr, 0, 0, LQ, h, stride_qt, stride_qh, dcol, G, G, M, LD)
    for i in gl.static_range(LEAD):
        start = t_lo + i * BLOCK_N
        _issue_kv(k_ring.index(i), v_ring.index(i), kc_h, vc_h,
                  _ids(bt_row, start, t_hi, r, PAGE, BLOCK_N, nblk, GUARD), start, t_hi, sb_k,
                  sb_v, stride_kt, stride_vt, k_tok, v_tok, r, dcol, PAGE, BLOCK_N)
    return _ids(bt_row, t_lo + LEAD * BLOCK_N, t_hi, r, PAGE, BLOCK_N, nblk, GUARD)


@gluon.jit
def _landed(n: gl.constexpr):
    """Wait until at most n of this thread's copy groups are in flight, then make the landed
    tiles visible to the wgmma (async proxy) and wait for every thread's copies."""
    async_copy.wait_group(n)
    fence_async_shared()
    gl.thread_barrier()
