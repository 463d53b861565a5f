"""Variants of the Triton decode kernel against the oracle, and bitwise across launch shapes:
the column split (``_decode_cs.py``, config SUB > 1; CPU: the interpreter, SUB 2 on 32-key
tiles; GPU: bf16 at real sizes, SUB 4 and 2), the row sums summed per tile
(PAGEDATTN_DECODE_ROWSUM=tile; the CPU tests' small tiles take the lazy sums by default) and the
split launch's in-kernel merge (PAGEDATTN_DECODE_FOLD=last)."""
import importlib
import random

import pytest
import torch

from attn_utils import make_paged_batch, tol_key
from test_triton_decode import _check, _decode, _opts

R = importlib.import_module("pagedattn.triton_kernels._replay")
decode = importlib.import_module("pagedattn.triton_kernels.decode")


@pytest.fixture
def launches(monkeypatch):
    """(kernel name, keyword arguments) of every launch of the decode launcher (through
    ``_replay.launch``). _decode resets the forced launch shape itself (no mode guard needed)."""
    seen = []
    real = R.launch

    def spy(rec, jf, grid, *args, **kwargs):
        seen.append((jf.fn.__name__, kwargs))
        return real(rec, jf, grid, *args, **kwargs)
    monkeypatch.setattr(R, "launch", spy)
    return seen


def _subs(launches):
    """The SUB value of every decode kernel launch (the launcher may fall back to 1)."""
    return {k["SUB"] for name, k in launches if name == "_decode_kernel"}


def _launch_shapes(b, q, part, monkeypatch, **o):
    """(out, lse) of the one-pass launch, after asserting the split launch with one and with two
    partitions per program equals it bit for bit."""
    one = _decode(b, q, mode="one_pass", partition_size=part, return_lse=True, **o)
    for ppp in ("1", "2"):
        monkeypatch.setenv("PAGEDATTN_DECODE_PPP", ppp)
        out, lse = _decode(b, q, mode="split", partition_size=part, return_lse=True, **o)
        bad = (out != one[0]).flatten(0, -2).any(-1).nonzero()[:5].tolist()
        assert torch.equal(out, one[0]), f"split (PPP {ppp}) vs one-pass: rows {bad}"
        assert torch.equal(lse, one[1]), f"split (PPP {ppp}) vs one-pass: lse"
    monkeypatch.delenv("PAGEDATTN_DECODE_PPP")
    return one


CPU_CASES = [  # layout, block size, Hq, Hkv, head dim, q_len, dtype, options
    ("bhsd", 16, 8, 2, 64, 1, torch.float16, "plain"),
    ("vllm", 1, 4, 4, 80, 3, torch.float32, "window"),
    ("bshd", 32, 8, 2, 64, 2, torch.float32, "all"),
]


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: f"{c[0]}-bs{c[1]}-{c[7]}")
def test_column_split_matches_oracle_and_launch_shapes(case, device, monkeypatch, launches):
    layout, bs, hq, hkv, d, q_len, dt, kind = case
    monkeypatch.setenv("PAGEDATTN_DECODE_CONFIG", "32,2,2,2")  # interpreter: 32-key tiles
    gen = torch.Generator().manual_seed(CPU_CASES.index(case))
    # seq_len 1, exact multiples of the block and of the tile, one past, 0 (q_len 1: several
    # query tokens need as many keys), and 3 partitions
    lens = [max(n, q_len) if n or q_len > 1 else 0 for n in (1, 2 * bs, 64, 3 * bs + 1, 0, 90)]
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=d, block_size=bs, layout=layout,
                         dtype=dt, device=device, gen=gen, exact_capacity=bs != 16)
    shape = (len(lens), hq, d) if q_len == 1 else (len(lens), q_len, hq, d)
    q = torch.randn(shape, generator=gen).to(device=device, dtype=dt)
    o = _opts(random.Random(kind), hq, device, gen) if kind != "plain" else {}
    if kind == "window":
        o = {"sliding_window": 37}  # the first partitions of the long rows hold no visible key
    elif kind == "all":
        o = dict(sliding_window=40, logit_cap=5.0, alibi_slopes=torch.rand(hq, generator=gen)
                 .to(device), sinks=(torch.randn(hq, generator=gen) * 2).to(device))
    out, lse = _launch_shapes(b, q, 32, monkeypatch, **o)
    assert _subs(launches) == {2}, f"the column split did not run: SUB {_subs(launches)}"
    _check(b, q, out, lse, lens, q_len, tol_key(dt, dt), **o)


