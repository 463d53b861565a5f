"""Paged decode attention in Triton: one-pass (v1) and split-KV (v2) + combine
(docs/performance.md, "Paged decode").

Grid and work split
-------------------
One program per (KV head, sequence[, partition]) computes all G = Hq/Hkv query heads of the group
(times Lq query tokens for speculative decode): R = G*Lq rows padded to BLOCK_M >= 16 for
``tl.dot``, so each KV byte is read once per group. A sequence is cut into partitions of
PARTITION_SIZE tokens (512; 256 when G > 15; ``partition_size=`` overrides); each partition runs
the online softmax over KV tiles of BLOCK_N tokens and yields (m_p, l_p, acc_p), and the
partitions are merged in order by ``_decode_state.merge``, an online merge: with M' = max(M, m_p),
L' = L exp2(M - M') + l_p exp2(m_p - M') and likewise for the output accumulator.

Two launch shapes evaluate exactly this arithmetic:

* split (v2): grid (Hkv, B, P_max), one program per partition; a sequence with one partition
  writes out/lse directly, a longer one parks (m_p, l_p, acc_p) in a float32 workspace and a
  combine launch on (Hkv, B, R) merges them. Used when B * Hkv does not fill the GPU.
* one-pass (v1): grid (Hkv, B); the program streams its whole sequence through ONE pipelined
  tile loop and merges each partition's state into registers at the partition's last tile (no
  workspace, no second launch).
* balanced (the default once a sequence can span partitions): grid (Hkv, B + a bound from
  counts); every program reads the batch's lengths and computes the same plan
  (``_decode_state.plan``). A sequence runs whole (the one-pass loop, out written directly)
  or in shares of ppp partitions (the split loop, parked for the combine); ppp follows the
  batch's total work, so a long sequence among short ones is cut across many programs.
  Program y < B runs sequence y's first share; the others take the batch's later shares in
  order (``extra_share``), so the grid does not grow with the table's width. The Gluon
  forms run the same plan. The count rule (one pass when B * Hkv >= dispatch.core.FILL * SMs,
  else split with partitions per program from the table's width) serves grids past CUDA's
  limit on axis 1.

NOTE batch invariance: split points depend only on the sequence and the partition size (never
on the batch); every launch shape runs the same tile code on the same tiles and the same merge
(explicit FMAs) in the same partition order, and a partition with no key is an exact no-op of
the merge. So a sequence's output is bitwise identical whatever else is in the batch and
whichever launch shape the batch selects (the balanced plan reads the lengths: it moves
work between programs, never a split point).

This module is the launcher (launch-shape rules, workspace); the tile configs are in
``_decode_configs.py``, the ``@triton.jit`` kernels in ``_decode_kernels.py`` (tile loop, decode
kernel), ``_decode_state.py`` (merge, park, the balanced plan) and ``_decode_combine.py``. On
sm_90 under triton 3.6 a Gluon kernel (``_decode_gluon.py``, :func:`variant`) serves MHA calls
and calls on pages of >= 64 tokens: the same grids, plan, workspace and merge, so it shares the
combine and the batch-invariance argument.
"""
import torch
import triton

from pagedattn import config
from pagedattn import layouts as L
from pagedattn._triton import next_pow2
from pagedattn.dispatch import core as _dispatch
from pagedattn.reference import FP8_DTYPES
from pagedattn.triton_kernels import _replay
from pagedattn.triton_kernels._decode_configs import (MAX_ROWS, _combine_config, _config,
                                                      bal_maxnreg,
                                                      _f16_dot, _lazy_rowsum, fill_n)
from pagedattn.triton_kernels._decode_combine import _combine_kernel
from pagedattn.triton_kernels._decode_kernels import _decode_kernel, gdc_wait

