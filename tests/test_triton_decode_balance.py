"""The balanced split launch of the Triton decode kernel (``decode.py``, mode ``balance``).

Every program reads the batch's lengths and takes a share of its sequence sized by the whole
batch's work, so a long sequence among short ones is cut across many programs while the short
ones run whole. On the CPU the (FILL_N, SLOTS, FINE) triple is set through ``decode.BALANCE`` so
that one small batch holds whole sequences, shared ones and programs with nothing to do; outputs
must match the oracle and be bitwise those of the one-pass launch (batch invariance).
"""
import importlib
import math
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import triton
import triton.language as tl

import pagedattn as pa
from attn_utils import make_paged_batch
from test_triton_decode import _check, _decode

PD = importlib.import_module("pagedattn.triton_kernels.decode")
DS = importlib.import_module("pagedattn.triton_kernels._decode_state")
DC = importlib.import_module("pagedattn.triton_kernels._decode_configs")


@pytest.fixture
def launch_guard():
    PD.WS_FILL = float("nan")  # a share never computed shows in the output
    yield
    PD.FORCE_MODE = None
    PD.BALANCE = None
    PD.WS_FILL = None


def _plan(lens, part, hkv, fill_n, slots, fine):
    """An independent model of ``_decode_state.plan``: shares per sequence, whether one program
    owns the sequence whole, ppp, fill (every sequence whole: the count rule's one pass) and uni
    (the partition count when every sequence has the same, else 0)."""
    n = [max(1, math.ceil(x / part)) for x in lens]
    even = 4 * max(n) * len(n) <= 5 * sum(n)  # the longest at most 5/4 of the mean, exactly
    tot = hkv * sum(n)
    ppp = max(1, math.ceil(tot / (slots if even else fine * slots)))
    k = slots // (len(n) * hkv)
    if even and len(set(n)) == 1 and k:  # uniform: k shares per sequence, one wave exactly
        ppp = max(1, math.ceil(n[0] / k))
    fill = even and len(n) * hkv >= fill_n
    programs = len(n) * hkv
    if even and programs > slots:  # past one wave: the best grain if one pass is thin
        # c = 2 .. 17 shares of the longest's partitions make cdiv(L, cdiv(L, c)) <= c
        shares = {math.ceil(max(n) / math.ceil(max(n) / c)) for c in range(2, min(max(n), 17) + 1)}
        grains = [(math.ceil(programs * c / slots) * math.ceil(max(n) / c), c) for c in shares
                  if len(n) * (c - 1) <= fine * slots // hkv]  # the grid's extras hold them
        if grains and 4 * math.ceil(programs / slots) * max(n) >= 5 * min(grains)[0]:
            ppp, fill = math.ceil(max(n) / min(grains)[1]), False
    whole = [c <= ppp or fill for c in n]
    uni = n[0] if len(set(n)) == 1 else 0
    return [1 if w else math.ceil(c / ppp) for c, w in zip(n, whole)], whole, ppp, fill, uni


def _extras(shares):
    """The grid's extra shares in order: (sequence, share index >= 1)."""
    return [(i, a) for i, c in enumerate(shares) for a in range(1, c)]


@settings(max_examples=300, deadline=None)
@given(lens=st.lists(st.integers(0, 5000), min_size=1, max_size=40),
       part=st.sampled_from([16, 256, 512]), hkv=st.sampled_from([1, 2, 8, 32]),
       slots=st.integers(1, 2000), fine=st.integers(1, 8), width=st.integers(0, 64))
def test_balance_extra_holds_every_share(lens, part, hkv, slots, fine, width):
    """The grid's extra programs (from counts only, any table width) hold every share past a
    sequence's first that the device plan cuts."""
    bs = 16
    pages = max(math.ceil(max(lens) / bs), 1) + width
    n_part_max = max(1, math.ceil(pages * bs / part))
    shares, *_ = _plan(lens, part, hkv, 3 * 132, slots, fine)
    assert len(_extras(shares)) <= PD._balance_extra(n_part_max, len(lens), hkv, slots * fine)


@triton.jit
def _plan_probe(lens_ptr, out_ptr, NB, HKV, FILL_N, SLOTS, FINE, PART, NB_BLOCK: tl.constexpr):
    """Program e: extra_share(e) as (sequence, share, length), and the plan's (ppp,
    fill + 2 uni)."""
    e = tl.program_id(0)
    j0 = tl.arange(0, NB_BLOCK)
    CAP = 1 << 30  # every test length is valid (the guards' rule: _decode_state.valid_len)
    lens0 = DS.batch_lens(lens_ptr, NB, j0, CAP, 1)
    ppp, fill, uni = DS.plan(lens0, j0, lens_ptr, NB, HKV, FILL_N, SLOTS, FINE, PART, CAP, 1,
                             NB_BLOCK)
    s, a, n = DS.extra_share(lens0, j0, lens_ptr, NB, e, ppp, fill, uni, PART, CAP, 1, NB_BLOCK)
    tl.store(out_ptr + 5 * e, s)
    tl.store(out_ptr + 5 * e + 1, a)
    tl.store(out_ptr + 5 * e + 2, n)
    tl.store(out_ptr + 5 * e + 3, ppp)
    tl.store(out_ptr + 5 * e + 4, fill.to(tl.int32) + 2 * uni)


PROBES = [
    ([40, 3, 100, 0, 17, 64, 5], (4, 8, 2), 8),  # ragged: two sequences split
    ([9] * 20 + [200, 7, 130], (50, 16, 2), 8),  # three loads; the split ones in the last
    ([60, 50, 58, 64], (2, 16, 1), 4),  # even and fill: no extra share
    ([60, 50, 58, 64], (99, 16, 1), 4),  # even, not fill: shares of cdiv(T, SLOTS)
    # the same partition count everywhere (uni), lengths not equal: extras with no scan
    ([33, 48, 40, 47, 34, 45, 48, 39, 41, 33], (99, 40, 1), 4),  # three loads, 1 extra each
    ([33, 48, 40, 47, 34, 45, 48, 39, 41], (99, 60, 1), 4),  # 2 extras each
    ([33, 48, 40], (99, 2, 1), 4),  # uni, every sequence whole: no extra, not fill
    # uni, one wave exactly: 2 shares of 4 (cdiv(T, SLOTS) = 3 would make 18 programs > 16)
    ([120, 128, 115], (99, 16, 1), 4),
    # uni past one wave (20 programs, 16 slots), fill allowed: one pass would take 2 waves x 8
    # partitions, shares of 2 take 5 x 2 (of 3: 4 x 3; 4 extras a sequence would not fit)
    ([120, 128, 115, 113, 127, 126, 119, 114, 121, 125], (2, 16, 4), 4),
    # even, not uni, past one wave: the same grain (7 or 8 partitions; extras by the scan)
    ([120, 128, 100, 113, 127, 126, 104, 114, 121, 125], (2, 16, 4), 4),
]


# fused: the plan's multi-operand reductions (the compiled kernels' form; the interpreter's
# default is the plain reductions, ~3x faster there)
@pytest.mark.parametrize("case,fused", [(c, False) for c in range(len(PROBES))]
                         + [(1, True), (4, True)], ids=lambda v: str(v))
def test_extra_shares_are_listed_in_order(device, monkeypatch, case, fused):
    """Every (sequence, share >= 1) of the plan once, in order; -1 past the last (the kernels'
    plan against the model, on batches larger than one load of lengths)."""
    lens, bal, nb_block = PROBES[case]
    if fused:
        monkeypatch.setattr(DS, "_FUSED", tl.constexpr(True))
    hkv, part = 2, 16
    shares, _, ppp, fill, uni = _plan(lens, part, hkv, *bal)
    want = _extras(shares)
    assert want or fill or case == 6, "the case must hold extra shares"
    grid = len(want) + 3
    out = torch.full((grid, 5), -7, dtype=torch.int32, device=device)
    _plan_probe[(grid,)](torch.tensor(lens, dtype=torch.int32, device=device), out, len(lens),
                         hkv, *bal, part, NB_BLOCK=nb_block)
    got = out.cpu().tolist()
    assert [tuple(r[:2]) for r in got] == want + [(-1, a) for _, a, *_ in got[len(want):]]
    assert [r[2] for r in got[:len(want)]] == [lens[i] for i, _ in want]
    assert {r[3] for r in got} == {ppp}
    assert {r[4] for r in got} == {int(fill) + 2 * uni}


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_seq=st.integers(1, 12), parts=st.integers(1, 9), spread=st.integers(0, 40),
       uniform=st.booleans(), slots=st.integers(1, 40), fine=st.integers(1, 4),
       fill_n=st.integers(1, 30), seed=st.integers(0, 2 ** 16))
