"""Triton paged decode vs the independent float64 oracle: the grid of dtypes, layouts,
GQA, head dims and block sizes, poisoned caches, and the split-KV regressions.

CPU: the kernels run under TRITON_INTERPRET=1 (slow), so each test is a few tiny, chosen launches.
Both launch shapes (one-pass and split-KV + combine) are forced through
``decode.FORCE_MODE``. Real sizes, bf16 and the int32-overflow case are `gpu` tests.
"""
import importlib
import random
import types

import pytest
import torch

import pagedattn as pa
PD = importlib.import_module("pagedattn.triton_kernels.decode")
DC = importlib.import_module("pagedattn.triton_kernels._decode_configs")
from attn_utils import (FP8, assert_attn_close, assert_lse_close, dense_attention, dense_kv,
                        make_paged_batch, tol_key)

HAS_GPU = torch.cuda.is_available()
LAYOUTS = ["bhsd", "bshd", "vllm", "hcu"]
HEADS = [(4, 4), (8, 2), (5, 1)]  # MHA, GQA 4, MQA with an odd group (rows padded to 16)
# q dtype, kv dtype: fp16, fp32 and fp8 (e4m3 / e5m2, scales 0.37 / 3.1) run on the CPU;
# bf16 only on a GPU (the interpreter's bf16 tl.dot multiplies raw bits).
DTYPES = [(torch.float16, torch.float16), (torch.float32, torch.float32),
          (torch.float16, torch.float8_e4m3fn), (torch.float32, torch.float8_e5m2)]
MODES = ["split", "one_pass"]


def _decode(b, q, *, mode, **kw):
    PD.FORCE_MODE = mode
    try:
        return pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens,
                               layout=b.layout, k_scale=b.k_scale, v_scale=b.v_scale,
                               backend="triton", **kw)
    finally:
        PD.FORCE_MODE = None


def _check(b, q, out, lse, lens, q_len, key, **o):
    """Every sequence against dense_attention on its gathered, dequantised K/V."""
    q4 = q if q.dim() == 4 else q.unsqueeze(1)
    out4 = out if out.dim() == 4 else out.unsqueeze(1)
    lse4 = None if lse is None else (lse if lse.dim() == 3 else lse.unsqueeze(1))
    d = q.shape[-1]
    for i, n in enumerate(lens):
        if n == 0:  # D4: empty row -> out 0 exactly, lse -inf
            assert torch.all(out4[i] == 0), "empty sequence: output not zero"
            if lse4 is not None:
                assert torch.all(torch.isneginf(lse4[i]))
            continue
        k, v = dense_kv(b, i, n)
        ro, rl = dense_attention(q4[i].cpu(), k.cpu(), v.cpu(), range(n - q_len, n),
                                 scale=d ** -0.5, window=o.get("sliding_window"),
                                 cap=o.get("logit_cap"), alibi=o.get("alibi_slopes"),
                                 sinks=o.get("sinks"))
        assert_attn_close(out4[i], ro, key, what=f"out[seq {i}, len {n}]",
                          magnitude_guard=key != "fp8")
        if lse4 is not None:
            assert_lse_close(lse4[i], rl, key)


def _opts(rng, hq, device, gen):
    kind = rng.choice(["plain", "window", "cap", "alibi", "sinks", "all"])
    o = {}
    if kind in ("window", "all"):
        o["sliding_window"] = rng.choice([1, 5, 17])
    if kind in ("cap", "all"):
        o["logit_cap"] = rng.choice([0.5, 5.0])
    if kind in ("alibi", "all"):
        o["alibi_slopes"] = (torch.rand(hq, generator=gen) * 0.5).to(device)
    if kind in ("sinks", "all"):
        o["sinks"] = (torch.randn(hq, generator=gen) * 2).to(device)
    return o


