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
``_decode_state.merge``; split programs park (m_p, l_p, acc_p) for the Triton combine, which
folds them in the same order: outputs are bitwise equal across launch shapes (batch invariance).
This kernel never serves a call half-way: the gate (:func:`unsupported`) does not depend on the
batch, so a sequence always runs the same kernel. Split programs let the combine launch early
(griddepcontrol.launch_dependents, as the Triton kernel; Gluon has no call for it: inline PTX).

Scope: sm_90 under triton 3.6, fp16/bf16 q, caches and out of one dtype, head_dim 64 or 128, a
cache whose head dim is contiguous (bhsd, bshd), any block size, G * Lq <= 64 rows,
partitions a multiple of the tile; no window, soft-cap, ALiBi, sinks or fp8 (those calls keep
the Triton kernel).

Forms (:func:`form`): this kernel for GQA; for one query row per KV head (MHA decode) the
``swap`` form (``_decode_gluon_swap.py``, the products transposed so the keys fill the wgmma's
M side), whose split programs take one partition each.

This module holds the launcher, the gate and the knobs; the kernel and its helpers are in
``_decode_gluon_kernel.py``.
"""
import os

import torch

from pagedattn._triton import interpreter_enabled
from pagedattn.triton_kernels import _decode_gluon_swap as S
from pagedattn.triton_kernels import _decode_gluon_ws as W
from pagedattn.triton_kernels import _replay
from pagedattn.triton_kernels._decode_gluon_kernel import decode_sm90
from pagedattn.triton_kernels._decode_gluon_ring import BLOCK_M, NUM_WARPS, STAMPS  # noqa: F401

# (BLOCK_N, NS): KV tokens per tile, ring slots. H200, session 12 call 1 (ab_gluon_8ee400b.md):
# of (64, 3), (32, 3), (32, 4) and (64, 2), (64, 2) was the fastest on 12 of the 20 issue rows and
# within 2 % of the fastest on 19
TILE = (64, 2)
_ALIGN = 8  # elements: every row a cp.async reads starts on 16 bytes
ENV_TILE = "PAGEDATTN_DECODE_GLUON_TILE"
ENV_EARLY = "PAGEDATTN_DECODE_GLUON_EARLY"
ENV_FORM = "PAGEDATTN_DECODE_GLUON_FORM"
ENV_PIPE = "PAGEDATTN_DECODE_GLUON_PIPE"
# an int64 CUDA tensor of >= STAMPS entries per program makes the next launches write %globaltimer
# stamps into it (scripts/decode_timeline.py); None: no stamps (the kernel has none compiled in)
TIMELINE = None


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
    """Which Gluon kernel serves a call of ``rows`` query rows per program (group x q_len).

    * ``swap`` (the default for one row: MHA decode): ``_decode_gluon_swap.decode_sm90_swap``,
      keys on the wgmma's M side;
    * ``rows`` (the default otherwise): :func:`decode_sm90`, the rows padded to the wgmma's 64 M
      rows;
    * ``ws``: ``_decode_gluon_ws.decode_sm90_ws``, the swap's arithmetic with a producer
      warpgroup issuing the copies (A/B runs only).

    ``PAGEDATTN_DECODE_GLUON_FORM`` (rows | swap | ws) overrides. ``swap`` and ``ws`` serve
    calls of <= 32 rows on tiles of a multiple of 64 tokens; others keep ``rows``. Depends on
    the model, q_len and the tile, never on the batch (the forms' bits differ).

    H200, 32/32 (MHA), D 128, blocks 16 and 64, CUDA graphs: swap, with one partition per split
    program (:func:`one_partition`), against rows was 1.002-1.020x on all ten issue rows in
    session 14 (ab_swap_5a2a7aa.md) and 1.004-1.021x in session 15 (medians of 3 rotated rounds,
    bench/results/2026-12-01-h200-s15/ab_mha_da8917c.md). On 32/8 (4 rows) it lost up to 13 %.
    """
    raw = os.environ.get(ENV_FORM, "") or ("swap" if rows == 1 else "rows")
    if raw not in ("rows", "swap", "ws"):
        raise ValueError(f"{ENV_FORM}={raw!r}: expected rows, swap or ws")
    if rows > 32 or block_n % 64:  # _decode_gluon_swap.MAX_ROWS; wgmma M
        return "rows"
    return raw


def one_partition(rows: int, block_n: int) -> bool:
    """Whether the split planner gives each program of the :func:`form` one partition. The swap
    form: H200 session 15 (ab_mha_da8917c.md), MHA (1, 32768): 127.5 us against 133.6 with the
    planner's 6 partitions per program (3 programs per SM), (8, 8192) 246.1 against 248.6;
    the rows form lost 3.4 % at (1, 32768) with one."""
    return form(rows, block_n) == "swap"


def balanced(rows: int, block_n: int) -> bool:
    """Whether the :func:`form` that serves ``rows`` has the balanced launch (``decode.py``;
    ``ws``, an A/B form, keeps the count rule)."""
    return form(rows, block_n) != "ws"


def occupancy(rows: int, block_n: int) -> tuple:
    """(warps, registers per thread at launch or None) of one program of the :func:`form` that
    serves ``rows``: what the split planner needs besides shared memory."""
    if form(rows, block_n) == "ws":
        return NUM_WARPS + W.P_WARPS.value, W.MAXNREG
    return NUM_WARPS, None


def smem_bytes(head_dim: int, block_n: int, ns: int, elem: int = 2, rows: int = BLOCK_M,
               bal: bool = False) -> int:
    """Shared memory of one program of the :func:`form` that serves ``rows`` (``bal``: of the
    balanced launch)."""
    which = form(rows, block_n)
    if which == "swap":  # (the plan's reductions reuse the rows' scratch)
        return S.smem_bytes(head_dim, block_n, ns, rows, elem, NUM_WARPS)
    if which == "ws":
        return W.smem_bytes(head_dim, block_n, ns, rows, elem)
    # Q and the K and V rings; the plan's cross-warp reductions (three int32 per warp: the fused
    # reductions of _decode_state)
    return (BLOCK_M + 2 * ns * block_n) * head_dim * elem + (12 * NUM_WARPS if bal else 0)


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
           one_pass, pdl, block_n, ns, bal, rec=None):
    """Run the kernel on ``grid`` (as decode.run's Triton launch) for a call the gate accepted,
    on the :func:`tile` (block_n, ns); pdl: the combine follows as a programmatic dependent
    launch (this grid lets it start); bal: the balanced launch's inputs (decode.run's: NB,
    FILL_N, SLOTS, FINE, BAL, NB_BLOCK); rec: an ``_replay.Recorder`` or None."""
    d = call.geom.head_dim
    stamps = TIMELINE
    if stamps is not None and stamps.numel() < STAMPS * grid[0] * grid[1] * grid[2]:
        raise ValueError(f"_decode_gluon.TIMELINE: {stamps.numel()} int64 < {STAMPS} per "
                         "program")
    which = form(rows, block_n)  # the form's own constexprs and launch options
    plan = (bal["NB"], bal["FILL_N"], bal["SLOTS"], bal["FINE"])
    flags = dict(BAL=bal["BAL"], NB_BLOCK=bal["NB_BLOCK"])
    if which == "rows":
        kernel, extra = decode_sm90, dict(PIPE=pipe(ns), **flags)
    elif which == "swap":
        kernel, extra = S.decode_sm90_swap, dict(NQ=S.rows_padded(rows), **flags)
    else:  # ws: 128 registers at launch, two 8-warp programs per SM; the count rule only
        kernel, extra = W.decode_sm90_ws, dict(NQ=S.rows_padded(rows), maxnreg=W.MAXNREG)
        assert not bal["BAL"], "the ws form has no balanced launch"
        plan = ()
    _replay.launch(
        rec, kernel, grid,
        q4, call.k_cache, call.v_cache, call.block_table, call.seq_lens, out4, lse, ws_ml, ws_o,
        stamps if stamps is not None else lse, float(call.opts.scale) * 1.4426950408889634,
        q4.shape[1], q4.shape[2], n_part_max, ppp, *plan,
        q4.stride(0), q4.stride(1), q4.stride(2), out4.stride(0), out4.stride(1),
        out4.stride(2), call.block_table.stride(0), ks.block, ks.token, ks.head, vs.block,
        vs.token, vs.head, G=group, R=rows, D=d, PAGE=call.geom.block_size, PART=part,
        BLOCK_N=block_n, NS=ns, ONE_PASS=one_pass, MULTI=ppp > 1, CAUSAL=q4.shape[1] > 1,
        RETURN_LSE=bool(call.return_lse), EARLY=early(), PDL=pdl,
        TIMELINE=stamps is not None, num_warps=NUM_WARPS, **extra)
