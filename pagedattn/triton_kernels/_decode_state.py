"""Partition states of the Triton decode kernels: the online merge (:func:`merge`) and the
workspace store of a split partition (:func:`park`). Used by the tile loop
(``_decode_kernels``); the balanced launch's plan is shared by the Triton kernel, the Gluon forms
and the combine."""
import os

import triton
import triton.language as tl

# the plan's independent reductions as one multi-operand tl.reduce (one cross-warp step instead
# of two or three); exact either way. Off under the interpreter, which runs it ~3x slower.
_FUSED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")
_BIG = tl.constexpr(2147483647)
_NONE = tl.constexpr(2 ** 28)
# shares per sequence the grain search of an even batch past one wave tries (plan, best_grain):
# 2 .. _GRAINS + 1 (past one wave a grid of FINE waves holds at most FINE + 1 shares a sequence)
_GRAINS = tl.constexpr(16)


@triton.jit
def merge(big_m, big_l, big_a, m_p, l_p, acc_p):
    """Fold one partition's state (m_p, l_p, acc_p) into the running (big_m, big_l, big_a).

    The split-KV combine as an online merge in partition order: with M' = max(M, m_p),
    a = exp2(M - M') and b = exp2(m_p - M'): L' = L a + l_p b, A' = A a + acc_p b. The FMAs are
    explicit, so every kernel that merges (the one-pass loop, the split combine) rounds the same
    way: outputs are bitwise equal across launch shapes. A neutral state (m_p = -inf, l_p = 0, acc_p = 0) is an
    exact identity (a = 1, b = 0), so partitions with no key may be skipped or merged alike.
    m_p, l_p: [M]; acc_p [M, D] (unnormalised).
    """
    m_new = tl.maximum(big_m, m_p)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # never -inf - -inf
    a = tl.exp2(big_m - m_safe)
    b = tl.exp2(m_p - m_safe)
    big_l = tl.fma(l_p, b, big_l * a)
    big_a = tl.fma(acc_p, b[:, None], big_a * a[:, None])
    return m_new, big_l, big_a


@triton.jit
def park(ws_ml_ptr, ws_o_ptr, row, row_ok, m, l, acc, d, d_mask, D: tl.constexpr):
    """Store one partition's state (m_p, l_p, acc_p) at workspace rows ``row`` for the combine
    (l_p NaN: poisoned by the guards; the combine writes NaN rows)."""
    tl.store(ws_ml_ptr + 2 * row, m, mask=row_ok)
    tl.store(ws_ml_ptr + 2 * row + 1, l, mask=row_ok)
    tl.store(ws_o_ptr + row[:, None] * D + d[None, :], acc,
             mask=row_ok[:, None] & d_mask[None, :])