def test_plan_matches_the_model_on_random_batches(device, n_seq, parts, spread, uniform, slots,
                                                   fine, fill_n, seed):
    """The kernels' plan (ppp, fill, uni and every extra share in order) against the model on
    random batches: uniform ones (one wave, past one wave), even and ragged ones."""
    rng = random.Random(seed)
    part, hkv = 16, 2
    hi = parts * part
    lens = [hi - rng.randrange(part) if uniform else max(0, hi - rng.randrange(spread * part + 1))
            for _ in range(n_seq)]
    bal = (fill_n, slots, fine)
    shares, _, ppp, fill, uni = _plan(lens, part, hkv, *bal)
    want = _extras(shares)
    grid = len(want) + 2
    out = torch.full((grid, 5), -7, dtype=torch.int32, device=device)
    _plan_probe[(grid,)](torch.tensor(lens, dtype=torch.int32, device=device), out, len(lens),
                         hkv, *bal, part, NB_BLOCK=16)
    got = out.cpu().tolist()
    assert [tuple(r[:2]) for r in got[:len(want)]] == want
    assert all(r[0] == -1 for r in got[len(want):])
    assert {r[3] for r in got} == {ppp} and {r[4] for r in got} == {int(fill) + 2 * uni}


@pytest.mark.parametrize("swap,slots,fills", [
    (False, 528, {128: 0, 320: 0, 395: 0, 396: 1, 512: 1, 600: 1}),
    (False, 264, {128: 0, 264: 0, 395: 0, 396: 1, 800: 1}),
    (True, 396, {256: 0, 395: 0, 396: 1, 397: 0, 416: 0, 1187: 0, 1188: 1})])
