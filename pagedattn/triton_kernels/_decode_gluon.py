"""Paged decode for sm_90 in Gluon: one warpgroup, wgmma over 64 rows, a cp.async page ring.

Why: the Triton decode loop (``_decode_kernels._attend``) runs mma.sync on 16-row tiles with its
KV tile split over the 4 warps, so every tile takes cross-warp max and sum reductions and a P
layout change through shared memory. Here the group's G * Lq rows are zero-padded to the 64 rows
of one warpgroup wgmma: S = Q K_t^T reads K straight from the ring, each warp owns 16 rows, so
the softmax reductions stay inside a warp, P feeds the P V wgmma from registers and V is read
from the ring too. The tensor work is 64 / (G Lq) times the useful one, well under the tile's
memory time on the H200. Measured there: level with the Triton kernel on the GQA one-pass rows,
steadier and up to 4 % faster on MHA and on 64-token pages, 2-3 % slower on GQA split rows with
16-token pages (``decode.variant`` picks by that).

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

Forms (:func:`form`): ``rows`` (``_decode_gluon_kernel.decode_sm90``) for GQA; for one query row
per KV head (MHA decode) the ``swap`` form (``_decode_gluon_swap.py``, the products transposed so
the keys fill the wgmma's M side), whose split programs take one partition each.
"""
import torch

from pagedattn import config
from pagedattn._triton import interpreter_enabled
from pagedattn.triton_kernels import _decode_gluon_swap as S
from pagedattn.triton_kernels import _replay
from pagedattn.triton_kernels._decode_gluon_kernel import decode_sm90
from pagedattn.triton_kernels._decode_gluon_ring import BLOCK_M, NUM_WARPS

# (BLOCK_N, NS): KV tokens per tile, ring slots. On the H200, of (64, 3), (32, 3), (32, 4) and
# (64, 2), (64, 2) is the fastest on 12 of the 20 decode-table rows and within 2 % of the
# fastest on 19
TILE = (64, 2)
_ALIGN = 8  # elements: every row a cp.async reads starts on 16 bytes


def tile() -> tuple:
    """(BLOCK_N, NS) of the Gluon decode kernels."""
    return TILE


def form(rows: int, block_n: int) -> str:
    """Which Gluon kernel serves a call of ``rows`` query rows per program (group x q_len):
    ``swap`` (``_decode_gluon_swap.decode_sm90_swap``, keys on the wgmma's M side) for one row
    (MHA decode) on tiles of a multiple of 64 tokens, ``rows`` (:func:`decode_sm90`, the rows
    padded to the wgmma's 64 M rows) otherwise. Depends on the model, q_len and the tile, never
    on the batch (the forms' bits differ). On the H200 (32/32, D 128, blocks 16 and 64, CUDA
    graphs) swap, with one partition per split program (:func:`one_partition`), is
    1.002-1.021x rows on every MHA row; on 32/8 (4 rows) it loses up to 13 %."""
    return "swap" if rows == 1 and block_n % 64 == 0 else "rows"


def one_partition(rows: int, block_n: int) -> bool:
    """Whether the split planner gives each program of the :func:`form` one partition: the swap
    form (H200, MHA (1, 32768): 127.5 us against 133.6 with 6 partitions per program; the rows
    form loses 3.4 % there with one)."""
    return form(rows, block_n) == "swap"


def occupancy(rows: int, block_n: int) -> tuple:
    """(warps, registers per thread at launch or None) of one program: what the split planner
    needs besides shared memory."""
    return NUM_WARPS, None


def smem_bytes(head_dim: int, block_n: int, ns: int, elem: int = 2, rows: int = BLOCK_M,
               bal: bool = False) -> int:
    """Shared memory of one program of the :func:`form` that serves ``rows`` (``bal``: of the
    balanced launch)."""
    if form(rows, block_n) == "swap":  # (the plan's reductions reuse the rows' scratch)
        return S.smem_bytes(head_dim, block_n, ns, rows, elem, NUM_WARPS)
    # Q and the K and V rings; the cross-warp reductions: the plan's (three int32 per warp: the
    # fused reductions of _decode_state), else the guards' scan of the table row (one per warp)
    return (BLOCK_M + 2 * ns * block_n) * head_dim * elem + (12 if bal else 4) * NUM_WARPS


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
    if g.head_dim_v != g.head_dim:
        why.append(f"head_dim_v {g.head_dim_v} differs from head_dim {g.head_dim}")
    if g.block_size & (g.block_size - 1):
        why.append(f"block_size {g.block_size} not a power of 2")
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
    flags = dict(BAL=bal["BAL"], NB_BLOCK=bal["NB_BLOCK"])
    if form(rows, block_n) == "rows":
        kernel, extra = decode_sm90, flags
    else:
        kernel, extra = S.decode_sm90_swap, dict(NQ=S.rows_padded(rows), **flags)
    err = call.errors
    _replay.launch(
        rec, kernel, grid,
        q4, call.k_cache, call.v_cache, call.block_table, call.seq_lens, out4, lse, ws_ml, ws_o,
        err if err is not None else lse, float(call.opts.scale) * 1.4426950408889634,
        q4.shape[1], q4.shape[2], n_part_max, ppp, bal["NB"], bal["FILL_N"], bal["SLOTS"],
        bal["FINE"], call.block_table.shape[1], call.geom.num_blocks, q4.stride(0), q4.stride(1),
        q4.stride(2), out4.stride(0), out4.stride(1),
        out4.stride(2), call.block_table.stride(0), ks.block, ks.token, ks.head, vs.block,
        vs.token, vs.head, G=group, R=rows, D=d, PAGE=call.geom.block_size, PART=part,
        BLOCK_N=block_n, NS=ns, ONE_PASS=one_pass, MULTI=ppp > 1, CAUSAL=q4.shape[1] > 1,
        RETURN_LSE=bool(call.return_lse), PDL=pdl, GUARD=config.get("PAGEDATTN_DEV_GUARDS"),
        HAS_ERR=err is not None, num_warps=NUM_WARPS, **extra)
