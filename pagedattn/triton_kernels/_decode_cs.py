"""The column-split tile loop of the Triton decode kernel (``SUB > 1``, ``decode._config``).

A KV tile of BLOCK_N keys is SUB sub-tiles of SN = BLOCK_N / SUB keys, and sub-tile b belongs to
sub-stream b: its own online-softmax state (m, l, acc). Both dots are batched over the
sub-streams ([SUB, BLOCK_M, BLOCK_D] x [SUB, BLOCK_D, SN], [SUB, BLOCK_M, SN] x [SUB, SN,
BLOCK_D]); Triton puts one warp on each batch entry (sm_90, triton 3.6: mma.sync, warpsPerCTA
[SUB, 1, 1]), so the row max, the row sum and P's change from accumulator to operand layout
stay inside a warp: no cross-warp step per tile. The plain loop (``_decode_kernels._attend``)
splits S's columns over the warps and crosses them twice per tile (the row statistics, P).

At a partition's end the SUB states are folded into one (:func:`_fold`, the only cross-warp
step), and from there on everything is the plain kernel's: the one-pass merge, the parked
partition states, the combine. Both launch shapes fold the same sub-streams with the same code,
so batch invariance holds; the bits differ from the plain loop's (another summation order), which
is why SUB belongs to the per-model config, never to the batch.

Measured slower, kept for A/B runs: H200, session 16 (bench/results/2026-12-02-h200-s16), 32/8
rows, 0.70-0.81x (64, 4, 3, 4) and 0.85-0.93x (32, 2, 3, 2) the plain loop. Each warp holds a
whole BLOCK_M x BLOCK_D accumulator (3/4 padding for a group of 4): 255 registers, 2 programs
per SM.
"""
import triton
import triton.language as tl

from pagedattn.triton_kernels._common import alibi_bias, kv_offset, soft_cap, visible
from pagedattn.triton_kernels._decode_state import merge, park