def test_column_split_falls_back_where_tiles_cross_partitions(device, monkeypatch, launches):
    """Partitions of 16 keys cannot hold a 32-key tile: the plain loop runs, still correct."""
    monkeypatch.setenv("PAGEDATTN_DECODE_CONFIG", "32,2,2,2")
    gen = torch.Generator().manual_seed(3)
    lens = [40, 7]
    b = make_paged_batch(lens, num_kv_heads=1, head_dim=32, block_size=16, layout="bhsd",
                         dtype=torch.float32, device=device, gen=gen)
    q = torch.randn(2, 4, 32, generator=gen).to(device)
    out, lse = _launch_shapes(b, q, 16, monkeypatch)
    assert _subs(launches) == {1}
    _check(b, q, out, lse, lens, 1, torch.float32)


@pytest.mark.parametrize("rowsum", ["tile", "lazy"])
def test_row_sums_per_tile_or_lazy(rowsum, device, monkeypatch):
    """Both ways of keeping the row sums (``decode._lazy_rowsum``), with a window, sinks and
    ALiBi over many partitions, several query tokens, both launch shapes."""
    monkeypatch.setenv("PAGEDATTN_DECODE_ROWSUM", rowsum)
    gen = torch.Generator().manual_seed(9)
    lens = [150, 3, 64, 33]
    b = make_paged_batch(lens, num_kv_heads=2, head_dim=32, block_size=16, layout="vllm",
                         dtype=torch.float32, device=device, gen=gen)
    q = torch.randn(4, 2, 4, 32, generator=gen).to(device)
    o = dict(sliding_window=70, sinks=(torch.randn(4, generator=gen) + 1).to(device),
             alibi_slopes=torch.rand(4, generator=gen).to(device))
    out, lse = _launch_shapes(b, q, 32, monkeypatch, **o)
    _check(b, q, out, lse, lens, 2, torch.float32, **o)


@pytest.mark.parametrize("ppp,unroll", [("1", None), ("3", 4)])
def test_fold_by_the_last_program_equals_one_pass(ppp, unroll, device, monkeypatch, launches):
    """PAGEDATTN_DECODE_FOLD=last: the split launch merges in the decode kernel (no combine
    launch), bit for bit the one-pass result, with sequences of one, no and many partitions,
    partitions wholly before a window, sinks and programs owning several partitions; the merge
    loads all 19 states of the longest sequence in one group (the launcher's size) or in groups
    of 4, the last one partial."""
    gen = torch.Generator().manual_seed(29)
    lens = [301, 16, 0, 47, 90]
    b = make_paged_batch(lens, num_kv_heads=2, head_dim=32, block_size=16, layout="bshd",
                         dtype=torch.float32, device=device, gen=gen)
    q = torch.randn(5, 4, 32, generator=gen).to(device=device)
    o = dict(sliding_window=150, sinks=(torch.randn(4, generator=gen) + 2).to(device))
    one, one_lse = _decode(b, q, mode="one_pass", partition_size=16, return_lse=True, **o)
    monkeypatch.setenv("PAGEDATTN_DECODE_FOLD", "last")
    monkeypatch.setenv("PAGEDATTN_DECODE_PPP", ppp)
    if unroll:
        tile = decode._fold_tile
        monkeypatch.setattr(decode, "_fold_tile", lambda *a: (tile(*a)[0], unroll))
    launches.clear()  # the one-pass reference's launch
    for _ in range(2):  # the counters start from zero again
        out, lse = _decode(b, q, mode="split", partition_size=16, return_lse=True, **o)
        assert torch.equal(out, one) and torch.equal(lse, one_lse)
    kernels = [name for name, _ in launches]
    assert kernels == ["_decode_kernel"] * 2, kernels
    groups = {k["FOLD_UNROLL"] for _, k in launches}
    assert groups == {4} if unroll else min(groups) >= 19, groups
    _check(b, q, one, one_lse, lens, 1, torch.float32, **o)