def test_fill_n_follows_the_wave_rule(swap, slots, fills):
    """One pass for even batches from FILL x SMs programs (the H200's 132 SMs), the swap form not
    between one and three waves of its resident programs (measured on the H200)."""
    for programs, want in fills.items():
        got = DC.fill_n(programs, 132, slots, swap, 3)
        assert got in (programs, programs + 1) and (got == programs) == bool(want), programs


def _run(b, q, mode, **kw):
    return _decode(b, q, mode=mode, partition_size=16, return_lse=True, **kw)


CASES = [  # lens, heads (hq, hkv), layout, dtypes, options, (FILL_N, SLOTS, FINE), shares?
    ([300, 5, 40, 2, 130], (4, 2), "bshd", (torch.float16, torch.float16), {}, (4, 8, 2), True),
    ([200, 17, 64, 0], (2, 1), "vllm", (torch.float32, torch.float32),
     {"sliding_window": 70, "sinks": True}, (3, 5, 1), True),
    ([150, 9, 33], (4, 4), "hcu", (torch.float16, torch.float8_e4m3fn),
     {"logit_cap": 5.0, "alibi": True}, (8, 16, 1), True),
    # shares of one partition (the parking loop, one partition each), some before the window
    ([300, 5, 40, 2, 130], (4, 2), "bhsd", (torch.float16, torch.float16),
     {"sliding_window": 100}, (4, 64, 2), True),
    # even batches (longest <= 5/4 of the mean): the count rule, one pass, then shares
    ([100, 90, 96, 81], (4, 2), "bhsd", (torch.float16, torch.float16), {}, (8, 2, 4), False),
    ([100, 90, 96, 81], (4, 2), "bshd", (torch.float32, torch.float32),
     {"sliding_window": 40}, (9, 10, 4), True),
    # uniform past one wave (10 programs, 8 slots): shares of the grain instead of one pass
    ([120, 113, 128, 125, 116], (4, 2), "bhsd", (torch.float16, torch.float16), {}, (2, 8, 4),
     True),
    # even, not uniform, past one wave: the same
    ([120, 100, 128, 125, 116], (4, 2), "bshd", (torch.float16, torch.float16), {}, (2, 8, 4),
     True),
]


