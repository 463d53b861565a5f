"""The decode and extend kernels' metadata guards in the default mode (validation off, no host
sync): a sequence or request with an invalid block id, length, query range or mask range gets
NaN rows (out and lse), counted in the errors tensor; every other row of the batch is the
oracle's; nothing outside the given tensors is read (the caches sit inside larger buffers whose
outside holds a huge sentinel, which a stray read would carry into a valid row). Under the
interpreter every load, store and atomic is also checked at the access against the bytes of the
launch's tensor views (marker ``bounds``, tests/bounds_check.py): a stray id fails the test with
the kernel, the op and the address, before the access is made."""
import importlib

import pytest
import torch

import pagedattn as pa
from attn_utils import assert_attn_close, dense_attention, dense_kv, make_paged_batch

pytestmark = pytest.mark.bounds(extent="view")
PD = importlib.import_module("pagedattn.triton_kernels.decode")
SENTINEL = 3.0e4


def _embed(b):
    """b's caches as views inside buffers twice their block count, the rest SENTINEL."""
    for name in ("k_cache", "v_cache"):
        c = getattr(b, name)
        big = torch.full((2 * c.shape[0],) + tuple(c.shape[1:]), SENTINEL, dtype=c.dtype,
                         device=c.device)
        big[: c.shape[0]] = c
        setattr(b, name, big[: c.shape[0]])
    return b


def _batch(lens, hkv=2, d=32, bs=16, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=d, block_size=bs, layout="bhsd",
                         dtype=torch.float32, device=device, gen=gen)
    return _embed(b), gen


def _oracle_decode(b, q, i, n):
    k, v = dense_kv(b, i, n)
    out, _ = dense_attention(q[i].unsqueeze(0).double(), k, v, torch.tensor([n - 1]),
                             scale=q.shape[-1] ** -0.5)
    return out[0]


BAD_DECODE = {  # name: (what to break in sequence 1 of 3)
    "block id -1": lambda b: b.block_table[1].__setitem__(0, -1),
    "block id past the cache": lambda b: b.block_table[1].__setitem__(1, b.k_cache.shape[0]),
    "seq_len past the table": lambda b: b.seq_lens.__setitem__(1, b.block_table.shape[1] * 16
                                                               + 1),
    "seq_len 2**31 - 1": lambda b: b.seq_lens.__setitem__(1, 2 ** 31 - 1),
    "seq_len negative": lambda b: b.seq_lens.__setitem__(1, -5),
}


@pytest.mark.parametrize("mode", ["one_pass", "split", "balance"])
@pytest.mark.parametrize("bad", list(BAD_DECODE))
def test_decode_guards_rows_with_invalid_metadata(device, mode, bad):
    lens = [40, 37, 21]
    b, gen = _batch(lens, device=device)
    q = torch.randn(3, 4, 32, generator=gen).to(device)
    BAD_DECODE[bad](b)
    errors = torch.zeros(1, dtype=torch.int32, device=device)
    PD.FORCE_MODE = mode
    if mode == "balance":
        PD.BALANCE = (1 << 20, 4, 1)  # shares of one partition each
    try:
        out, lse = pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens,
                                   backend="triton", validate=False, partition_size=16,
                                   return_lse=True, errors=errors)
    finally:
        PD.FORCE_MODE = None
        PD.BALANCE = None
    assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all(), "the bad sequence's rows"
    assert int(errors) == 4, "one count per guarded row (4 query heads)"
    for i in (0, 2):
        assert_attn_close(out[i], _oracle_decode(b, q, i, lens[i]), torch.float32)
        assert torch.isfinite(lse[i]).all()


def test_decode_default_mode_without_errors_tensor_and_valid_batch(device):
    """A valid batch: no NaN and an untouched counter (it counts only guarded rows)."""
    lens = [17, 1, 0]
    b, gen = _batch(lens, device=device)
    q = torch.randn(3, 4, 32, generator=gen).to(device)
    errors = torch.zeros(1, dtype=torch.int32, device=device)
    out, lse = pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens,
                               backend="triton", validate=False, return_lse=True, errors=errors)
    assert int(errors) == 0
    assert torch.equal(out[2], torch.zeros_like(out[2])) and torch.isneginf(lse[2]).all()
    for i in (0, 1):
        assert_attn_close(out[i], _oracle_decode(b, q, i, lens[i]), torch.float32)


