"""The hip backend's metadata guards (csrc/pk_guard.h), default build, no host validation.

Malformed metadata beside well-formed sequences in one batch: the bad sequences' rows (every
head) come out NaN with lse NaN, the errors counter is non-zero, and the good sequences get
exactly the bits they get in a batch without the bad ones (and match the float64 oracle). A
clean batch leaves the counter at 0. The raw ops are called directly: the Python entry checks
(PAGEDATTN_VALIDATE) would reject these inputs on the host first.
"""
import itertools

import pytest
import torch

from attn_utils import assert_attn_close, dense_attention, dense_kv, make_paged_batch, tol_key

pytestmark = pytest.mark.gpu

BS = 16


def _ops():
    from pagedattn.hip_kernels import build
    return build.load()


def _batch(lens, hkv, d, layout, kv, seed):
    gen = torch.Generator().manual_seed(seed)
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=d, block_size=BS, layout=layout,
                         dtype=kv, device="cuda", gen=gen, exact_capacity=False)
    return b, gen


# Each bad case edits one sequence of the batch (index 1); sequences 0 and 2 stay good.
DECODE_BAD = {
    "block_id_-1": lambda t, n, nb, w: (t.__setitem__((1, 1), -1), n)[1],
    "block_id_num_blocks": lambda t, n, nb, w: (t.__setitem__((1, 0), nb), n)[1],
    "seq_len_past_table": lambda t, n, nb, w: w * BS + 1,
    "seq_len_2^31-1": lambda t, n, nb, w: 2 ** 31 - 1,
    "seq_len_negative": lambda t, n, nb, w: -5,
}
# (layout, (Hq, Hkv), kv dtype): NVIDIA column split (group 4), attn_kernel's pipeline
# (group 32), attn_kernel's register path (fp8 cache), hcu V^T.
DECODE_KERNELS = [("bhsd", (16, 4), torch.float16, None), ("bshd", (64, 2), torch.bfloat16, None),
                  ("bhsd", (8, 2), torch.bfloat16, torch.float8_e4m3fn),
                  ("hcu", (8, 8), torch.float16, None)]
SHAPES = [("one_pass", None), ("split", 1), ("split", 3)]


def _sentinel_views(q):
    """out and lse as views inside buffers with one sentinel row before and after."""
    out_buf = torch.full((q.shape[0] + 2,) + tuple(q.shape[1:]), 7.0, dtype=q.dtype, device="cuda")
    lse_buf = torch.full((q.shape[0] + 2, q.shape[1]), 7.0, device="cuda")
    return out_buf, lse_buf, out_buf[1:-1], lse_buf[1:-1]


def _check_sentinels(out_buf, lse_buf):
    for t in (out_buf, lse_buf):
        assert (t[0] == 7).all() and (t[-1] == 7).all(), "a write outside out/lse"


def _decode(b, q, rows, lens, table, errors, mode, ppp, part):
    from pagedattn import hip_kernels as H
    out_buf, lse_buf, out, lse = _sentinel_views(q[rows])
    H.decode_raw(q[rows], b.k_cache, b.v_cache, table[rows], lens[rows], out, layout=b.layout,
                 k_scale=b.k_scale, v_scale=b.v_scale, partition_size=part, lse=lse, mode=mode,
                 parts_per_block=ppp, errors=errors)
    _check_sentinels(out_buf, lse_buf)
    return out, lse


@pytest.mark.parametrize("case", sorted(DECODE_BAD))
@pytest.mark.parametrize("layout,heads,dtype,kv", DECODE_KERNELS,
                         ids=lambda x: str(x).replace("torch.", ""))
def test_decode_bad_metadata_gives_nan_rows(case, layout, heads, dtype, kv):
    hq, hkv = heads
    lens = [300, 200, 1000]
    b, gen = _batch(lens, hkv, 128, layout, kv or dtype, seed=11)
    q = torch.randn(len(lens), hq, 128, generator=gen).to("cuda", dtype)
    table, seq = b.block_table.clone(), b.seq_lens.clone()
    nb, width = b.k_cache.shape[0], table.shape[1]
    seq[1] = DECODE_BAD[case](table, int(seq[1]), nb, width)
    good = [0, 2]
    for mode, ppp in SHAPES:
        err = torch.zeros(1, dtype=torch.int32, device="cuda")
        out, lse = _decode(b, q, slice(None), seq, table, err, mode, ppp, 128)
        assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all(), f"{mode} x{ppp}: row 1"
        assert int(err) > 0, f"{mode} x{ppp}: errors not counted"
        err0 = torch.zeros(1, dtype=torch.int32, device="cuda")
        o_ref, l_ref = _decode(b, q, good, seq, table, err0, mode, ppp, 128)
        assert int(err0) == 0, "a clean batch counted errors"
        assert torch.equal(out[good], o_ref) and torch.equal(lse[good], l_ref), \
            f"{mode} x{ppp}: good rows differ from the batch without the bad sequence"
    key = tol_key(dtype, kv or dtype)
    for i in good:
        k, v = dense_kv(b, i, lens[i])
        ro, _ = dense_attention(q[i:i + 1].cpu(), k.cpu(), v.cpu(), [lens[i] - 1], scale=128 ** -0.5)
        assert_attn_close(out[i:i + 1], ro, key, what=f"seq {i}", magnitude_guard=False)