@pytest.mark.parametrize("case,q_len", [(c, 1) for c in range(len(CASES))]
                         + [(c, 2) for c in (1, 2)], ids=lambda v: str(v))
def test_balanced_launch_matches_oracle_and_one_pass_bitwise(device, launch_guard, case, q_len):
    lens, (hq, hkv), layout, (qd, kvd), opts, bal, cut = CASES[case]
    lens = [max(n, q_len) if q_len > 1 else n for n in lens]  # empty rows: q_len 1 only
    gen = torch.Generator().manual_seed(100 + case)
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=32, block_size=8, layout=layout,
                         dtype=kvd, device=device, gen=gen, exact_capacity=False)
    shape = (len(lens), hq, 32) if q_len == 1 else (len(lens), q_len, hq, 32)
    q = torch.randn(shape, generator=gen).to(device=device, dtype=qd)
    o = dict(opts)
    if o.pop("sinks", False):
        o["sinks"] = (torch.randn(hq, generator=gen) + 1).to(device)
    if o.pop("alibi", False):
        o["alibi_slopes"] = torch.rand(hq, generator=gen).to(device)
    shares, *_ = _plan(lens, 16, hkv, *bal)
    assert (max(shares) > 1) == cut, "the case must hold what it is named for"
    PD.BALANCE = bal
    out, lse = _run(b, q, "balance", **o)
    key = "fp8" if kvd.itemsize == 1 else qd
    _check(b, q, out, lse, lens, q_len, key, **o)
    ref, ref_lse = _run(b, q, "one_pass", **o)
    assert torch.equal(out, ref), "balanced vs one-pass outputs differ"
    assert torch.equal(lse, ref_lse), "balanced vs one-pass lse differ"


def test_default_rule_is_balanced_when_a_sequence_spans_partitions(device, launch_guard,
                                                                  monkeypatch):
    seen = []
    real = PD._mode
    monkeypatch.setattr(PD, "_mode", lambda *a: seen.append(real(*a)) or seen[-1])
    gen = torch.Generator().manual_seed(3)
    for lens in ([40, 3], [12, 3]):  # partition 16: 3 partitions, then 1
        b = make_paged_batch(lens, num_kv_heads=1, head_dim=32, block_size=16, layout="bhsd",
                             dtype=torch.float16, device=device, gen=gen)
        q = torch.randn(2, 2, 32, generator=gen).to(device=device, dtype=torch.float16)
        pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout="bhsd",
                        backend="triton", partition_size=16)
    assert seen == ["balance", "one_pass"]
    monkeypatch.setenv("PAGEDATTN_DEV_DECODE_MODE", "spread")
    with pytest.raises(ValueError, match="PAGEDATTN_DEV_DECODE_MODE"):
        real(1, 1, device, 4)
    monkeypatch.setenv("PAGEDATTN_DEV_DECODE_MODE", "count")  # the count rule, on request
    assert real(1, 1, device, 4) == "split" and real(1, 1, device, 1) == "one_pass"
    monkeypatch.setenv("PAGEDATTN_DEV_DECODE_MODE", "balance")
    assert real(1, 1, device, 4, True) == "split", "a grid past CUDA's limit: the count rule"


MIXES = {  # lengths: a long sequence among short ones; even batches that fill the device
    # (every program whole) and that do not (shares of cdiv(T, one wave))
    "ragged": [512] * 24 + [9000, 1, 4097, 513],
    "even-fill": [1536 - 7 * i for i in range(64)],
    "even-split": [8192, 8000, 7777, 8191],
    # past one wave (576 programs at 32/8), 7 or 8 partitions: the grain search cuts it on the
    # H200 (block 16: 528 slots)
    "even-past-wave": [4096 - 13 * i for i in range(72)],
}
CUT = {"ragged", "even-past-wave"}  # mixes whose plan must cut a sequence (on the H200)
GPU_CASES = [((32, 8), 16, "triton", "ragged"), ((32, 32), 16, "triton", "ragged"),
             ((32, 8), 64, "triton", "ragged"), ((64, 8), 16, "triton", "ragged"),
             ((32, 8), 16, "triton", "even-fill"), ((32, 8), 16, "triton", "even-split"),
             ((32, 8), 16, "triton", "even-past-wave"), ((32, 8), 64, "auto", "even-past-wave")
             ] + [(h, bs, "auto", mix) for h, bs in (((32, 32), 16), ((32, 8), 64))
                  for mix in MIXES if mix != "even-past-wave"]


