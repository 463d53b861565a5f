"""Backend selection (docs/dispatch.md): arch facts, the pure decision table, shape
rules and overrides. The declared-capability tables against the backends, "declared => really
runs", explain and the CLI are in test_dispatch_runs.py."""
import importlib
import types

import pytest
import torch

import pagedattn as pa
from pagedattn import dispatch
from pagedattn._triton import triton_available
from pagedattn.dispatch import arch as A
from pagedattn.dispatch import capabilities as C
from pagedattn.dispatch import core
from pagedattn.dispatch.core import reuse_kv_times, partition_size_for, preference, select
from dispatch_utils import ATTN_OPS, DTYPES, _clean_dispatch, _decode_args  # noqa: F401

ARCHS = ["gfx90a", "gfx936", "gfx942", "gfx950", "sm_80", "sm_90", "sm_100", "unknown", "cpu"]
HEAD_DIMS = [13, 64, 80, 128, 256, 512, 576, 577]  # 80: not a HIP template; 577: beyond any
BLOCK_SIZES = [1, 16, 64, 528]  # 1: SGLang token pool (no HIP delta addressing); 528: not pow2
GROUPS = [1, 4, 16, 48, 96]  # 16 vs 15: partition rule; 96: past the largest REUSE (64)


# The capability rules below assume every backend passed the self-check on the device; what
# `auto` trusts without a record is tested in test_verified_dispatch.py.
ALL_PASSED = tuple((b, True, "assumed") for b in ("triton", "hip", "torch"))


def _sel(op, arch, **kw):
    kw.setdefault("layout", "bhsd")
    kw.setdefault("interpret", True)  # cpu: the interpreter is on, as in the CPU test tier
    kw.setdefault("checked", ALL_PASSED)
    return select(op, arch, **kw)


@pytest.fixture
def hip_first(monkeypatch):
    """AMD and Hygon ordered HIP first (as an A/B record measuring HIP faster there would), so
    the rules that route calls away from HIP are exercised."""
    for vendor in ("amd", "hygon"):
        monkeypatch.setitem(core.PREFERENCE, vendor, {"*": ("hip", "triton", "torch")})
    dispatch.cache_clear()


# ----------------------------------------------------------------------------------------------
# arch detection and facts
# ----------------------------------------------------------------------------------------------

def test_arch_strings():
    assert A.parse_gcn_arch("gfx936:sramecc+:xnack-") == "gfx936"
    assert A.parse_gcn_arch("gfx942") == "gfx942"
    assert A.cuda_arch(9, 0) == "sm_90" and A.cuda_arch(10, 0) == "sm_100"


@pytest.mark.parametrize("props,hip,expected", [
    (types.SimpleNamespace(gcnArchName="gfx936:sramecc+:xnack-", major=9, minor=3,
                           multi_processor_count=88), "6.2", "gfx936"),
    (types.SimpleNamespace(major=9, minor=0, multi_processor_count=132), None, "sm_90"),
], ids=["dtk-gfx936", "cuda-h200"])
def test_detect_arch_once_per_device(monkeypatch, props, hip, expected):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: calls.append(i) or props)
    monkeypatch.setattr(torch.version, "hip", hip)
    assert dispatch.detect_arch(0) == expected
    assert dispatch.detect_arch(torch.device("cuda", 0)) == expected
    assert calls == [0]  # read once, then cached
    assert dispatch.device_facts(0).num_cus == props.multi_processor_count
    assert dispatch.detect_arch(-1) == "cpu" and dispatch.detect_arch("cpu") == "cpu"


def test_arch_facts_table():
    f = dispatch.arch_facts
    assert f("gfx936").fp8 == ("e5m2",)  # Bowen gfx936: e5m2 only
    assert "e4m3" in f("gfx938").fp8 and "e4m3" in f("gfx942").fp8
    assert f("gfx936").matrix_unit == "MMAC" and f("gfx942").matrix_unit == "MFMA"
    assert f("sm_80").matrix_unit == "MMA" and f("sm_90").matrix_unit == "WGMMA"
    assert {f(a).wave_size for a in ("gfx90a", "gfx936", "gfx950")} == {64}
    assert f("sm_90").wave_size == 32
    assert f("gfx1100").vendor == "amd" and not f("gfx1100").hip_built and f("gfx1100").fp8 == ()
    assert f("gfx948").vendor == "hygon"
    with pytest.raises(TypeError, match="arch"):
        f(90)