def test_run_decode_after_the_table_changed(device):
    """A plan made for one table, then the table's contents changed on the device (no host
    check can see it): the guards still keep every read inside the cache."""
    lens = [40, 37]
    b, gen = _batch(lens, device=device)
    q = torch.randn(2, 4, 32, generator=gen).to(device)
    plan = pa.plan_decode(b.block_table, b.seq_lens, num_q_heads=4, num_kv_heads=2, head_dim=32,
                          block_size=16, num_blocks=b.k_cache.shape[0], q_dtype=q.dtype,
                          backend="triton")
    b.block_table[0, 1] = 10 ** 6
    b.seq_lens[1] = 10 ** 6
    out = pa.run_decode(plan, q, b.k_cache, b.v_cache)
    assert torch.isnan(out).all()


def test_run_decode_counts_guarded_rows_in_errors(device):
    """run_decode takes paged_decode's errors counter: 0 after a valid plan's run, one count per
    guarded row once a sequence's block id left the cache after planning; wrong counters are
    refused."""
    lens = [40, 37]
    b, gen = _batch(lens, device=device)
    q = torch.randn(2, 4, 32, generator=gen).to(device)
    plan = pa.plan_decode(b.block_table, b.seq_lens, num_q_heads=4, num_kv_heads=2, head_dim=32,
                          block_size=16, num_blocks=b.k_cache.shape[0], q_dtype=q.dtype,
                          backend="triton", partition_size=16)
    errors = torch.zeros(1, dtype=torch.int32, device=device)
    out = pa.run_decode(plan, q, b.k_cache, b.v_cache, errors=errors)
    assert int(errors) == 0 and torch.isfinite(out).all()
    b.block_table[1, 2] = b.k_cache.shape[0]  # past the cache, among sequence 1's 37 keys
    out = pa.run_decode(plan, q, b.k_cache, b.v_cache, errors=errors)
    assert int(errors) == 4, "one count per guarded row (4 query heads)"
    assert torch.isnan(out[1]).all()
    assert_attn_close(out[0], _oracle_decode(b, q, 0, lens[0]), torch.float32)
    with pytest.raises(TypeError, match="errors"):
        pa.run_decode(plan, q, b.k_cache, b.v_cache, errors=errors.long())
    with pytest.raises(ValueError, match="errors"):
        pa.run_decode(plan, q, b.k_cache, b.v_cache, errors=torch.zeros(2, dtype=torch.int32))


def _extend_call(b, q, cu, **kw):
    return pa.extend_attention(q, b.k_cache, b.v_cache, b.block_table, cu, b.seq_lens,
                               backend="triton", validate=False, return_lse=True, **kw)


def _oracle_extend(b, q, cu, i):
    n = int(b.seq_lens[i])
    lq = int(cu[i + 1] - cu[i])
    k, v = dense_kv(b, i, n)
    rows = q[int(cu[i]):int(cu[i + 1])].double()
    out, _ = dense_attention(rows, k, v, torch.arange(n - lq, n), scale=q.shape[-1] ** -0.5)
    return out


BAD_EXTEND = {  # name: (change to the batch / cu_seqlens_q / keywords, rows expected NaN)
    "block id past the cache": (lambda b, cu: b.block_table[1].__setitem__(0, 10 ** 6), {},
                                [1]),
    "q_len > seq_len": (lambda b, cu: b.seq_lens.__setitem__(1, 3), {}, [1]),
    "seq_len past the table": (lambda b, cu: b.seq_lens.__setitem__(1, 10 ** 6), {}, [1]),
    "max_q_len below a real Lq": (lambda b, cu: None, {"max_q_len": 4}, [1]),
    "cu_seqlens not monotone": (lambda b, cu: cu.__setitem__(1, 24), {}, [0, 1, 2]),
}