GPU_CASES = [  # Hq, Hkv, head dim, block size, layout, partition
    (32, 8, 128, 16, "bhsd", None), (32, 8, 128, 64, "vllm", None), (8, 2, 96, 1, "bshd", 256),
    (28, 4, 128, 16, "hcu", 512), (16, 1, 64, 32, "bhsd", None), (8, 1, 128, 8, "bshd", 128),
]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", ["64,4,3,4", "32,2,3,2"])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"{c[0]}-{c[1]}-d{c[2]}-bs{c[3]}")
def test_gpu_column_split(case, cfg, device, monkeypatch, launches):
    """bf16 (the interpreter's bf16 dot is wrong) and fp16 at real sizes: ragged lengths from 1
    to 9000 around block and tile multiples, options; bitwise across launch shapes."""
    hq, hkv, d, bs, layout, part = case
    monkeypatch.setenv("PAGEDATTN_DECODE_CONFIG", cfg)
    seed = GPU_CASES.index(case)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    dt = torch.bfloat16 if seed % 3 else torch.float16
    lens = [1, bs, 64, 64 * bs + 1, 4097, 9000, rng.randint(2, 3000), 511]
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=d, block_size=bs, layout=layout,
                         dtype=dt, device=device, gen=gen, exact_capacity=seed % 2 == 0)
    q = (6 * torch.randn(len(lens), hq, d, generator=gen)).to(device=device, dtype=dt)
    o = _opts(rng, hq, device, gen)
    if "logit_cap" in o:  # a cap of 0.5 flattens 4097-key rows below the tolerance (vacuous)
        o["logit_cap"] = 30.0
    out, lse = _launch_shapes(b, q, part, monkeypatch, **o)
    assert _subs(launches) == {int(cfg.split(",")[3])}
    _check(b, q, out, lse, lens, 1, tol_key(dt, dt), **o)


@pytest.mark.gpu
@pytest.mark.parametrize("ppp", ["1", "auto"])
def test_gpu_fold_by_the_last_program(ppp, device, monkeypatch):
    """PAGEDATTN_DECODE_FOLD=last at real sizes (bf16, 32/8, thousands of split programs racing
    for the counters): bit for bit the one-pass launch, twice in a row."""
    gen = torch.Generator().manual_seed(37)
    lens = [32768, 8192, 5001, 1, 700, 512] * 2
    b = make_paged_batch(lens, num_kv_heads=8, head_dim=128, block_size=16, layout="bhsd",
                         dtype=torch.bfloat16, device=device, gen=gen)
    q = (6 * torch.randn(len(lens), 32, 128, generator=gen)).to(device=device,
                                                                 dtype=torch.bfloat16)
    one, one_lse = _decode(b, q, mode="one_pass", return_lse=True)
    monkeypatch.setenv("PAGEDATTN_DECODE_FOLD", "last")
    monkeypatch.setenv("PAGEDATTN_DECODE_PPP", ppp)
    for _ in range(2):
        out, lse = _decode(b, q, mode="split", return_lse=True)
        bad = (out != one).any(-1).nonzero()[:5].tolist()
        assert torch.equal(out, one), f"(seq, head) differing: {bad}"
        assert torch.equal(lse, one_lse)
    _check(b, q, one, one_lse, lens, 1, torch.bfloat16)