# ----------------------------------------------------------------------------------------------
# the pure decision: table-driven grid
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("arch", ARCHS)
def test_grid_hip_only_where_declared_else_triton(arch, dtype, hip_first):
    facts = dispatch.arch_facts(arch)
    for op in ATTN_OPS:
        order = preference(arch, op)
        for d in HEAD_DIMS:
            for bs in BLOCK_SIZES:
                for g in GROUPS:
                    call = dict(dtype=dtype, head_dim=d, block_size=bs, group=g, layout="bhsd")
                    dec = _sel(op, arch, **call)
                    hip_why = C.unsupported("hip", op, facts, interpret=True, **call)
                    tri_why = C.unsupported("triton", op, facts, interpret=True, **call)
                    where = f"{op} {arch} {dtype} D={d} bs={bs} g={g}: {dec.reasons}"
                    if dec.backend == "hip":
                        assert not hip_why and facts.hip_built, where
                    if not hip_why and order.index("hip") < order.index("triton"):
                        assert dec.backend == "hip", where
                    elif not tri_why:
                        assert dec.backend == "triton", where
                        if order[0] == "hip":  # skipped, and says why
                            assert any(r.startswith("hip skipped: ") and len(r) > 14
                                       for r in dec.reasons), where
                    else:
                        assert dec.backend == "torch", where
                        assert any(r.startswith("triton skipped: ") for r in dec.reasons), where
                    assert dec.reasons and dec.arch == arch


# Explicit rows: (op, arch, dtype, kv_dtype, head_dim, block, group, expected, reason fragment)
E4M3, E5M2, F16, BF16, F32 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float16,
                              torch.bfloat16, torch.float32)
CASES = [
    ("paged_decode", "gfx936", F16, F16, 128, 16, 8, "hip", "first backend"),
    ("paged_decode", "gfx936", F16, F16, 80, 16, 8, "triton", "head_dim 80"),
    ("paged_decode", "gfx936", F32, F32, 128, 16, 8, "triton", "dtype float32"),
    ("paged_decode", "gfx936", F16, E5M2, 128, 16, 8, "hip", "first backend"),
    ("paged_decode", "gfx936", F16, E4M3, 128, 16, 8, "torch", "reads fp8 as ['e5m2']"),
    ("paged_decode", "gfx942", BF16, E4M3, 128, 16, 8, "hip", "first backend"),
    ("paged_decode", "gfx942", BF16, BF16, 128, 1, 8, "triton", "block_size 1"),
    ("paged_decode", "gfx942", BF16, BF16, 256, 16, 8, "triton", "head_dim 256"),
    ("paged_decode", "gfx942", BF16, BF16, 128, 16, 96, "hip", "first backend"),
    ("extend_attention", "gfx942", BF16, E5M2, 128, 16, 8, "triton", "fp8 e5m2 caches"),
    ("paged_decode", "gfx950", BF16, BF16, 128, 16, 8, "triton", "not built for gfx950"),
    ("paged_decode", "sm_80", BF16, E4M3, 128, 16, 8, "torch", "reads fp8 as ['e5m2']"),
    ("paged_decode", "sm_90", BF16, BF16, 128, 16, 8, "triton", "first backend"),
    ("extend_attention", "sm_90", BF16, BF16, 128, 16, 8, "triton", "first backend"),
    ("extend_attention", "gfx942", BF16, BF16, 128, 16, 8, "hip", "first backend"),
    ("paged_decode", "sm_100", BF16, BF16, 128, 16, 8, "triton", "first backend"),
    ("paged_decode", "sm_90", BF16, BF16, 512, 16, 8, "triton", "first backend"),
    ("paged_decode", "sm_90", BF16, BF16, 577, 16, 8, "torch", "head_dim 577"),
    ("paged_decode", "gfx942", BF16, BF16, 128, 528, 8, "triton", "block_size 528"),
    ("extend_attention", "gfx942", BF16, BF16, 128, 48, 8, "triton", "block_size 48"),
    ("paged_decode", "unknown", F16, F16, 128, 16, 8, "triton", "first backend"),
    ("paged_decode", "unknown", F16, E5M2, 128, 16, 8, "torch", "reads fp8 as none"),
    ("paged_decode", "cpu", F16, F16, 128, 16, 8, "triton", "first backend"),
    ("paged_decode", "cpu", BF16, BF16, 128, 16, 8, "torch", "raw bits"),
]


@pytest.mark.parametrize("op,arch,dtype,kv,d,bs,g,expected,why", CASES,
                         ids=[f"{c[0][:6]}-{c[1]}-{str(c[3])[6:]}-D{c[4]}-bs{c[5]}-g{c[6]}"
                              for c in CASES])
