"""Extend attention for sm_90 in Gluon: a producer warpgroup gathers the pages, two consumer
warpgroups run the softmax of tile t under the P @ V wgmma of tile t-1.

Why: the Triton loop runs its two wgmmas and the softmax of a tile back to back, so a 128 x 128
tile costs the tensor time (~1.4 us at the matmul rate) plus the softmax (~0.8 us). Here each
consumer iteration issues S_t = Q K_t^T and O += P_{t-1} V_{t-1} together, waits for S_t only,
and computes the softmax of tile t while the P V wgmma runs (FA3's intra-warpgroup overlap); two
4-warp consumers of 64 rows each drift out of phase, so one's softmax also runs under the
other's wgmmas. Everything is explicit: the layouts, 3-slot shared-memory rings for K and V
filled by cp.async from the paged cache, mbarriers, the wgmma waits. On the H200 it reaches
67.0 / 60.1 / 50.4 / 50.4 % of the matmul rate on the four extend-table shapes, against
57.7 / 55.2 / 43.9 / 46.9 for the Triton kernel (docs/performance.md).

The kernel (``extend_fwd_sm90_ws``) is in ``_extend_gluon_ws.py``; this module holds the gate,
the launcher and the helpers it uses.

Scope (the launcher checks it: :func:`unsupported`): sm_90 under triton 3.6, fp16/bf16 q and
cache of the same dtype, head_dim 64 or 128, a cache whose head dim is contiguous (bhsd, bshd),
at least one 128-row block of queries, new keys read from the cache, no custom mask, window,
soft-cap, ALiBi or sinks. Grid and row order as ``extend._extend_fwd``: (query blocks
last-first, KV head, request); a program owns BLOCK_M = BLOCK_Q x GROUP_P rows (query token
major, GQA head minor).
"""

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy

from pagedattn import config
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
    if g.head_dim_v != g.head_dim:
        why.append(f"head_dim_v {g.head_dim_v} differs from head_dim {g.head_dim}")
    if g.block_size & (g.block_size - 1):
        why.append(f"block_size {g.block_size} not a power of 2")
    if call.k_new is not None or call.custom_mask is not None:
        why.append("k_new/v_new or a custom mask")
    if not call.causal:
        why.append("causal=False (a request's queries may outnumber its keys)")
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


def launch(call, ks, vs, group: int, group_p: int, max_q: int, lse):
    """Run the kernel for a call :func:`unsupported` accepted; writes call.out (and lse)."""
    q, g = call.q, call.geom
    ret = bool(call.return_lse)
    grid = (triton.cdiv(max_q, BLOCK_M // group_p), g.num_kv_heads, call.num_seqs)
    # the warp-specialized kernel imports this module's helpers: loaded here, not at the top
    from pagedattn.triton_kernels._extend_gluon_ws import extend_fwd_sm90_ws
    err = call.errors
    extend_fwd_sm90_ws[grid](
        q, call.k_cache, call.v_cache, call.out, lse, call.block_table, call.cu_seqlens_q,
        call.seq_lens, err if err is not None else call.seq_lens,
        float(call.opts.scale) * LOG2E, q.shape[0], call.block_table.shape[1], g.num_blocks,
        q.stride(0), q.stride(1),
        call.out.stride(0), call.out.stride(1), lse.stride(0) if ret else 0,
        lse.stride(1) if ret else 0, call.block_table.stride(0), ks.block, ks.token, ks.head,
        vs.block, vs.token, vs.head, GROUP=group, GROUP_P=group_p, HEAD_DIM=g.head_dim,
        PAGE=g.block_size, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=bool(call.causal),
        RETURN_LSE=ret, P_REGS=P_REGS, C_REGS=C_REGS, GUARD=config.get("PAGEDATTN_DEV_GUARDS"),
        HAS_ERR=err is not None, num_warps=NUM_WARPS // 2)


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
def _ids(bt_row, start, hi, r, PAGE: gl.constexpr, BLOCK_N: gl.constexpr, nblk=0,
         GUARD: gl.constexpr = False):
    """Block ids of the tile at ``start`` (a multiple of BLOCK_N; 0 past hi: never loaded): an
    int32 [N] per key row when pages are smaller than the tile, else one scalar. GUARD: an id
    outside [0, nblk) is replaced by one inside (one unsigned min), so no copy leaves the cache;
    the program learns of it from a scan of its table row and poisons its rows."""
    if PAGE < BLOCK_N:
        ids = gl.load(bt_row + (start // PAGE + r // PAGE), mask=start + r < hi, other=0)
    else:
        ids = gl.load(bt_row + start // PAGE, mask=start < hi, other=0)
    if GUARD:
        ids = gl.minimum(ids.to(gl.uint32), (nblk - 1).to(gl.uint32)).to(gl.int32)
    return ids


@gluon.jit
def _bad_ids(bt_row, pg_lo, pg_hi, nblk, num_warps: gl.constexpr):
    """Whether any table entry in [pg_lo, pg_hi) (the pages of the keys a program reads) holds an
    id outside [0, nblk) (a scalar int1), 32 x num_warps entries a load."""
    SCAN: gl.constexpr = 32 * num_warps
    SL: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    bad = pg_lo < 0
    for pg0 in range(pg_lo, pg_hi, SCAN):
        pg = pg0 + gl.arange(0, SCAN, layout=SL)
        ids = gl.load(bt_row + pg, mask=pg < pg_hi, other=0)
        flag = (ids.to(gl.uint32) >= nblk.to(gl.uint32)) & (pg < pg_hi)
        bad = bad | (gl.max(flag.to(gl.int32), 0) > 0)
    return bad


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