# ----------------------------------------------------------------------------------------------
# randomized differential cases (D2): 20 + 5 launches on the CPU
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seed", range(5))
def test_decode_random(layout, seed, device, mode_guard):
    rng = random.Random(1000 * seed + LAYOUTS.index(layout))
    gen = torch.Generator().manual_seed(seed)
    qd, kvd = DTYPES[(seed + LAYOUTS.index(layout)) % len(DTYPES)]
    hq, hkv = HEADS[(seed + 2 * LAYOUTS.index(layout)) % len(HEADS)]
    bs = [1, 4, 16][seed % 3]
    d = 80 if seed in (1, 3) else 64  # 80: padded, masked head-dim lanes
    q_len = 3 if seed in (2, 4) else 1  # speculative decode: shifted causal mask
    # seq_len 1, exact multiples of bs, k*bs+1, 0 (empty), and a random one
    lens = [1, 2 * bs, 3 * bs + 1, rng.randint(1, 70), 0]
    if q_len > 1:
        lens = [max(n, q_len) for n in lens]
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=d, block_size=bs, layout=layout,
                         dtype=kvd, device=device, gen=gen, exact_capacity=seed != 1)
    shape = (len(lens), hq, d) if q_len == 1 else (len(lens), q_len, hq, d)
    q = torch.randn(shape, generator=gen).to(device=device, dtype=qd)
    o = _opts(rng, hq, device, gen)
    mode = MODES[seed % 2]
    part = rng.choice([16, 32, None])
    out, lse = _decode(b, q, mode=mode, partition_size=part, return_lse=True, **o)
    assert out.shape == q.shape and lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    _check(b, q, out, lse, lens, q_len, tol_key(qd, kvd), **o)


@pytest.mark.parametrize("kind", ["window", "cap", "alibi", "sinks", "all"])
def test_decode_options(kind, device, mode_guard):
    """Each logit option once in fp32 (tight tolerance), split launch, q_len 2."""
    gen = torch.Generator().manual_seed(21)
    lens = [2, 37, 64]
    b = make_paged_batch(lens, num_kv_heads=2, head_dim=64, block_size=8, layout="bhsd",
                         dtype=torch.float32, device=device, gen=gen)
    q = torch.randn(3, 2, 4, 64, generator=gen).to(device)
    o = {}
    if kind in ("window", "all"):
        o["sliding_window"] = 19
    if kind in ("cap", "all"):
        o["logit_cap"] = 0.7
    if kind in ("alibi", "all"):
        o["alibi_slopes"] = torch.rand(4, generator=gen).to(device)
    if kind in ("sinks", "all"):
        o["sinks"] = (torch.randn(4, generator=gen) * 2).to(device)
    out, lse = _decode(b, q, mode="split" if kind != "all" else "one_pass", partition_size=16,
                       return_lse=True, **o)
    _check(b, q, out, lse, lens, 2, torch.float32, **o)


def test_extreme_logits_flashinfer_4450(device, mode_guard):
    """FlashInfer #4450: q = 64, k = -64 gives logits ~ -3e4 (finite sentinels lost them)."""
    gen = torch.Generator().manual_seed(3)
    lens = [40, 7]
    b = make_paged_batch(lens, num_kv_heads=2, head_dim=64, block_size=4, layout="bshd",
                         dtype=torch.float32, device=device, gen=gen)
    b.k_cache[~torch.isnan(b.k_cache)] = -64.0
    q = torch.full((2, 4, 64), 64.0, device=device)
    for mode in MODES:
        out, lse = _decode(b, q, mode=mode, partition_size=16, return_lse=True)
        assert float(lse.max()) < -2e4
        _check(b, q, out, lse, lens, 1, torch.float32)


def test_split_count_invariance(device, mode_guard):
    """Partition sizes 16/32/64 agree within tol; a fixed size is bitwise reproducible."""
    gen = torch.Generator().manual_seed(5)
    lens = [70, 33, 5]
    b = make_paged_batch(lens, num_kv_heads=2, head_dim=64, block_size=4, layout="hcu",
                         dtype=torch.float16, device=device, gen=gen)
    q = torch.randn(3, 8, 64, generator=gen).to(device=device, dtype=torch.float16)
    outs = {ps: _decode(b, q, mode="split", partition_size=ps) for ps in (16, 32, 64)}
    for ps, out in outs.items():
        assert_attn_close(out, outs[64], torch.float16, what=f"partition {ps} vs 64")
    again = _decode(b, q, mode="split", partition_size=16)
    assert torch.equal(again, outs[16]), "two runs with a fixed partition size differ"
    _check(b, q, outs[16], None, lens, 1, torch.float16)