def test_decision_table(op, arch, dtype, kv, d, bs, g, expected, why, hip_first):
    dec = _sel(op, arch, dtype=dtype, kv_dtype=kv, head_dim=d, block_size=bs, group=g)
    assert dec.backend == expected, dec.describe()
    assert any(why in r for r in dec.reasons), dec.describe()


def test_cpu_without_interpreter_is_torch():
    dec = _sel("paged_decode", "cpu", dtype=F16, head_dim=64, block_size=16, group=1,
               interpret=False)
    assert dec.backend == "torch"
    assert any("TRITON_INTERPRET is not set" in r for r in dec.reasons)


@pytest.mark.parametrize("arch", ["cpu", "sm_90"])
def test_without_triton_the_reason_is_the_missing_package(arch):
    """On a CPU as on a GPU: neither a GPU nor TRITON_INTERPRET helps when triton is absent."""
    for interpret in (False, True):
        dec = _sel("paged_decode", arch, dtype=F16, head_dim=64, block_size=16, group=1,
                   interpret=interpret, has_triton=False)
        assert dec.backend != "triton"
        assert "triton skipped: triton is not installed" in dec.reasons, dec.describe()
        assert not any("TRITON_INTERPRET" in r for r in dec.reasons), dec.describe()


def test_features_and_layouts_route_away_from_hip(hip_first):
    base = dict(dtype=BF16, head_dim=128, block_size=16, group=4)
    assert _sel("paged_decode", "gfx942", features={"sinks"}, **base).backend == "triton"
    assert _sel("paged_decode", "gfx942", features={"window"}, **base).backend == "triton"
    assert _sel("paged_decode", "gfx942", features={"lse"}, **base).backend == "hip"
    assert _sel("paged_decode", "gfx942", q_len=4, **base).backend == "triton"
    assert _sel("extend_attention", "gfx942", features={"tree_mask"}, **base).backend == "triton"
    assert _sel("paged_decode", "gfx942", **{**base, "layout": "vllm"}).backend == "triton"
    assert _sel("store_kv", "gfx942", dtype=BF16, head_dim=128, block_size=16).backend == "triton"
    with pytest.raises(ValueError, match="features"):
        _sel("paged_decode", "gfx942", features={"flash"}, **base)


# ----------------------------------------------------------------------------------------------
# shape rules
# ----------------------------------------------------------------------------------------------

def test_partition_size_rule():
    assert partition_size_for(15, 16)[0] == 512  # group <= 15: 512
    assert partition_size_for(16, 16)[0] == 256  # group > 15: 256
    assert partition_size_for(4, 16, override=128)[0] == 128
    assert partition_size_for(4, 1024)[0] == 1024  # a multiple of the block size


@pytest.mark.parametrize("group,expected", [(1, (1, 1)), (3, (4, 1)), (5, (8, 1)),
                                            (17, (32, 1)), (33, (48, 1)), (64, (64, 1)),
                                            (100, (64, 2))])
def test_reuse_kv_times_rounds_up(group, expected):
    assert reuse_kv_times(group) == expected