FORCE_MODE = None  # tests: one_pass | split | balance | count | None (PAGEDATTN_DEV_DECODE_MODE)
# tests: (FILL_N, SLOTS, FINE) of the balanced launch (_balance), else None (the device's)
BALANCE = None
# tests: partitions per split program of the count rule (_parts_per_program), else None (the rule)
PPP = None
# sequence lengths per load of _decode_state.plan: the batch size rounded up to a power of 2
# within these bounds (one load up to 512 sequences; 256 at the least, so one specialisation
# serves every batch up to it; offline sm_90, 1024 takes the balanced combine from 120 to 167
# registers)
NB_BLOCK = (256, 512)
# the Gluon swap form's balanced shares: cdiv(T, SWAP_GRAIN x FINE x one wave) partitions on every
# batch. On the H200 (32/32, block 16) the grain 16 x one wave against 4 is 1.033x at (8, 8192),
# 1.007x at (1, 32768), 0.997x and 0.991x at (64, 4096) and (256, 2048)
SWAP_GRAIN = 4
# a ragged batch's shares are a quarter of a slot's mean work
FINE = 4
# tests: a float every new workspace is filled with (a partition never parked then shows in the
# output), else None
WS_FILL = None


def _pdl(device):
    """Programmatic dependent launch of the combine (NVIDIA sm_90+): it saves 0.4-0.7 us."""
    if device.type != "cuda" or getattr(torch.version, "hip", None) or gdc_wait is None:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def _num_sms(device):
    if device.type != "cuda":
        return 1  # interpreter: any rule is fine; tests force both modes
    return torch.cuda.get_device_properties(device).multi_processor_count


def default_partition_size(group):
    """PARTITION_SIZE rule (docs/dispatch.md): 512, 256 when the GQA group is larger than 15."""
    return 256 if group > 15 else 512


def unsupported(q=None, k_cache=None, geom=None, **_):
    """Reasons this kernel cannot serve the call ([] = it can): none; every head dim the public
    op accepts (1..576, K and V apart), block size, group and q_len runs (:func:`head_tiles`,
    :func:`_head_split`)."""
    return []


# K widths past this take a power-of-2 main tile and a tail tile instead of one padded tile
TAIL_FROM = 256
# query rows one program holds when a head dim is wider than TAIL_FROM (q and acc tiles of
# 576 and 512 columns: 16 rows is what SGLang's MLA decode holds, BLOCK_H 16)
WIDE_ROWS = 16


def head_tiles(d: int):
    """(BLOCK_D, BLOCK_DT, has_tail) of a K head dim d: one tile of the next power of 2 >= 16,
    or for d > TAIL_FROM that is not a power of 2, the largest power of 2 below d and a tail tile
    of the next power of 2 >= 16 of the rest when the two are narrower (576 = 512 + 64, not
    1024). Masked lanes are never read."""
    full = max(16, next_pow2(d))
    if d > TAIL_FROM and full != d:
        main = full // 2
        tail = max(16, next_pow2(d - main))
        if main + tail < full:
            return main, tail, True
    return full, 16, False