def test_batch_invariance_and_empty_partitions(device, mode_guard):
    """Sequence i alone (split launch) == inside the batch (one-pass launch), bitwise.

    Lengths differ widely, so most (sequence, partition) programs of the split grid have no
    key: they must be neutral (a known peer bug class: an empty split overwriting
    the LSE). A window makes leading
    partitions of the long sequence empty too.
    """
    gen = torch.Generator().manual_seed(11)
    lens = [3, 90, 0, 17]
    b = make_paged_batch(lens, num_kv_heads=1, head_dim=64, block_size=16, layout="bshd",
                         dtype=torch.float16, device=device, gen=gen, exact_capacity=False)
    q = torch.randn(4, 5, 64, generator=gen).to(device=device, dtype=torch.float16)
    o = dict(sliding_window=20, sinks=(torch.randn(5, generator=gen) + 2).to(device))
    full, lse = _decode(b, q, mode="one_pass", partition_size=16, return_lse=True, **o)
    _check(b, q, full, lse, lens, 1, torch.float16, **o)
    for i in (1, 3):
        PD.FORCE_MODE = "split"
        alone, lse_i = pa.paged_decode(q[i:i + 1], b.k_cache, b.v_cache, b.block_table[i:i + 1],
                                       b.seq_lens[i:i + 1], layout="bshd", backend="triton",
                                       partition_size=16, return_lse=True, **o)
        PD.FORCE_MODE = None
        assert torch.equal(alone[0], full[i]), f"sequence {i}: alone vs batch differ"
        assert torch.equal(lse_i[0], lse[i])


@pytest.mark.parametrize("part", [16, 4], ids=["tile-sized", "shorter-than-a-tile"])
def test_many_partitions_combine_bitwise_across_launch_shapes(device, mode_guard, monkeypatch,
                                                              part):
    """More partitions than the split combine loads at once (UNROLL states per load, ragged last
    group): it merges in the same order as the one-pass loop, so outputs are bitwise equal,
    whatever the group size and warps. Partitions shorter than a KV tile (4 < BLOCK_N) too.
    """
    gen = torch.Generator().manual_seed(17)
    lens = [720, 33] if part == 16 else [150, 9]  # 720 / 16 = 45 partitions; 150 / 4 = 38
    b = make_paged_batch(lens, num_kv_heads=1, head_dim=32, block_size=16, layout="bhsd",
                         dtype=torch.float32, device=device, gen=gen)
    q = torch.randn(2, 2, 32, generator=gen).to(device=device)
    outs = {}
    # states per load, warps, column blocks (the default: 32, 1, 4)
    for combine in ((32, 4, 1, 1), (8, 1, 4, 1), (16, 2, 2, 1), (4, 1, 8, 1), (32, 1, 4, 1),
                    (64, 1, 1, 1)):
        monkeypatch.setattr(DC, "SPLIT_COMBINE", combine)
        outs[combine] = _decode(b, q, mode="split", partition_size=part, return_lse=True)
    one, one_lse = _decode(b, q, mode="one_pass", partition_size=part, return_lse=True)
    for combine, (out, lse) in outs.items():
        assert torch.equal(out, one) and torch.equal(lse, one_lse), f"combine {combine}"
    _check(b, q, one, one_lse, lens, 1, torch.float32)


@pytest.mark.parametrize("ppp", [2, 3, 64])
@pytest.mark.parametrize("window", [None, 150], ids=["full", "window"])
def test_split_programs_owning_several_partitions_bitwise(device, mode_guard, monkeypatch, ppp,
                                                          window):
    """A split program that walks several partitions (decode.PPP) parks each one's
    state exactly as one program per partition would: outputs equal the one-pass launch bit for
    bit, including sequences with one or no partition and partitions wholly before a window."""
    gen = torch.Generator().manual_seed(23)
    lens = [301, 16, 0, 47]  # 19, 1, 1 (empty) and 3 partitions of 16
    b = make_paged_batch(lens, num_kv_heads=2, head_dim=32, block_size=16, layout="bhsd",
                         dtype=torch.float32, device=device, gen=gen)
    q = torch.randn(4, 4, 32, generator=gen).to(device=device)
    o = dict(sliding_window=window, sinks=(torch.randn(4, generator=gen) + 2).to(device))
    one, one_lse = _decode(b, q, mode="one_pass", partition_size=16, return_lse=True, **o)
    monkeypatch.setattr(PD, "PPP", ppp)
    out, lse = _decode(b, q, mode="split", partition_size=16, return_lse=True, **o)
    assert torch.equal(out, one) and torch.equal(lse, one_lse)
    _check(b, q, one, one_lse, lens, 1, torch.float32, **o)