def _extend(b, q, cu, seq, table, max_q, errors):
    out_buf, lse_buf, out, lse = _sentinel_views(q)
    code = {"bhsd": 0, "bshd": 1}[b.layout]
    _ops().extend_attention(q, b.k_cache, b.v_cache, table, cu, seq, out, lse, code,
                            q.shape[-1] ** -0.5, max_q, errors)
    _check_sentinels(out_buf, lse_buf)
    return out, lse


# Request 1 of [good, bad, good] (query lengths 40, 30, 70; seq_lens 100, 90, 200), except the
# cu_seqlens cases, which edit the pairs of the last request. Each returns (cu, seq, max_q).
EXTEND_BAD = {
    "block_id_-1": lambda cu, seq, t, nb, w: (t.__setitem__((1, 2), -1), (cu, seq, 70))[1],
    "block_id_past": lambda cu, seq, t, nb, w: (t.__setitem__((1, 0), nb + 3), (cu, seq, 70))[1],
    "q_len_above_seq_len": lambda cu, seq, t, nb, w: (cu, _set(seq, 1, 20), 70),
    "seq_len_past_table": lambda cu, seq, t, nb, w: (cu, _set(seq, 1, w * BS + 1), 70),
    "max_q_len_below_q_len": lambda cu, seq, t, nb, w: (cu, seq, 35),
}


def _set(t, i, v):
    t = t.clone()
    t[i] = v
    return t


@pytest.mark.parametrize("case", sorted(EXTEND_BAD))
@pytest.mark.parametrize("layout,d", [("bhsd", 128), ("bshd", 64)])
def test_extend_bad_metadata_gives_nan_rows(case, layout, d):
    lq, lens = [40, 30, 70], [100, 90, 200]
    b, gen = _batch(lens, 2, d, layout, torch.float16, seed=12)
    q = torch.randn(sum(lq), 8, d, generator=gen).to("cuda", torch.float16)
    cu = torch.tensor([0] + list(itertools.accumulate(lq)), dtype=torch.int32, device="cuda")
    table = b.block_table.clone()
    cu2, seq2, max_q = EXTEND_BAD[case](cu, b.seq_lens.clone(), table, b.k_cache.shape[0],
                                        table.shape[1])
    err = torch.zeros(1, dtype=torch.int32, device="cuda")
    out, lse = _extend(b, q, cu2, seq2, table, max_q, err)
    # max_q_len 35: requests 0 and 2 (40 and 70 rows) are longer, request 1 (30) is not
    bad, good = ([0, 2], [1]) if case == "max_q_len_below_q_len" else ([1], [0, 2])
    starts = [0, 40, 70]
    for i in bad:
        r = slice(starts[i], starts[i] + lq[i])
        assert torch.isnan(out[r]).all() and torch.isnan(lse[r]).all(), f"request {i}"
    assert int(err) > 0
    _extend_exact(b, q, out, lq, lens, [(i, starts[i]) for i in good], torch.float16)
    err0 = torch.zeros(1, dtype=torch.int32, device="cuda")
    _extend(b, q, cu, b.seq_lens, b.block_table, 70, err0)
    assert int(err0) == 0, "a clean batch counted errors"


def _extend_exact(b, q, out, lq, lens, starts, dtype):
    for i, r0 in starts:
        rows = slice(r0, r0 + lq[i])
        k, v = dense_kv(b, i, lens[i])
        ro, _ = dense_attention(q[rows].cpu(), k.cpu(), v.cpu(), range(lens[i] - lq[i], lens[i]),
                                scale=q.shape[-1] ** -0.5)
        assert_attn_close(out[rows], ro, dtype, what=f"request {i}", magnitude_guard=False)


def test_extend_bad_cu_seqlens_stays_in_bounds():
    """A descending pair (request 2: [110, 100)) writes nothing and is counted; a pair past q
    (request 3: [110, 150) with 120 rows) writes NaN into its rows inside q. Requests 0 and 1
    stay exact; nothing outside out/lse is written."""
    lq, lens = [40, 70, 0, 0], [100, 200, 50, 60]
    b, gen = _batch(lens, 2, 128, "bhsd", torch.bfloat16, seed=13)
    q = torch.randn(120, 8, 128, generator=gen).to("cuda", torch.bfloat16)
    for cu_list, nan_rows in (([0, 40, 110, 100, 100], None), ([0, 40, 110, 110, 150], (110, 120))):
        cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
        err = torch.zeros(1, dtype=torch.int32, device="cuda")
        out, lse = _extend(b, q, cu, b.seq_lens, b.block_table, 70, err)
        assert int(err) > 0, cu_list
        if nan_rows:
            r = slice(*nan_rows)
            assert torch.isnan(out[r]).all() and torch.isnan(lse[r]).all()
        else:
            assert (out[110:] == 7).all(), "the descending pair wrote rows"
        _extend_exact(b, q, out, lq, lens, ((0, 0), (1, 40)), torch.bfloat16)


def test_errors_argument_is_checked():
    """errors must be an int32 tensor of 1 element on q's device."""
    from pagedattn import hip_kernels as H
    q = torch.zeros(1, 4, 64, dtype=torch.float16, device="cuda")
    for bad in (torch.zeros(2, dtype=torch.int32, device="cuda"),
                torch.zeros(1, dtype=torch.int64, device="cuda"), torch.zeros(1, dtype=torch.int32)):
        with pytest.raises((TypeError, ValueError), match="errors"):
            H.check_errors(bad, q.device)