@triton.jit
def park_neutral(ws_ml_ptr, ws_o_ptr, ws_row0, p_lo, p_hi, rows, row_ok, d, d_mask,
                 R: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """Park the neutral state (m = -inf, l = 0, acc = 0) for partitions [p_lo, p_hi) of the
    (sequence, head) whose workspace rows start at ws_row0: a split program's partitions that lie
    wholly before the sliding window."""
    for pe in range(p_lo, p_hi):
        park(ws_ml_ptr, ws_o_ptr, ws_row0 + pe * R + rows, row_ok,
             tl.full((BLOCK_M,), float("-inf"), tl.float32), tl.zeros((BLOCK_M,), tl.float32),
             tl.zeros((BLOCK_M, BLOCK_D), tl.float32), d, d_mask, D)


@triton.jit
def valid_len(n, CAP, LQ):
    """(the length the kernels run, whether it is valid) of a loaded sequence length n: valid
    is 0 (an empty row) or LQ .. CAP (the block table's capacity in tokens); an invalid length
    runs as 0 (no key read, no table entry read) and its rows are written as NaN."""
    ok = (n >= 0) & (n <= CAP) & ((n >= LQ) | (n == 0))
    return tl.where(ok, n, 0), ok


@triton.jit
def batch_lens(lens_ptr, NB, j, CAP, LQ):
    """The lengths of sequences j as the kernels run them (int32; :func:`valid_len`; 0 past NB).
    j: 0 .. NB_BLOCK - 1 in the caller's layout (the plan's functions serve the Triton and the
    Gluon kernels alike)."""
    n = tl.load(lens_ptr + j, mask=j < NB, other=0).to(tl.int32)
    return valid_len(n, CAP, LQ)[0]


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _parts(n, j, NB, PART):
    """Partitions of each length n (>= 1; 0 past NB)."""
    return tl.where(j < NB, tl.maximum((n + PART - 1) // PART, 1), 0)


@triton.jit
def _sum_max_min(a0, b0, c0, a1, b1, c1):
    return a0 + a1, tl.maximum(b0, b1), tl.minimum(c0, c1)


@triton.jit
def _min_max_max(a0, b0, c0, a1, b1, c1):
    return tl.minimum(a0, a1), tl.maximum(b0, b1), tl.maximum(c0, c1)


@triton.jit
def _counts(lens, j, NB, PART):
    """(sum, max, min) of the partition counts of lengths ``lens`` (sequences j; past NB: no
    count)."""
    c = _parts(lens, j, NB, PART)
    cm = tl.where(j < NB, c, _BIG)
    if _FUSED:
        return tl.reduce((c, c, cm), 0, _sum_max_min)
    else:
        return tl.sum(c, 0), tl.max(c, 0), tl.min(cm, 0)


@triton.jit
def plan(lens0, j0, lens_ptr, NB, HKV, FILL_N, SLOTS, FINE, PART, CAP, LQ,
         NB_BLOCK: tl.constexpr):
    """The balanced launch's plan from every sequence's length (``decode._balance``; lens0: the
    first NB_BLOCK lengths (:func:`batch_lens` of j0), loaded by the caller beside its own so
    that both take one round trip; the rest are read here): (ppp, fill, uni). A sequence of n
    partitions runs whole in one program (it folds its partitions in registers and writes out,
    as one pass does) when n <= ppp or fill; else in shares of ppp partitions, parked for the
    combine. uni: the partition count when every sequence has the same, else 0.

    T = HKV x the batch's partitions. An even batch (longest <= 5/4 of the mean) takes the count
    rule with the true lengths: fill (one pass) when B x HKV >= FILL_N (the host's rule,
    ``_decode_configs.fill_n``), else shares of cdiv(T, SLOTS) (SLOTS: resident programs of one
    wave). When every sequence has uni partitions:
    * B x HKV <= SLOTS: shares of cdiv(uni, k), k = SLOTS // (B x HKV) shares per sequence, so
      the programs fit one wave (cdiv(T, SLOTS) rounds per sequence and can spill: (24, 4096)
      32/8 block 16 made 576 programs for 528 slots, 1.19x slower than the count rule's split);
    Past one wave (B x HKV > SLOTS), an even batch takes shares of the best grain
    (:func:`best_grain`) instead of one pass when one pass's makespan (waves x the longest's
    partitions) is at least 5/4 of the grain's, i.e. whole sequences would leave a thin last
    wave ((72, 4096) 32/8 block 16: one pass 1.28x slower than the ragged grain, split at 2
    partitions a program 1.015x faster still, on the H200).
    A ragged batch takes shares of cdiv(T, FINE x SLOTS), and only sequences that fit one share
    run whole: its programs start over several waves, so none may hold much of a wave's work
    (on the H200, shares of cdiv(T, SLOTS) are 11-12 % slower than one partition per program on
    two ragged mixes).
    """
    tot, longest, shortest = _counts(lens0, j0, NB, PART)
    for i in tl.range(NB_BLOCK, NB, NB_BLOCK, num_stages=1):
        t2, l2, s2 = _counts(batch_lens(lens_ptr, NB, i + j0, CAP, LQ), i + j0, NB, PART)
        tot += t2
        longest = tl.maximum(longest, l2)
        shortest = tl.minimum(shortest, s2)
    longest = tl.maximum(longest, 1)
    even = 4 * longest * NB <= 5 * tot
    tot = tot * HKV
    uni = tl.where(shortest == longest, longest, 0)
    n = NB * HKV
    k = SLOTS // n  # uni: shares per sequence that keep one wave
    fine = (tot + FINE * SLOTS - 1) // (FINE * SLOTS)
    ppp = tl.where(even, (tot + SLOTS - 1) // SLOTS, fine)
    ppp = tl.where(even & (uni > 0) & (k > 0), (uni + k - 1) // tl.maximum(k, 1), ppp)
    # even past one wave: the best grain when one pass's makespan (waves x the longest's
    # partitions) is >= 5/4 of the grain's (a thin last wave of whole sequences)
    # the search runs only where it can fire, so that no program of other launches pays for
    # it (with every program of (256, 2048) 32/8 running it, the H200 is 2.4 % slower at block
    # 16, 3.7 % at block 64): every grain's makespan is at least the area bound n L / SLOTS, so
    # a thin last wave needs 4 cdiv(n, SLOTS) SLOTS >= 5 n; and two shares of the longest need
    # L >= 2 and NB extra programs per head within the grid's
    waves1 = (n + SLOTS - 1) // SLOTS
    e_rows = (FINE * SLOTS) // HKV
    thin = even & (n > SLOTS) & (4 * waves1 * SLOTS >= 5 * n) & (longest > 1) & (NB <= e_rows)
    if thin:  # scalar branch
        g, ms = best_grain(j0, longest, NB, n, SLOTS, e_rows)
        thin = 4 * waves1 * longest >= 5 * ms
        ppp = tl.where(thin, g, ppp)
    return tl.maximum(ppp, 1), even & (n >= FILL_N) & (thin == 0), uni


@triton.jit
def best_grain(j, longest, NB, n, SLOTS, E_ROWS):
    """The grain of an even batch past one wave (``plan``): (g, makespan) over c = 2 .. GRAINS
    + 1 shares of the longest sequence's L partitions (lanes j < GRAINS of the caller's
    layout), g = cdiv(L, c) partitions each, which make c' = cdiv(L, g) <= c shares: makespan
    cdiv(n c', SLOTS) waves x g partitions (every sequence counted as the longest), the least,
    ties to the larger g. Only grains whose extra shares fit the grid's (NB (c' - 1) <= E_ROWS
    per head, ``decode._balance_extra``) and c <= L count; makespan _NONE when none does (5 x
    _NONE still fits int32)."""
    c = j + 2
    g = (longest + c - 1) // c
    cc = (longest + g - 1) // g
    ok = (j < _GRAINS) & (c <= longest) & (NB * (cc - 1) <= E_ROWS)
    waves = (cc * n + SLOTS - 1) // SLOTS  # int32: n <= 65535 x Hkv, cc <= 17
    key = tl.where(ok, (waves.to(tl.int64) * g) * 64 + cc, _NONE * 64)  # makespan, then shares
    best = tl.min(key, 0)
    cc = tl.maximum((best % 64).to(tl.int32), 1)
    return (longest + cc - 1) // cc, tl.minimum(best // 64, _NONE).to(tl.int32)


@triton.jit
def runs_whole(c, ppp, fill):
    """Whether a sequence of c partitions runs whole in one program under the plan (ppp, fill):
    it folds its partitions in registers and writes out, and the combine skips it."""
    return (c <= ppp) | fill


@triton.jit
def balanced_share(y, s, seq_len, lens0, j0, lens_ptr, NB, HKV, FILL_N, SLOTS, FINE, PART, CAP,
                   LQ, NB_BLOCK: tl.constexpr):
    """Grid row y of the balanced launch (grid (HKV, NB + extra shares, 1)): (sequence, length,
    whole, first partition p, partitions pp, none); the program owns partitions [p, p + pp).
    y < NB: sequence y (s, seq_len: its own, loaded), share 0; else the batch's extra share
    y - NB (:func:`extra_share`, never whole); none: past the batch's last share (length 0 and
    p = 1 then: nothing to do)."""
    ppp, fill, uni = plan(lens0, j0, lens_ptr, NB, HKV, FILL_N, SLOTS, FINE, PART, CAP, LQ,
                          NB_BLOCK)
    a = y * 0
    none = y < 0
    if y >= NB:
        s2, a, seq_len = extra_share(lens0, j0, lens_ptr, NB, y - NB, ppp, fill, uni, PART,
                                     CAP, LQ, NB_BLOCK)
        none = s2 < 0
        a = tl.where(none, 1, a)
        seq_len = tl.where(none, 0, seq_len)
        s = tl.maximum(s2, 0).to(tl.int64)
    c = tl.maximum((seq_len + PART - 1) // PART, 1)
    whole = runs_whole(c, ppp, fill)
    pp = tl.where(whole, c, ppp)
    return s, seq_len, whole, a * pp, pp, none


@triton.jit
def _extra_shares(c, ppp, fill):
    """Shares past the first of a sequence of c partitions (0 when it runs whole)."""
    return tl.where(runs_whole(c, ppp, fill), 0, (c + ppp - 1) // ppp - 1)


@triton.jit
def _extras(n, j, NB, ppp, fill, PART):
    """Shares past the first of each length n (0 for a whole sequence and past NB)."""
    return _extra_shares(_parts(n, j, NB, PART), ppp, fill)


@triton.jit
def _find(x, n, j, e, before, s, a, len_s):
    """One load of lengths n (sequences j, extras x): if extra share e falls in it, its
    (sequence, share, length) replace (s, a, len_s); ``before``: the extras of earlier loads.
    Returns them and the extras up to the end of this load."""
    cum = before + tl.associative_scan(x, 0, _add)  # inclusive; nondecreasing
    past = cum <= e  # sequences whose shares all lie before e
    first = tl.where(past, _BIG, j)
    below = tl.where(past, cum, before)
    if _FUSED:
        jh, excl, upto = tl.reduce((first, below, cum), 0, _min_max_max)
    else:
        jh, excl, upto = tl.min(first, 0), tl.max(below, 0), tl.max(cum, 0)
    # jh: the first sequence not past; excl: the extras before it
    hit = (s < 0) & (jh < _BIG)
    s = tl.where(hit, jh, s)
    a = tl.where(hit, e - excl + 1, a)
    len_s = tl.where(hit, tl.sum(tl.where(j == jh, n, 0), 0), len_s)
    return s, a, len_s, upto


@triton.jit
def extra_share(lens0, j0, lens_ptr, NB, e, ppp, fill, uni, PART, CAP, LQ,
                NB_BLOCK: tl.constexpr):
    """The balanced grid's extra share e (>= 0): shares past the first of every split sequence,
    listed in sequence order (sequence i holds cdiv(n_i, ppp) - 1 of them). Returns (sequence,
    share index >= 1, its length); sequence -1 when the batch has no share e. uni (the plan's:
    every sequence has uni partitions, else 0): k extras each, so share e is sequence e // k's
    (e % k + 1)-th, with no scan."""
    if uni > 0:
        k = _extra_shares(uni, ppp, fill)
        kk = tl.maximum(k, 1)
        s = tl.where(e < NB * k, e // kk, -1)
        a = e % kk + 1
        # none (s = -1: every extra program of a fill batch) reads nothing: it exits one round
        # trip sooner
        len_s = valid_len(tl.load(lens_ptr + tl.maximum(s, 0), mask=s >= 0, other=0)
                          .to(tl.int32), CAP, LQ)[0]
    else:
        s, a, len_s, before = _find(_extras(lens0, j0, NB, ppp, fill, PART), lens0, j0, e, 0,
                                    -1, 0, 0)
        for i in tl.range(NB_BLOCK, NB, NB_BLOCK, num_stages=1):
            j = i + j0
            n = batch_lens(lens_ptr, NB, j, CAP, LQ)
            s, a, len_s, before = _find(_extras(n, j, NB, ppp, fill, PART), n, j, e, before, s,
                                        a, len_s)
    return s, a, len_s
