"""The metadata guards of the sm_90 Gluon extend kernel: ``_extend_guard``'s rule (the Triton
kernel's) in Gluon, whose tensors carry explicit layouts. The kernel's scope has no custom mask
and reads the new keys from the cache, so a request is valid when cu_seqlens_q is monotone and
within q, 0 <= Lq <= Lk, Lq fits the grid's query blocks, Lk fits the block table and every
table entry of its keys names a block of the cache."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from pagedattn.triton_kernels._extend_gluon import _bad_ids


@gluon.jit
def _cu_monotone(cu_ptr, nseq, T, num_warps: gl.constexpr):
    """Whether cu_seqlens_q[0 .. nseq] is nondecreasing, starts at >= 0 and ends at <= T."""
    SCAN: gl.constexpr = 32 * num_warps
    SL: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    ok = (gl.load(cu_ptr) >= 0) & (gl.load(cu_ptr + nseq) <= T)
    for i0 in range(0, nseq, SCAN):
        i = i0 + gl.arange(0, SCAN, layout=SL)
        a = gl.load(cu_ptr + i, mask=i < nseq, other=0)
        b = gl.load(cu_ptr + i + 1, mask=i < nseq, other=0)
        ok = ok & (gl.max(((b < a) & (i < nseq)).to(gl.int32), 0) == 0)
    return ok


@gluon.jit
def request_ok(cu_ptr, q0, lq, lk, bt_row, cap, nblk, T, num_warps: gl.constexpr,
               BLOCK_Q: gl.constexpr, PAGE: gl.constexpr):
    """Whether this program's request is valid (the module docstring's rule)."""
    ok = _cu_monotone(cu_ptr, gl.num_programs(2), T, num_warps)
    ok = ok & (lq >= 0) & (lq <= lk) & (lq <= gl.num_programs(0) * BLOCK_Q) & (lk <= cap)
    n_pages = gl.where(ok, (lk + PAGE - 1) // PAGE, 0)
    return ok & (_bad_ids(bt_row, 0, n_pages, nblk, num_warps) == 0)


@gluon.jit
def nan_span(cu_ptr, b, q0, lq, T, num_warps: gl.constexpr):
    """The rows an invalid request's program writes NaN over: its own, or, when cu_seqlens_q
    itself is invalid, every row of q (request 0's program) and none (the others)."""
    cu_ok = _cu_monotone(cu_ptr, gl.num_programs(2), T, num_warps)
    return gl.where(cu_ok, q0, 0), gl.where(cu_ok, lq, gl.where(b == 0, T, 0))


@gluon.jit
def nan_rows(out_ptr, lse_ptr, err_ptr, q0, lq, T, kvh, stride_ot, stride_oh, stride_lt,
             stride_lh, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, RETURN_LSE: gl.constexpr,
             HAS_ERR: gl.constexpr, num_warps: gl.constexpr):
    """NaN over rows [q0, q0 + lq) of this KV head's query heads (out and lse) when that range
    lies inside q (T rows), counted in err_ptr (HAS_ERR)."""
    if (q0 >= 0) & (lq > 0) & (q0 + lq <= T):
        TPC: gl.constexpr = HEAD_DIM // 8
        LD: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPC, TPC], [num_warps, 1], [1, 0])
        ROWS: gl.constexpr = 32 * num_warps
        SL: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, LD))
        nan = gl.full([ROWS, HEAD_DIM], float("nan"), gl.float32, LD).to(out_ptr.dtype.element_ty)
        for r0 in range(0, lq * GROUP, ROWS):  # rows r: token r // GROUP, head kvh * G + r % G
            r = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, LD))
            off = (q0 + r // GROUP).to(gl.int64) * stride_ot \
                + (kvh * GROUP + r % GROUP).to(gl.int64) * stride_oh
            gl.store(out_ptr + (off[:, None] + d[None, :]), nan,
                     mask=(r < lq * GROUP)[:, None])
            if RETURN_LSE:
                rs = r0 + gl.arange(0, ROWS, layout=SL)
                off_l = (q0 + rs // GROUP).to(gl.int64) * stride_lt \
                    + (kvh * GROUP + rs % GROUP).to(gl.int64) * stride_lh
                gl.store(lse_ptr + off_l, gl.full([ROWS], float("nan"), gl.float32, SL),
                         mask=rs < lq * GROUP)
        if HAS_ERR:
            gl.atomic_add(err_ptr, (lq * GROUP).to(gl.int32))