def test_one_pass_vs_split_kv(hip_first):
    base = dict(dtype=BF16, head_dim=128, block_size=16, group=4)
    cus = dispatch.arch_facts("gfx942").num_cus
    few = _sel("paged_decode", "gfx942", num_seqs=2, num_kv_heads=8, **base)
    assert few.variant == "split_kv" and few.params["partition_size"] == 512
    assert few.params["reuse_kv_times"] == 4 and few.params["head_groups"] == 1
    fill = dispatch.core.FILL * cus  # programs (num_seqs x num_kv_heads) that fill the device
    many = _sel("paged_decode", "gfx942", num_seqs=fill // 8, num_kv_heads=8, **base)
    assert many.variant == "one_pass" and "partition_size" not in many.params
    assert _sel("paged_decode", "gfx942", num_seqs=fill // 8 - 1, num_kv_heads=8,
                **base).variant == "split_kv"
    short = _sel("paged_decode", "gfx942", num_seqs=1, num_kv_heads=8, max_seq_len=300, **base)
    assert short.variant == "one_pass"
    big = _sel("paged_decode", "sm_90", num_seqs=1, num_kv_heads=1, partition_size=128,
               **{**base, "group": 16})
    assert big.params["partition_size"] == 128
    assert _sel("paged_decode", "sm_90", **{**base, "group": 16}).params["partition_size"] == 256


def test_triton_decode_is_balanced():
    """sm_90: the balanced launch, for the Triton kernel and the Gluon forms alike (MHA, pages
    of >= 64 tokens); one pass when the context is short."""
    base = dict(dtype=BF16, head_dim=128, num_seqs=64, num_kv_heads=8)
    gqa = _sel("paged_decode", "sm_90", block_size=16, group=4, **base)
    assert (gqa.backend, gqa.variant) == ("triton", "balanced")
    assert gqa.params["partition_size"] == 512
    for group, bs in ((1, 16), (4, 64)):
        d = _sel("paged_decode", "sm_90", block_size=bs, group=group, **base)
        assert (d.backend, d.variant) == ("triton", "balanced"), (group, bs)
    assert _sel("paged_decode", "sm_90", block_size=16, group=4, max_seq_len=300,
                **base).variant == "one_pass"


def test_decisions_are_cached_per_shape_class():
    base = dict(dtype=BF16, head_dim=128, block_size=16, group=4, num_kv_heads=8)
    a = _sel("paged_decode", "gfx942", num_seqs=2, **base)
    b = _sel("paged_decode", "gfx942", num_seqs=3, **base)  # same class: does not fill
    assert a is b
    assert _sel("paged_decode", "gfx942", num_seqs=4096, **base) is not a


# ----------------------------------------------------------------------------------------------
# resolve: overrides, runtime supports(), no host sync
# ----------------------------------------------------------------------------------------------

def test_env_and_per_call_overrides(monkeypatch):
    if not triton_available():
        pytest.skip("needs triton (a forced triton backend is part of the check)")
    args = _decode_args()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert dispatch.explain("paged_decode", *args, quiet=True).backend == "torch"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("PAGEDATTN_BACKEND", "torch")
    d = dispatch.explain("paged_decode", *args, quiet=True)
    assert d.backend == "torch" and "PAGEDATTN_BACKEND=torch" in d.reasons[0]
    d = dispatch.explain("paged_decode", *args, backend="triton", quiet=True)  # call beats env
    assert d.backend == "triton", d.reasons
    monkeypatch.setenv("PAGEDATTN_BACKEND", "cuda")
    with pytest.raises(ValueError, match="PAGEDATTN_BACKEND"):
        pa.paged_decode(*args)
    monkeypatch.delenv("PAGEDATTN_BACKEND")
    with pytest.raises(ValueError, match="backend"):
        pa.paged_decode(*args, backend="cuda")


@pytest.mark.parametrize("how", ["call", "env"])
def test_forced_unsupported_backend_raises_with_reasons(monkeypatch, how):
    args = _decode_args()
    kw = {"backend": "hip"}
    if how == "env":
        monkeypatch.setenv("PAGEDATTN_BACKEND", "hip")
        kw = {}
    with pytest.raises(ValueError, match=r"'hip'.*cannot serve paged_decode.*not built"):
        pa.paged_decode(*args, **kw)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("PAGEDATTN_BACKEND", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET is not set"):
        pa.paged_decode(*args, backend="triton")
    with pytest.raises(ValueError, match=r"head_dim 80 not in \[64, 128\]"):
        select("paged_decode", "gfx942", dtype=F16, head_dim=80, block_size=16, group=2,
               backend="hip")


def test_backend_supports_has_final_word(monkeypatch):
    """A declared-supported backend whose module refuses is skipped (auto) or raises (forced)."""
    tk = importlib.import_module("pagedattn.triton_kernels")
    monkeypatch.setattr(tk, "supports", lambda op, **f: ["kernel says no"])
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    args = _decode_args(torch.float16)
    d = dispatch.explain("paged_decode", *args, quiet=True)
    assert d.backend == "torch"
    assert any("triton skipped: kernel says no" in r for r in d.reasons), d.reasons
    with pytest.raises(ValueError, match="kernel says no"):
        pa.paged_decode(*args, backend="triton")


@pytest.mark.parametrize("interp", ["0", "1"])
def test_resolve_reads_no_device_data(monkeypatch, interp):
    """No .item()/.cpu()/bool() on tensors in resolve: CUDA-graph capturable."""
    monkeypatch.setenv("TRITON_INTERPRET", interp)
    q, k, v, table, lens = _decode_args(torch.float16)
    g = pa.layouts.cache_geometry(k, "bhsd")
    opts = pa.validation.attn_options(q=q, g=g, kv_dtype=k.dtype, scale=None, k_scale=None,
                                      v_scale=None, sliding_window=None, logit_cap=None,
                                      alibi_slopes=None, sinks=None)

    def boom(*a, **kw):
        raise AssertionError("host sync in resolve")

    for name in ("item", "cpu", "tolist", "numpy", "__bool__", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, boom)
    for _ in range(2):
        name, mod = dispatch.resolve("paged_decode", "auto", q=q, k_cache=k, layout="bhsd",
                                     geom=g, opts=opts)
    assert name in dispatch.BACKENDS and hasattr(mod, "paged_decode")