@pytest.mark.parametrize("bad", list(BAD_EXTEND))
def test_extend_guards_requests_with_invalid_metadata(device, bad):
    lens = [30, 27, 12]
    b, gen = _batch(lens, device=device)
    # Lq 3, 20, 2: request 1 spans several query blocks (8 tokens each under the interpreter)
    cu = torch.tensor([0, 3, 23, 25], dtype=torch.int32, device=device)
    q = torch.randn(25, 4, 32, generator=gen).to(device)
    good_cu = cu.clone()
    change, kw, nan_reqs = BAD_EXTEND[bad]
    change(b, cu)
    kw = {"max_q_len": 20, **kw}  # graph mode: no host read of cu_seqlens_q
    errors = torch.zeros(1, dtype=torch.int32, device=device)
    out, lse = _extend_call(b, q, cu, errors=errors, **kw)
    expected_rows = 0
    for i in range(3):
        r0, r1 = int(good_cu[i]), int(good_cu[i + 1])
        if i in nan_reqs:
            assert torch.isnan(out[r0:r1]).all() and torch.isnan(lse[r0:r1]).all(), i
            expected_rows += (r1 - r0) * 4
        else:
            assert_attn_close(out[r0:r1], _oracle_extend(b, q, good_cu, i), torch.float32)
    if bad != "cu_seqlens not monotone":  # there each sane range is counted as written
        assert int(errors) == expected_rows
    else:
        assert int(errors) > 0


def test_extend_host_checks_cu_seqlens_when_it_syncs(device):
    """Without max_q_len the launcher needs the longest query count (one host sync): a
    malformed cu_seqlens_q is then a clear error."""
    b, gen = _batch([30, 27], device=device)
    q = torch.randn(10, 4, 32, generator=gen).to(device)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        _extend_call(b, q, torch.tensor([0, 11, 10], dtype=torch.int32, device=device))


def test_extend_guards_a_mask_range_outside_the_mask(device):
    lens = [12, 9]
    b, gen = _batch(lens, device=device)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32, device=device)
    q = torch.randn(5, 4, 32, generator=gen).to(device)
    mask = torch.ones(3 * 12 + 2 * 9, dtype=torch.bool, device=device)
    indptr = torch.tensor([0, 40, 58], dtype=torch.int32, device=device)  # [40, 58) is past it
    out, lse = _extend_call(b, q, cu, custom_mask=mask, mask_indptr=indptr, max_q_len=3)
    assert torch.isnan(out[3:5]).all() and torch.isnan(lse[3:5]).all()
    assert torch.isfinite(out[:3]).all()


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("mode", ["one_pass", "split", "balance"])
def test_errors_count_guarded_metadata_only_not_nan_data(backend, mode, monkeypatch):
    """A NaN in q (valid metadata) gives NaN rows but no count, on every backend and launch
    shape: the counter means guarded metadata, as on the torch backend."""
    from pagedattn import make_kv_cache
    monkeypatch.setattr(PD, "FORCE_MODE", mode)
    gen = torch.Generator().manual_seed(46)
    kc, vc = make_kv_cache(8, 4, 2, 32, dtype=torch.float32)
    kc.copy_(torch.randn(kc.shape, generator=gen))
    vc.copy_(torch.randn(vc.shape, generator=gen))
    q = torch.randn(2, 4, 32, generator=gen)
    q[1, 0, 3] = float("nan")
    errors = torch.zeros(1, dtype=torch.int32)
    out = pa.paged_decode(q, kc, vc, torch.tensor([[1, 2, 3, 4], [5, 6, 7, 0]], dtype=torch.int32),
                          torch.tensor([13, 11], dtype=torch.int32), backend=backend,
                          partition_size=16, errors=errors)
    assert bool(torch.isnan(out[1, 0]).all()) and not bool(torch.isnan(out[1, 1:]).any())
    assert not bool(torch.isnan(out[0]).any())
    assert int(errors) == 0