def test_fp8_tile_sheds_a_stage_where_shared_memory_is_short(monkeypatch):
    """The fp8 128-token tile keeps 3 stages where a block may hold 99 KB (sm_86/89/120) and
    sheds one where it may not; bf16 caches keep their table config."""
    cuda = torch.device("cuda")
    for limit, stages in ((99 * 1024, 3), (227 * 1024, 3), (60 * 1024, 2)):
        monkeypatch.setattr(DC, "_smem_per_block", lambda device, n=limit: n)
        assert DC._config(128, 4, 1, cuda) == (128, 4, stages), limit
    assert DC._config(128, 4, 2, cuda) == DC._CONFIGS["nvidia"][(128, 16)]


def test_parts_per_program_counts_registers(monkeypatch):
    """The split planner bounds programs per SM by shared memory, warps and, when a form gives
    them, registers: (8, 8192) 32/8 has 1024 partitions; 69 KB programs fit 3 per SM by shared
    memory (396 slots: 3 partitions each) but 8 warps at 128 registers only 2 (264: 4 each).
    Host-only: the device properties are stubbed."""
    props = types.SimpleNamespace(multi_processor_count=132,
                                  shared_memory_per_multiprocessor=228 * 1024)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    cuda = torch.device("cuda", 0)
    assert PD._parts_per_program(1024, 16, 69 * 1024, 8, cuda) == 3
    assert PD._parts_per_program(1024, 16, 69 * 1024, 8, cuda, regs=128) == 4
    assert PD._parts_per_program(1024, 16, 69 * 1024, 4, cuda, regs=148) == 3
    assert PD._parts_per_program(1024, 16, 69 * 1024, 4, cuda, one=True) == 1  # the swap form
    monkeypatch.setattr(PD, "PPP", 2)  # the test override still wins
    assert PD._parts_per_program(1024, 16, 69 * 1024, 4, cuda, one=True) == 2
    # ... but the grid's partition axis stays within CUDA's 65535
    for ppp in (1, None):
        monkeypatch.setattr(PD, "PPP", ppp)
        assert PD._parts_per_program(70000, 70000, 69 * 1024, 4, cuda, one=True) == 2
        assert PD._parts_per_program(70000, 70000, 69 * 1024, 4, torch.device("cpu")) == 2


def test_out_buffer_fused_qkv_noncontiguous_cache(device, mode_guard):
    """out= is written in place; q is a strided slice of a fused qkv tensor; the cache is a
    non-contiguous view (make_paged_batch(contiguous=False))."""
    gen = torch.Generator().manual_seed(13)
    hq, hkv, d = 8, 2, 64
    lens = [21, 1, 48]
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=d, block_size=4, layout="vllm",
                         dtype=torch.float16, device=device, gen=gen, contiguous=False)
    assert not b.k_cache.is_contiguous()
    qkv = torch.randn(3, (hq + 2 * hkv) * d, generator=gen).to(device=device,
                                                                 dtype=torch.float16)
    q = qkv[:, : hq * d].view(3, hq, d)
    assert q.stride(0) == (hq + 2 * hkv) * d
    out = torch.full((3, hq, d), float("nan"), device=device, dtype=torch.float16)
    res = _decode(b, q, mode="split", partition_size=16, out=out)
    assert res.data_ptr() == out.data_ptr()
    _check(b, q, out, None, lens, 1, torch.float16)


@pytest.mark.skipif(not HAS_GPU, reason="bf16: the Triton interpreter's bf16 tl.dot multiplies "
                    "raw bit patterns (triton #4972); runs on a GPU")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bf16(layout, device, mode_guard):
    gen = torch.Generator().manual_seed(17)
    lens = [3, 16, 33, 700]
    b = make_paged_batch(lens, num_kv_heads=2, head_dim=128, block_size=16, layout=layout,
                         dtype=torch.bfloat16, device=device, gen=gen)
    q = torch.randn(4, 3, 16, 128, generator=gen).to(device=device, dtype=torch.bfloat16)
    for mode in MODES:
        out, lse = _decode(b, q, mode=mode, return_lse=True, logit_cap=30.0)
        _check(b, q, out, lse, lens, 3, torch.bfloat16, logit_cap=30.0)


