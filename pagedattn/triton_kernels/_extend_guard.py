"""The metadata guards of the Triton extend kernel (``extend._extend_fwd`` with GUARD).

A request b is valid when its batch's cu_seqlens_q is monotone and within q (cu[0] >= 0,
cu[B] <= T: otherwise no request's rows are its own alone, so every request is invalid), its
query count Lq is at most Lk (non-causal with keys from the cache: any) and at most the grid's
query blocks times BLOCK_Q (a max_q_len below a real Lq), Lk (or, with k_new, the cached
prefix Lk - Lq) fits the block table, every table entry of the keys it reads names a block of the cache, and, with a custom mask, its
[Lq, Lk] block lies inside the mask. The checks run before the key loops, which never start for
an invalid request: the first query block's program writes NaN over the request's rows (out and
lse), or over every row of q when cu_seqlens_q itself is invalid (request 0's program), counts
them, and every program returns.
Costs: one scan of cu_seqlens and one of the request's table row per program, beside the
loads that precede the key loops.
"""
import triton
import triton.language as tl

from pagedattn.triton_kernels._decode_kernels import _bad_ids

SCAN = tl.constexpr(128)  # entries per load of the scans


@triton.jit
def cu_monotone(cu_ptr, nseq, T):
    """Whether cu_seqlens_q[0 .. nseq] is nondecreasing, starts at >= 0 and ends at <= T."""
    ok = (tl.load(cu_ptr) >= 0) & (tl.load(cu_ptr + nseq) <= T)
    for i0 in range(0, nseq, SCAN):
        i = i0 + tl.arange(0, SCAN)
        a = tl.load(cu_ptr + i, mask=i < nseq, other=0)
        b = tl.load(cu_ptr + i + 1, mask=i < nseq, other=0)
        ok = ok & (tl.max(((b < a) & (i < nseq)).to(tl.int32)) == 0)
    return ok


@triton.jit
def request_ok(cu_ok, q0, lq, lk, bt_row, mask_indptr_ptr, b, cap, nblk, mask_n, coverage,
               PAGE: tl.constexpr, NEW_FROM_CACHE: tl.constexpr, HAS_MASK: tl.constexpr,
               LONG_Q: tl.constexpr):
    """Whether request b's metadata is valid (the module docstring's rule); q0, lq, lk: its
    cu_seqlens_q[b], query count and Lk (int64). LONG_Q (non-causal, keys from the cache): Lq
    may exceed Lk."""
    cached = lk if NEW_FROM_CACHE else lk - lq  # the keys read through the table
    ok = cu_ok & (lq >= 0) & (lq <= coverage) & (cached <= cap) & (lk >= 0)
    if not LONG_Q:
        ok = ok & (lq <= lk)
    if HAS_MASK:
        m0 = tl.load(mask_indptr_ptr + b).to(tl.int64)
        ok = ok & (m0 >= 0) & (m0 + lq * lk <= mask_n)
    n_pages = tl.where(ok, (cached + PAGE - 1) // PAGE, 0)
    return ok & (_bad_ids(bt_row, 0, n_pages, nblk, SCAN) == 0)


@triton.jit
def nan_rows(out_ptr, lse_ptr, err_ptr, q0, lq, T, kvh, stride_ot: tl.int64, stride_oh: tl.int64,
             stride_lt: tl.int64, stride_lh: tl.int64, GROUP: tl.constexpr,
             GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr,
             BLOCK_Q: tl.constexpr, RETURN_LSE: tl.constexpr, HAS_ERR: tl.constexpr):
    """Write NaN over rows [q0, q0 + lq) of this KV head's query heads (out and lse) when that
    range lies inside q (T rows), and count them (HAS_ERR). HEAD_DIM: out's (V's) head dim."""
    if (q0 >= 0) & (lq > 0) & (q0 + lq <= T):
        rows = tl.arange(0, BLOCK_Q * GROUP_P)
        hg = rows % GROUP_P
        head = kvh * GROUP + hg
        d = tl.arange(0, HEAD_DIM_P)
        nan = tl.full((BLOCK_Q * GROUP_P, HEAD_DIM_P), float("nan"), tl.float32)
        for t0 in range(0, lq, BLOCK_Q):
            tok = t0 + rows // GROUP_P
            ok = (tok < lq) & (hg < GROUP)
            row = (q0 + tok).to(tl.int64)
            tl.store(out_ptr + row[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                     nan.to(out_ptr.dtype.element_ty), mask=ok[:, None] & (d < HEAD_DIM)[None, :])
            if RETURN_LSE:
                tl.store(lse_ptr + row * stride_lt + head * stride_lh,
                         tl.full((BLOCK_Q * GROUP_P,), float("nan"), tl.float32), mask=ok)
        if HAS_ERR:
            tl.atomic_add(err_ptr, (lq * GROUP).to(tl.int32))