@triton.jit
def cs_block_ids(bt_row_ptr, start, hi, b3, n3, BS: tl.constexpr, SN: tl.constexpr):
    """int64 block ids of the tile at ``start``: [SUB, 1, 1] when a sub-tile lies inside one
    block (BS % SN == 0), else [SUB, SN, 1]. Masked to keys < hi, as ``_tile_block_ids``."""
    if BS % SN == 0:
        j = start + b3 * SN
    else:
        j = start + b3 * SN + n3
    return tl.load(bt_row_ptr + j // BS, mask=j < hi, other=0).to(tl.int64)


@triton.jit
def _fold(m3, l3, acc3):
    """One partition's sub-stream states (m3, l3 [SUB, M]; acc3 [SUB, M, D]) -> its state (m [M],
    l [M], acc [M, D]). Empty sub-streams (m = -inf) weigh 0; all empty gives the neutral state."""
    m = tl.max(m3, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(m3 - m_safe[None, :])  # [SUB, M]
    return m, tl.sum(l3 * w, axis=0), tl.sum(acc3 * w[:, :, None], axis=0)


@triton.jit
def attend_cs(q, t_lo, t_hi, blk_n, h, pos, slope2, d, d_mask, bt_row_ptr, k_ptr, v_ptr,
              qk_scale, cap, window, ws_ml_ptr, ws_o_ptr, ws_row0, rows, row_ok, n_parts,
              stride_kb: tl.int64, stride_kt: tl.int64, stride_kh: tl.int64,
              stride_kdh: tl.int64, stride_kdl: tl.int64,
              stride_vb: tl.int64, stride_vt: tl.int64, stride_vh: tl.int64,
              stride_vdh: tl.int64, stride_vdl: tl.int64,
              K_X: tl.constexpr, K_SPLIT: tl.constexpr, K_LO_ONE: tl.constexpr,
              V_LO_ONE: tl.constexpr, BS: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SUB: tl.constexpr,
              PART: tl.constexpr, ONE_PASS: tl.constexpr, PARK: tl.constexpr, R: tl.constexpr,
              D: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
              HAS_CAP: tl.constexpr, HAS_ALIBI: tl.constexpr, IEEE: tl.constexpr):
    """``_decode_kernels._attend`` (same arguments, same returns) with SUB sub-streams per tile.
    BLOCK_N divides PART (the launcher's gate), so every tile lies inside one partition.
    blk_n: the first tile's ids (:func:`cs_block_ids`)."""
    SN: tl.constexpr = BLOCK_N // SUB
    b3 = tl.arange(0, SUB)[:, None, None]
    n3 = tl.arange(0, SN)[None, :, None]
    d3 = d[None, None, :]
    dm3 = d_mask[None, None, :]
    jr = tl.arange(0, SUB)[:, None, None] * SN + tl.arange(0, SN)[None, None, :]  # [SUB, 1, SN]
    pos3 = pos[None, :, None]
    slope3 = slope2[None, :, None]
    q3 = tl.broadcast_to(q[None, :, :], (SUB, BLOCK_M, BLOCK_D))
    m3 = tl.full((SUB, BLOCK_M), float("-inf"), tl.float32)
    l3 = tl.zeros((SUB, BLOCK_M), tl.float32)
    acc3 = tl.zeros((SUB, BLOCK_M, BLOCK_D), tl.float32)
    big_m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    big_l = tl.zeros((BLOCK_M,), tl.float32)
    big_a = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for start in range(t_lo, t_hi, BLOCK_N):
        j3 = start + b3 * SN + n3  # [SUB, SN, 1] key positions
        kv_mask = (j3 < t_hi) & dm3
        tok = (j3 % BS).to(tl.int64)
        k_off = kv_offset(blk_n, tok, h, d3, stride_kb, stride_kt, stride_kh, stride_kdh,
                          stride_kdl, K_X, K_SPLIT, K_LO_ONE)
        k = tl.load(k_ptr + k_off, mask=kv_mask, other=0.0).to(q.dtype)  # [SUB, SN, BLOCK_D]
        if IEEE:
            s = tl.dot(q3, tl.trans(k, 0, 2, 1), input_precision="ieee")  # [SUB, BLOCK_M, SN]
        else:
            s = tl.dot(q3, tl.trans(k, 0, 2, 1))
        if HAS_CAP:
            s = soft_cap(s * qk_scale, cap) * 1.4426950408889634
        else:
            s = s * qk_scale
        j = start + jr
        if HAS_ALIBI:
            s += alibi_bias(slope3, j, pos3)
        s = tl.where(visible(j, pos3, t_hi, window, CAUSAL, HAS_WINDOW), s, float("-inf"))
        # online softmax per sub-stream (_common.online_softmax_step along axis 2)
        m_new = tl.maximum(m3, tl.max(s, 2))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m3 - m_safe)
        p = tl.exp2(s - m_safe[:, :, None])
        l3 = l3 * alpha + tl.sum(p, 2)
        m3 = m_new
        v_off = kv_offset(blk_n, tok, h, d3, stride_vb, stride_vt, stride_vh, stride_vdh,
                          stride_vdl, BLOCK_D, False, V_LO_ONE)
        v = tl.load(v_ptr + v_off, mask=kv_mask, other=0.0).to(q.dtype)  # [SUB, SN, BLOCK_D]
        blk_n = cs_block_ids(bt_row_ptr, start + BLOCK_N, t_hi, b3, n3, BS, SN)
        if IEEE:
            acc3 = acc3 * alpha[:, :, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc3 = acc3 * alpha[:, :, None] + tl.dot(p.to(q.dtype), v)
        if ONE_PASS or PARK:
            end = start + BLOCK_N
            last = ((end % PART) == 0) | (end >= t_hi)  # the partition's last tile
            if PARK:
                last = last & (n_parts > 1)
            if last:
                m_p, l_p, acc_p = _fold(m3, l3, acc3)
                if ONE_PASS:
                    big_m, big_l, big_a = merge(big_m, big_l, big_a, m_p, l_p, acc_p)
                else:
                    park(ws_ml_ptr, ws_o_ptr, ws_row0 + ((end - 1) // PART) * R + rows, row_ok,
                          m_p, l_p, acc_p, d, d_mask, D)
                m3 = tl.full((SUB, BLOCK_M), float("-inf"), tl.float32)
                l3 = tl.zeros((SUB, BLOCK_M), tl.float32)
                acc3 = tl.zeros((SUB, BLOCK_M, BLOCK_D), tl.float32)
    if ONE_PASS:
        return big_m, big_l, big_a
    else:
        return _fold(m3, l3, acc3)