@pytest.mark.parametrize("kvd", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("case", ["q", "q_x2^16", "options"])
def test_bf16_q_over_fp8_cache(kvd, case, device, mode_guard):
    """bf16 q over an fp8 cache runs its dots in fp16 (decode._f16_dot), which the interpreter
    computes right, so this pair runs on the CPU too. q_x2^16: max |q| >= 2^15 overflows fp16
    unless the kernel prescales q by a power of 2 and moves it into the logit scale (scale=
    brings the logits back to those of q). options: the same with 3 query tokens, vllm layout,
    a padded head dim, soft-cap, ALiBi, sinks and a window on top of the prescale."""
    gen = torch.Generator().manual_seed(23 + len(case))
    opt = case == "options"
    lens, d, q_len = ([3, 16, 37, 40], 80, 3) if opt else ([1, 16, 37, 0], 64, 1)
    b = make_paged_batch(lens, num_kv_heads=2, head_dim=d, block_size=16,
                         layout="vllm" if opt else "bhsd", dtype=kvd, device=device, gen=gen)
    shape = (4, q_len, 8, d) if opt else (4, 8, d)
    q = torch.randn(shape, generator=gen).to(device=device, dtype=torch.bfloat16)
    o = dict(logit_cap=5.0, alibi_slopes=(torch.rand(8, generator=gen) * 0.5).to(device),
             sinks=(torch.randn(8, generator=gen) * 2).to(device), sliding_window=17) if opt else {}
    big = case != "q"
    qk, scale = (q * 2.0 ** 16, d ** -0.5 * 2.0 ** -16) if big else (q, None)
    for mode in MODES:
        out, lse = _decode(b, qk, mode=mode, partition_size=16, return_lse=True, scale=scale,
                           **o)
        _check(b, q, out, lse, lens, q_len, "fp8", **o)


# ----------------------------------------------------------------------------------------------
# GPU tier: real sizes, random grid, int32 overflow (D5)
# ----------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(24))
def test_gpu_random_grid(seed, device, mode_guard):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    layout = LAYOUTS[seed % 4]
    qd, kvd = rng.choice([(torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
                          (torch.bfloat16, torch.float8_e4m3fn),
                          (torch.float16, torch.float8_e5m2)])
    hq, hkv = rng.choice([(1, 1), (4, 4), (8, 2), (5, 1), (32, 8), (64, 8), (16, 1)])
    d = rng.choice([64, 96, 128, 256]) if layout != "vllm" else rng.choice([64, 128, 256])
    bs = rng.choice([1, 8, 16, 32, 64])
    lens = [rng.choice([1, bs, 4 * bs, 4 * bs + 1, rng.randint(1, 2048),
                        rng.randint(4096, 9000)]) for _ in range(rng.randint(1, 6))]
    q_len = rng.choice([1, 1, 2])
    lens = [max(n, q_len) for n in lens]
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=d, block_size=bs, layout=layout,
                         dtype=kvd, device=device, gen=gen, exact_capacity=rng.random() < 0.5)
    shape = (len(lens), hq, d) if q_len == 1 else (len(lens), q_len, hq, d)
    q = torch.randn(shape, generator=gen).to(device=device, dtype=qd)
    o = _opts(rng, hq, device, gen)
    for mode in MODES:
        out, lse = _decode(b, q, mode=mode, partition_size=rng.choice([None, 64, 256]),
                           return_lse=True, **o)
        _check(b, q, out, lse, lens, q_len, tol_key(qd, kvd), **o)


@pytest.mark.gpu
@pytest.mark.parametrize("ppp", [1, None])
def test_gpu_split_equals_one_pass_bitwise(device, mode_guard, monkeypatch, ppp):
    """Real sizes (bf16, 32/8, D 128, thousands of split programs, partitions of 512 and 64):
    the split launch + combine equals the one-pass launch bit for bit, whatever the number of
    partitions per split program."""
    gen = torch.Generator().manual_seed(31)
    lens = [32768, 8192, 5001, 1, 700] * 3
    b = make_paged_batch(lens, num_kv_heads=8, head_dim=128, block_size=16, layout="bhsd",
                         dtype=torch.bfloat16, device=device, gen=gen)
    # logits of std ~6: a few keys dominate, so even 32768-key outputs are far from 0 (a
    # uniform softmax would average the values away below the bf16 tolerance)
    q = (6 * torch.randn(len(lens), 32, 128, generator=gen)).to(device=device,
                                                                 dtype=torch.bfloat16)
    monkeypatch.setattr(PD, "PPP", ppp)
    for part in (512, 64):
        one, one_lse = _decode(b, q, mode="one_pass", partition_size=part, return_lse=True)
        out, lse = _decode(b, q, mode="split", partition_size=part, return_lse=True)
        bad = (out != one).any(-1).nonzero()[:5].tolist()
        assert torch.equal(out, one), f"partition {part}: (seq, head) differing: {bad}"
        assert torch.equal(lse, one_lse), f"partition {part}: lse"
    _check(b, q, one, one_lse, lens, 1, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(6))
def test_gpu_launch_shapes_bitwise_with_sinks(seed, device, mode_guard, monkeypatch):
    """Split (any partitions per program) == one pass, bit for bit, with sinks near the rows'
    maxima, where the sink term sets the last bits of out and lse: it catches the combine and
    the decode kernel rounding ``sink * log2(e) - m`` differently (the compiler fused it in
    one of them only), one case in a few hundred with sinks ~ N(0, 1)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    qd, kvd = [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
               (torch.bfloat16, torch.float8_e4m3fn), (torch.float32, torch.float32),
               (torch.bfloat16, torch.float8_e5m2), (torch.bfloat16, torch.bfloat16)][seed]
    hq, hkv = rng.choice([(32, 8), (8, 8), (16, 2)])
    lens = [rng.randint(1, 3000) for _ in range(rng.randint(2, 5))] + [256]
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=128, block_size=rng.choice([16, 64]),
                         layout=LAYOUTS[seed % 4], dtype=kvd, device=device, gen=gen)
    q = torch.randn(len(lens), hq, 128, generator=gen).to(device=device, dtype=qd)
    # logits ~ N(0, 1): the largest of a few thousand is ~3.5, so sinks ~ N(3, 1) sit among them
    o = dict(sinks=(torch.randn(hq, generator=gen) + 3).to(device),
             sliding_window=rng.choice([None, 700]), logit_cap=rng.choice([None, 20.0]))
    one, one_lse = _decode(b, q, mode="one_pass", partition_size=256, return_lse=True, **o)
    for ppp in (1, 3, None):
        monkeypatch.setattr(PD, "PPP", ppp)
        out, lse = _decode(b, q, mode="split", partition_size=256, return_lse=True, **o)
        bad = (out != one).any(-1).nonzero()[:5].tolist()
        assert torch.equal(out, one), f"ppp {ppp}: (seq, head) differing: {bad}"
        assert torch.equal(lse, one_lse), f"ppp {ppp}: lse"
    _check(b, q, one, one_lse, lens, 1, tol_key(qd, kvd), **o)


@pytest.mark.gpu
def test_gpu_int32_overflow(device, mode_guard):
    """D5 / vLLM #47671: the last block's element offset exceeds 2^31; pages = the top ids."""
    bs, hkv, d = 16, 8, 128
    num_blocks = 140_000
    k_cache = torch.zeros((num_blocks, hkv, bs, d), dtype=torch.float16, device=device)
    v_cache = torch.zeros_like(k_cache)
    assert (num_blocks - 1) * k_cache.stride(0) > 2 ** 31  # the point of the test
    n = 64 * bs
    table = torch.arange(num_blocks - 64, num_blocks, dtype=torch.int32, device=device)[None]
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(64, hkv, bs, d, generator=gen).half().to(device)
    v = torch.randn(64, hkv, bs, d, generator=gen).half().to(device)
    k_cache[num_blocks - 64:] = k
    v_cache[num_blocks - 64:] = v
    q = torch.randn(1, 32, d, generator=gen).half().to(device)
    lens = torch.tensor([n], dtype=torch.int32, device=device)
    kd = k.permute(0, 2, 1, 3).reshape(n, hkv, d)
    vd = v.permute(0, 2, 1, 3).reshape(n, hkv, d)
    ro, _ = dense_attention(q.cpu(), kd.cpu(), vd.cpu(), [n - 1], scale=d ** -0.5)
    for mode in MODES:
        PD.FORCE_MODE = mode
        out = pa.paged_decode(q, k_cache, v_cache, table, lens, backend="triton")
        assert_attn_close(out[0], ro[0], torch.float16)


def test_forced_modes_take_effect(device, mode_guard, monkeypatch):
    """FORCE_MODE really selects the launch shape (guards the tests above)."""
    seen = []
    real = PD._mode
    monkeypatch.setattr(PD, "_mode", lambda *a: seen.append(real(*a)) or seen[-1])
    gen = torch.Generator().manual_seed(1)
    b = make_paged_batch([20], num_kv_heads=1, head_dim=64, block_size=4, layout="bhsd",
                         dtype=torch.float16, device=device, gen=gen)
    q = torch.randn(1, 2, 64, generator=gen).to(device=device, dtype=torch.float16)
    for mode in MODES:
        _decode(b, q, mode=mode, partition_size=16)
    assert seen == MODES