def _head_split(rows: int, width: int):
    """(HSPLIT, R): programs per KV head and rows each when the group's rows do not fit one
    program (more than MAX_ROWS, or more than WIDE_ROWS with tiles wider than TAIL_FROM
    columns). Every chunk holds the same number of rows; a function of the model only."""
    cap = WIDE_ROWS if width > TAIL_FROM else MAX_ROWS
    hsplit = -(-rows // cap)
    return hsplit, -(-rows // hsplit)


def _v_is_k(call, ks, vs, block_d, has_tail):
    """Whether V is the K cache's first head_dim_v = BLOCK_D columns (MLA's latent cache with
    v_cache=None, or an equal view): the kernel then takes V from the K tile it loaded."""
    g = call.geom
    return (has_tail and g.head_dim_v == block_d and not ks.dim_hi
            and call.v_cache.data_ptr() == call.k_cache.data_ptr()
            and call.v_cache.dtype == call.k_cache.dtype
            and (ks.block, ks.token, ks.head, ks.dim_lo) == (vs.block, vs.token, vs.head, vs.dim_lo))


def _slots(smem, warps, device, regs=None):
    """Resident programs of one wave (``smem``, warps, ``regs``: one program's shared memory,
    warps and, where they may bound it, registers per thread)."""
    props = torch.cuda.get_device_properties(device)
    limit = getattr(props, "shared_memory_per_multiprocessor", 0) or 228 * 1024
    per_sm = min(limit // max(smem, 1), 64 // warps)
    if regs:
        per_sm = min(per_sm, 65536 // (regs * 32 * warps))
    return props.multi_processor_count * max(1, per_sm)


def _balance(smem, warps, device, programs, swap):
    """(FILL_N, SLOTS, FINE) of the balanced launch (``_decode_state.plan``) of ``programs``
    (B x Hkv) programs (``swap``: the Gluon swap form's): FILL_N from ``fill_n``,
    SLOTS = :func:`_slots` (one wave), FINE = :data:`FINE`. ``BALANCE`` overrides (tests)."""
    if BALANCE is not None:
        return BALANCE
    if device.type != "cuda":
        return _dispatch.FILL, 4, FINE  # interpreter: tests set BALANCE for the cases they need
    slots = _slots(smem, warps, device)
    return fill_n(programs, _num_sms(device), slots, swap, _dispatch.FILL), slots, FINE


def _balance_extra(n_part_max, nb, hkv, slots):
    """The balanced grid's extra programs per KV head (``slots``: SLOTS x FINE): every share past
    a sequence's first fits, whatever the lengths. A split sequence of n partitions has
    cdiv(n, ppp) - 1 <= n / ppp of them, and ppp >= Hkv N / slots (N: the batch's partitions),
    so they sum to at most slots / Hkv; and to at most n_part_max - 1 per sequence."""
    return max(0, min(slots // hkv, nb * (n_part_max - 1)))


def _parts_per_program(programs, n_part_max, smem, warps, device, regs=None, one=False):
    """Partitions per split program of the count rule: as few as keep the split grid in one wave
    of resident programs (``smem``, warps, ``regs``: one program's shared memory, warps and,
    where they may bound it, registers per thread); ``one``: one (``_decode_gluon.one_partition``).
    Same bits for any value: partition states and the combine's order do not change. Never fewer
    than keep the grid's partition axis within 65535 (CUDA's limit)."""
    if PPP is not None:
        ppp = PPP
    elif device.type != "cuda" or one:
        ppp = 1
    else:
        ppp = -(-programs // _slots(smem, warps, device, regs))
    return max(1, min(ppp, n_part_max), -(-n_part_max // 65535))


GLUON_TRITON = "3.6."  # the triton the Gluon kernel is written and GPU-tested for (API churn)


def variant() -> str:
    """Which kernel serves a decode call (``PAGEDATTN_DEV_DECODE_KERNEL``, internal):

    * ``auto`` (default): the Gluon sm_90 kernel (``_decode_gluon``) for the calls its gate
      accepts that are MHA (one query head per KV head) or whose pages hold at least one of its
      KV tiles (block size >= 64), the Triton kernel for everything else;
    * ``gluon``: the Gluon kernel wherever its gate accepts the call;
    * ``triton``: always the Triton kernel.

    The choice depends on the model (group size), the cache (block size, dtype, layout) and the
    options, never on the batch, so batch invariance holds. On the H200 (CUDA graphs) the Gluon
    kernel is 1.003-1.039x the Triton kernel's speed on MHA rows and 0.992-1.029x on 32/8 rows
    with 64-token pages, but 0.968x at (1, 32768) and 0.975x at (128, 512) on 32/8 with 16-token
    pages: GQA with pages shorter than its tile (several block ids per tile) keeps the Triton
    kernel (docs/performance.md).
    """
    return config.get("PAGEDATTN_DEV_DECODE_KERNEL")


def gluon_kernel():
    """The Gluon decode module (``_decode_gluon``), or None under another triton."""
    if not triton.__version__.startswith(GLUON_TRITON):
        return None
    from pagedattn.triton_kernels import _decode_gluon
    return _decode_gluon


def _gluon(call, ks, vs, rows, part, device):
    """(the Gluon module, its (BLOCK_N, NS) tile) when it serves this call (:func:`variant`),
    else (None, None): the Triton kernel runs."""
    which = variant()
    if which == "triton" or device.type != "cuda":
        return None, None
    gk = gluon_kernel()
    if gk is None:
        return None, None
    tile = gk.tile()
    mha = call.q.shape[-2] == call.geom.num_kv_heads
    if which == "auto" and not (mha or call.geom.block_size >= tile[0]):
        return None, None
    return (None, None) if gk.unsupported(call, ks, vs, rows, part, tile[0]) else (gk, tile)


MODES = ("one_pass", "split", "balance", "count")


def _mode(num_seqs, num_kv_heads, device, n_part_max, count=False):
    """The launch shape: one_pass or split when forced (FORCE_MODE, PAGEDATTN_DEV_DECODE_MODE); else
    one pass when every sequence fits one partition; else balanced; ``count`` (forced, or the
    argument: a Gluon form with no balanced launch, a grid past CUDA's limit) takes the count
    rule: one pass when the (head, sequence) programs alone make dispatch.core.FILL waves, else
    split. Every launch shape gives bitwise-equal outputs."""
    forced = FORCE_MODE or config.get("PAGEDATTN_DEV_DECODE_MODE")
    forced = None if forced == "auto" else forced
    if forced not in (None,) + MODES:
        raise ValueError(f"decode.FORCE_MODE: expected one of {', '.join(MODES)}, got "
                         f"{forced!r}")
    if forced in ("one_pass", "split"):
        return forced
    if n_part_max == 1:
        return "one_pass"
    if forced != "count" and not count:
        return "balance"
    return "one_pass" if num_seqs * num_kv_heads >= _dispatch.FILL * _num_sms(device) else "split"


def run(call):
    """Launch the decode kernel(s) for a validated DecodeCall; write call.out. On a GPU, a call
    whose metadata was seen before relaunches that call's recorded launches (``_replay.py``).

    Returns float32 lse shaped ``q.shape[:-1]`` (natural log) when call.return_lse, else None.
    """
    q, out, g, o = call.q, call.out, call.geom, call.opts
    dev = q.device
    key = None
    # eager fast path: this metadata's launches, recorded (_replay.py)
    if _replay.enabled(dev):
        cur = torch.cuda.current_device()
        key = _replay.decode_key(call, (FORCE_MODE, PPP, BALANCE), cur)
        rep = _replay.lookup(key)
        if rep is not None:
            stream = torch._C._cuda_getCurrentRawStream(cur)  # JITFunction.run's stream
            vals = rep(_replay.decode_tensors(call), dev, stream)
            return vals["lse"].view(q.shape[:-1]) if call.return_lse else None
    q4 = q if q.dim() == 4 else q.unsqueeze(1)  # views: strides kept
    out4 = out if out.dim() == 4 else out.unsqueeze(1)
    nb, lq, hq, d = q4.shape
    dv = g.head_dim_v
    hkv, bs = g.num_kv_heads, g.block_size
    group = hq // hkv
    rows = group * lq
    part = call.partition_size or default_partition_size(group)
    block_d, block_dt, has_tail = head_tiles(d)
    block_dv = max(16, next_pow2(dv))
    width = max(block_d + (block_dt if has_tail else 0), block_dv)
    hsplit, rc = _head_split(rows, width)  # rc: rows per program
    hkv_p = hkv * hsplit  # programs per sequence on axis 0
    block_m = max(16, next_pow2(rc))
    cfg = _config(width, rc, call.k_cache.element_size(), dev)
    block_n, num_warps, num_stages = cfg
    if dev.type != "cuda":  # interpreter: small tiles so tiny test sequences still span several
        block_n = 16
    block_n = min(block_n, max(16, part))
    n_part_max = max(1, triton.cdiv(call.block_table.shape[1] * bs, part))  # host bound, no sync
    c_unroll, c_warps, c_dsplit, c_stages = _combine_config(block_dv, n_part_max)
    ks, vs = L.k_strides(call.k_cache, call.layout), L.v_strides(call.v_cache, call.layout)
    f32 = dict(dtype=torch.float32, device=dev)
    dummy = torch.empty(1, **f32)  # the pointer of every disabled input/output: never touched
    lse = torch.empty((nb, lq, hq), **f32) if call.return_lse else dummy
    if n_part_max > 1:
        ws_ml = torch.empty((nb, hkv_p, n_part_max, rc, 2), **f32)
        ws_o = torch.empty((nb, hkv_p, n_part_max, rc, dv), **f32)
        if WS_FILL is not None:
            ws_ml.fill_(WS_FILL)
            ws_o.fill_(WS_FILL)
    else:
        ws_ml = ws_o = dummy  # every sequence fits one partition
    rec = None if key is None else _replay.decode_recorder(call, q4, out4, lse, ws_ml, ws_o,
                                                            dummy)
    has_kv_scale = call.k_cache.dtype in FP8_DTYPES and o.k_scale is not None
    err = call.errors
    common = dict(G=group, R=rc, D=d, BLOCK_D=block_d, HSPLIT=hsplit,
                  HAS_SINK=o.sinks is not None, HAS_KV_SCALE=has_kv_scale,
                  RETURN_LSE=call.return_lse, GUARD=config.get("PAGEDATTN_DEV_GUARDS"),
                  HAS_ERR=err is not None)
    # grid: (KV head, sequence, partition); one-pass folds the partition loop into the program
    gk, g_tile = (None, None) if hsplit > 1 else _gluon(call, ks, vs, rows, part, dev)
    mode = _mode(nb, hkv_p, dev, n_part_max)
    # partition states go through the workspace
    parked = mode in ("split", "balance") and n_part_max > 1
    one = False
    if gk is not None:
        smem = gk.smem_bytes(d, *g_tile, rows=rows, bal=mode == "balance")
        warps, regs = gk.occupancy(rows, g_tile[0])
        one = gk.one_partition(rows, g_tile[0])
    else:
        smem = (num_stages * block_n * width * 2 * call.k_cache.element_size()
                + block_m * width * 2)
        warps, regs = num_warps, None
    ppp, fill_at, slots, fine = 1, 1, 1, 1
    if mode == "balance":
        fill_at, slots, fine = _balance(smem, warps, dev, nb * hkv_p, one)
        if one:  # the swap form: every batch takes a finer grain (SWAP_GRAIN, FINE)
            slots, fine = slots * fine * SWAP_GRAIN, 1
        grid = (hkv_p, nb + _balance_extra(n_part_max, nb, hkv_p, slots * fine), 1)
        if grid[1] > 65535:  # CUDA's limit on axis 1: the count rule
            mode = _mode(nb, hkv_p, dev, n_part_max, True)
            parked = mode == "split"
    if parked and mode != "balance":
        ppp = _parts_per_program(hkv_p * nb * n_part_max, n_part_max, smem, warps, dev, regs, one)
    if mode != "balance":
        grid = (hkv_p, nb, 1 if mode == "one_pass" else triton.cdiv(n_part_max, ppp))
    bal = dict(NB=nb, FILL_N=fill_at, SLOTS=slots, FINE=fine, BAL=mode == "balance",
               NB_BLOCK=min(max(NB_BLOCK[0], next_pow2(nb)), NB_BLOCK[1]))
    pdl = parked and _pdl(dev)
    if gk is not None:
        gk.launch(call, ks, vs, q4, out4, lse, ws_ml, ws_o, grid, group, rows, part, n_part_max,
                  ppp, mode == "one_pass", pdl, *g_tile, bal, rec=rec)
    else:
        # the balanced launch fits the wave it was planned for (_decode_configs._BAL_MAXNREG)
        maxnreg = bal_maxnreg(width, rc, call.k_cache.element_size()) \
            if mode == "balance" and dev.type == "cuda" else None
        heads = dict(DV=dv, BLOCK_DV=block_dv, HAS_TAIL=has_tail, BLOCK_DT=block_dt,
                     V_IS_K=_v_is_k(call, ks, vs, block_d, has_tail))
        _triton_launch(call, q4, out4, lse, ws_ml, ws_o, dummy, ks, vs, grid, part, n_part_max,
                       ppp, mode, pdl, has_kv_scale, block_m, block_n, num_warps, num_stages,
                       {**common, **heads}, bal, rec, maxnreg)
    if parked:
        # grid: (KV head, sequence, row x column block); single-partition sequences exit at once
        _replay.launch(
            rec, _combine_kernel, (hkv_p, nb, rc * c_dsplit),
            seq_lens_ptr=call.seq_lens, v_scale_ptr=o.v_scale if has_kv_scale else dummy,
            sinks_ptr=o.sinks if o.sinks is not None else dummy, out_ptr=out4, lse_ptr=lse,
            ws_ml_ptr=ws_ml, ws_o_ptr=ws_o, Hq=hq,
            LQ=lq, P=n_part_max, PART=part, BT_W=call.block_table.shape[1], BS=bs,
            stride_ob=out4.stride(0), stride_ot=out4.stride(1), stride_oh=out4.stride(2),
            UNROLL=c_unroll, DSPLIT=c_dsplit, C_STAGES=c_stages, PDL=pdl, num_warps=c_warps,
            launch_pdl=pdl, **bal,
            **{**{k: v for k, v in common.items() if k != "HAS_ERR"}, "D": dv, "BLOCK_D": block_dv})
    if rec is not None and (replay := rec.replay()) is not None:
        _replay.store(key, replay)
    return lse.view(q.shape[:-1]) if call.return_lse else None


def _triton_launch(call, q4, out4, lse, ws_ml, ws_o, dummy, ks, vs, grid, part, n_part_max, ppp,
                   mode, pdl, has_kv_scale, block_m, block_n, num_warps, num_stages, common, bal,
                   rec, maxnreg=None):
    """The Triton decode kernel (``_decode_kernels._decode_kernel``) on ``grid``; rec: an
    ``_replay.Recorder`` or None; maxnreg: ptxas's register cap, or None."""
    q, o, bs = call.q, call.opts, call.geom.block_size
    lq, hq, d = q4.shape[1], q4.shape[2], q4.shape[3]
    one_block = bs % block_n == 0 and part % block_n == 0
    _replay.launch(
        rec, _decode_kernel, grid,
        q_ptr=q4, k_ptr=call.k_cache, v_ptr=call.v_cache, block_table_ptr=call.block_table,
        seq_lens_ptr=call.seq_lens,
        k_scale_ptr=o.k_scale if has_kv_scale else dummy,
        v_scale_ptr=o.v_scale if has_kv_scale else dummy,
        slopes_ptr=o.alibi_slopes if o.alibi_slopes is not None else dummy,
        sinks_ptr=o.sinks if o.sinks is not None else dummy,
        out_ptr=out4, lse_ptr=lse, ws_ml_ptr=ws_ml, ws_o_ptr=ws_o,
        err_ptr=call.errors if call.errors is not None else dummy, scale=float(o.scale),
        cap=float(o.logit_cap or 1.0),
        window=int(o.sliding_window or 0), Hq=hq, LQ=lq, P=n_part_max,
        BT_W=call.block_table.shape[1], PART=part, NBLK=call.geom.num_blocks,
        stride_qb=q4.stride(0), stride_qt=q4.stride(1), stride_qh=q4.stride(2),
        stride_ob=out4.stride(0), stride_ot=out4.stride(1), stride_oh=out4.stride(2),
        stride_bt=call.block_table.stride(0),
        stride_kb=ks.block, stride_kt=ks.token, stride_kh=ks.head, stride_kdh=ks.dim_hi,
        stride_kdl=ks.dim_lo,
        stride_vb=vs.block, stride_vt=vs.token, stride_vh=vs.head, stride_vdh=vs.dim_hi,
        stride_vdl=vs.dim_lo,
        BS=bs, K_X=ks.x, K_SPLIT=ks.x < d, K_LO_ONE=ks.dim_lo == 1, V_LO_ONE=vs.dim_lo == 1,
        BLOCK_N=block_n, ONE_BLOCK=one_block, ONE_PASS=mode == "one_pass", MULTI=ppp > 1,
        LAZY_L=_lazy_rowsum(block_m, block_n), PDL=pdl,
        PPP=ppp, CAUSAL=lq > 1,
        HAS_WINDOW=o.sliding_window is not None, HAS_CAP=o.logit_cap is not None,
        HAS_ALIBI=o.alibi_slopes is not None, IEEE=q.dtype == torch.float32,
        F16_DOT=_f16_dot(q.dtype, call.k_cache.dtype, q.device), BLOCK_M=block_m,
        num_warps=num_warps, num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {}),
        **bal, **common)