@pytest.mark.gpu
@pytest.mark.parametrize("heads,bs,variant,mix", GPU_CASES, ids=lambda v: str(v))
def test_gpu_balanced_launch(device, launch_guard, monkeypatch, heads, bs, variant, mix):
    """Real sizes, bf16, the device's own (FILL_N, SLOTS, FINE), the Triton kernel and (auto,
    sm_90) the Gluon forms (swap for MHA, rows for 64-token pages): outputs match the oracle
    and are bitwise the one-pass launch's; on the ragged mix the long sequence is cut."""
    monkeypatch.setenv("PAGEDATTN_DEV_DECODE_KERNEL", variant)
    hq, hkv = heads
    lens = MIXES[mix]
    gen = torch.Generator().manual_seed(hq + hkv + bs + len(lens))
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=128, block_size=bs, layout="bhsd",
                         dtype=torch.bfloat16, device=device, gen=gen, exact_capacity=False)
    # logits of std ~6: a few keys dominate, so long outputs stay above the bf16 tolerance
    q = (6 * torch.randn(len(lens), hq, 128, generator=gen)).to(device=device,
                                                                dtype=torch.bfloat16)
    kw = dict(layout="bhsd", backend="triton", return_lse=True)
    seen, plan = [], []
    real, real_bal = PD._mode, PD._balance
    monkeypatch.setattr(PD, "_mode", lambda *a: seen.append(real(*a)) or seen[-1])
    monkeypatch.setattr(PD, "_balance", lambda *a: plan.append(real_bal(*a)) or plan[-1])
    out, lse = pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, **kw)
    part = PD.default_partition_size(hq // hkv)
    assert seen == ["balance"], seen
    fill_n, slots, fine = plan[0]
    if hq == hkv and variant == "auto":  # the swap form's grain (decode.run)
        slots, fine = slots * fine * PD.SWAP_GRAIN, 1
    shares, *_ = _plan(lens, part, hkv, fill_n, slots, fine)
    if mix in CUT and (mix == "ragged" or variant == "triton"):
        assert max(shares) > 1, (plan, shares)
    _check(b, q, out, lse, lens, 1, torch.bfloat16)
    PD.FORCE_MODE = "one_pass"
    ref, ref_lse = pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, **kw)
    bad = (out != ref).any(-1).nonzero()[:5].tolist()
    assert torch.equal(out, ref), f"balanced vs one pass: (seq, head) differing: {bad}"
    assert torch.equal(lse, ref_lse), "balanced vs one pass: lse"


@pytest.mark.parametrize("nb_block", [(16, 16), (16, 64)], ids=["three-loads", "one-load"])
def test_balance_reads_every_length_of_a_large_batch(device, launch_guard, monkeypatch,
                                                     nb_block):
    """A batch larger than one load of lengths (decode.NB_BLOCK shrunk to 16): the plan sums
    every load; the longest sequence sits in the last one, so a plan that missed it would call
    the batch even and leave that sequence whole."""
    monkeypatch.setattr(PD, "NB_BLOCK", nb_block)
    gen = torch.Generator().manual_seed(5)
    lens = [9] * 39 + [400]
    b = make_paged_batch(lens, num_kv_heads=1, head_dim=32, block_size=16, layout="bhsd",
                         dtype=torch.float16, device=device, gen=gen)
    q = torch.randn(len(lens), 2, 32, generator=gen).to(device=device, dtype=torch.float16)
    bal = (8, 4, 2)
    shares, whole, *_ = _plan(lens, 16, 1, *bal)
    assert shares[-1] > 1 and not whole[-1]
    PD.BALANCE = bal
    out, lse = _run(b, q, "balance")
    ref, ref_lse = _run(b, q, "one_pass")
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    _check(b, q, out, lse, lens, 1, torch.float16)
