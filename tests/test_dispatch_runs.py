"""Backend selection (docs/dispatch.md): explain and the CLI, the declared-capability
tables against the backends, and "declared => really runs" (through the public op, against the
independent dense oracle). The pure decision table is in test_dispatch.py."""
import importlib
import os
import subprocess
import sys

import pytest
import torch

import pagedattn as pa
from pagedattn import dispatch
from pagedattn.dispatch import capabilities as C
from attn_utils import (FP8, assert_attn_close, assert_lse_close, dense_attention, dense_get,
                        dense_kv, make_paged_batch, tol_key)
from dispatch_utils import ATTN_OPS, DTYPES, _clean_dispatch, _decode_args  # noqa: F401


# ----------------------------------------------------------------------------------------------
# explain and the module CLI
# ----------------------------------------------------------------------------------------------

def test_explain_prints_and_returns(capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    d = dispatch.explain("paged_decode", *_decode_args(), layout="bhsd", return_lse=True)
    out = capsys.readouterr().out
    assert isinstance(d, dispatch.Decision) and d.backend == "torch"
    assert out.startswith("paged_decode -> torch") and "triton skipped" in out
    with pytest.raises(TypeError, match="paged_decode"):
        dispatch.explain("paged_decode", torch.zeros(1), bogus=1)
    with pytest.raises(ValueError, match="op"):
        dispatch.explain("decode")


def test_module_cli_runs_on_cpu():
    env = {k: v for k, v in os.environ.items() if k not in ("PAGEDATTN_BACKEND",)}
    env["TRITON_INTERPRET"] = "0"
    r = subprocess.run([sys.executable, "-m", "pagedattn.dispatch", "--all-archs"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "arch " + dispatch.detect_arch() in r.stdout and "decode, 1 seq" in r.stdout
    assert "extend, tree mask" in r.stdout and "self-check record: " in r.stdout
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in r.stdout.splitlines() if line.startswith("| gfx") or
            line.startswith("| sm_")}
    # AMD and Hygon: Triton (the portable backend) from the table alone and once verified; the
    # HIP kernels, never run there, are not picked
    for arch in ("gfx90a", "gfx942", "gfx936", "gfx928"):
        assert rows[arch][-2:] == ["triton", "triton"], (arch, rows[arch])
    assert rows["sm_90"][-2:] == ["triton", "triton"]


def test_module_cli_help_and_unknown_flags(capsys):
    """argparse: --help prints the usage and exits 0, a flag it does not know exits 2 (it ran the
    whole report and ignored both)."""
    main = importlib.import_module("pagedattn.dispatch.__main__").main
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m pagedattn.dispatch [-h] "
                                              "[--all-archs]")
    with pytest.raises(SystemExit) as e:
        main(["--all-arch", "x"])
    assert e.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_without_triton_the_reason_says_so(monkeypatch):
    """The reason names the missing package, not the TRITON_INTERPRET setting that cannot help."""
    monkeypatch.setattr("pagedattn._triton.triton_available", lambda: False)
    monkeypatch.setattr("pagedattn.triton_kernels.triton_available", lambda: False)
    for interp in ("0", "1"):
        monkeypatch.setenv("TRITON_INTERPRET", interp)
        d = dispatch.explain("paged_decode", *_decode_args(), quiet=True)
        assert d.backend == "torch"
        assert "triton skipped: triton is not installed" in d.reasons, d.describe()
        assert not any("TRITON_INTERPRET" in r for r in d.reasons), d.describe()


# ----------------------------------------------------------------------------------------------
# declared => really runs (through the public op, against the independent dense oracle)
# ----------------------------------------------------------------------------------------------

FEATURE_KW = {  # feature -> public-op keywords that request it (hq = 4 in these runs)
    "sinks": lambda: {"sinks": torch.randn(4) * 2},
    "alibi": lambda: {"alibi_slopes": torch.rand(4) * 0.5},
    "window": lambda: {"sliding_window": 3},
    "soft_cap": lambda: {"logit_cap": 2.0},
    "lse": lambda: {"return_lse": True},
}


def _dv(d, feats):
    """V's width: 40 for the head_dim_v feature (K and V of different widths), else K's."""
    return 40 if "head_dim_v" in feats else None


def _dense_kw(kw):
    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731 (the oracle runs on the CPU)
    return dict(window=kw.get("sliding_window"), cap=kw.get("logit_cap"),
                alibi=cpu(kw.get("alibi_slopes")), sinks=cpu(kw.get("sinks")))


def _check(out, ref, dtype, kv, lse=None, ref_lse=None):
    key = tol_key(dtype, kv)
    assert_attn_close(out, ref, key, magnitude_guard=key in (torch.float32, torch.float16))
    assert ref.abs().mean() > 0.05  # not a vacuous all-zero case
    if lse is not None:
        assert_lse_close(lse, ref_lse, key)


def run_decode(backend, dtype, kv, layout, *, d=64, bs=16, hkv=2, group=2, q_len=1, feats=(),
               seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    hq = hkv * group
    lens = [max(q_len, 9), 0 if q_len == 1 else q_len, max(q_len, 2 * bs + 3)]
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=d, block_size=bs, layout=layout,
                         dtype=kv, device=device, gen=gen, head_dim_v=_dv(d, feats))
    shape = (len(lens), hq, d) if q_len == 1 else (len(lens), q_len, hq, d)
    q = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    kw = {}
    for f in feats:
        kw.update({k: (v[:hq] if isinstance(v, torch.Tensor) else v)
                   for k, v in FEATURE_KW.get(f, dict)().items()})
    if hq != 4:
        kw = {k: (torch.rand(hq) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    res = pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout=layout,
                          k_scale=b.k_scale, v_scale=b.v_scale, backend=backend, **kw)
    out, lse = res if kw.get("return_lse") else (res, None)
    q4 = q if q_len > 1 else q.unsqueeze(1)
    for i, n in enumerate(lens):
        o4 = out[i] if q_len > 1 else out[i].unsqueeze(0)
        if n == 0:
            assert torch.all(o4 == 0)
            continue
        k, v = dense_kv(b, i, n)
        ro, rl = dense_attention(q4[i].cpu(), k.cpu(), v.cpu(), range(n - q_len, n),
                                 scale=d ** -0.5, **_dense_kw(kw))
        _check(o4, ro, dtype, kv, None if lse is None else
               (lse[i] if q_len > 1 else lse[i].unsqueeze(0)), rl)


def run_extend(backend, dtype, kv, layout, *, d=64, bs=16, hkv=2, group=2, feats=(), seed=0,
               device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    hq = hkv * group
    lq, lens = [3, 2], [7, bs + 4]
    prefix = [n - m for n, m in zip(lens, lq)]
    k_new = "k_new" in feats
    dv = _dv(d, feats) or d
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=d, block_size=bs, layout=layout,
                         dtype=kv, device=device, gen=gen, fill_upto=prefix if k_new else None,
                         head_dim_v=dv)
    q = torch.randn(sum(lq), hq, d, generator=gen).to(device=device, dtype=dtype)
    cu = torch.tensor([0, lq[0], sum(lq)], dtype=torch.int32, device=device)
    kw = {k: v.to(device) if isinstance(v, torch.Tensor) else v
          for f in feats if f in FEATURE_KW for k, v in FEATURE_KW[f]().items()}
    if k_new:
        kw["k_new"] = torch.randn(sum(lq), hkv, d, generator=gen).to(device=device, dtype=dtype)
        kw["v_new"] = torch.randn(sum(lq), hkv, dv, generator=gen).to(device=device, dtype=dtype)
    masks = None
    if "tree_mask" in feats:
        masks = [torch.rand(m, n, generator=gen) < 0.6 for m, n in zip(lq, lens)]
        kw["custom_mask"] = torch.cat([m.reshape(-1) for m in masks]).to(device)
        kw["mask_indptr"] = torch.tensor([0, lq[0] * lens[0], lq[0] * lens[0] + lq[1] * lens[1]],
                                         dtype=torch.int32, device=device)
    if "non_causal" in feats:
        kw["causal"] = False
    res = pa.extend_attention(q, b.k_cache, b.v_cache, b.block_table, cu, b.seq_lens,
                              layout=layout, k_scale=b.k_scale, v_scale=b.v_scale,
                              backend=backend, **kw)
    out, lse = res if kw.get("return_lse") else (res, None)
    for i, (m, n) in enumerate(zip(lq, lens)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        k, v = dense_kv(b, i, n - m if k_new else n)
        if k_new:
            k = torch.cat([k, kw["k_new"][rows].cpu().double()])
            v = torch.cat([v, kw["v_new"][rows].cpu().double()])
        ro, rl = dense_attention(q[rows].cpu(), k.cpu(), v.cpu(), range(n - m, n), scale=d ** -0.5,
                                 causal=kw.get("causal", True),
                                 mask=None if masks is None else masks[i], **_dense_kw(kw))
        _check(out[rows], ro, dtype, kv, None if lse is None else lse[rows], rl)


def _kv_dtypes(dtype):
    return [dtype, torch.float8_e4m3fn, torch.float8_e5m2]


TORCH_CROSS = [(dt, kv, lay) for dt in DTYPES for kv in _kv_dtypes(dt) for lay in C.LAYOUTS]


@pytest.mark.parametrize("dtype,kv,layout", TORCH_CROSS,
                         ids=[f"{str(a)[6:]}-{str(b)[6:]}-{c}" for a, b, c in TORCH_CROSS])
def test_torch_declared_dtype_layout_cross_runs(dtype, kv, layout):
    """Every (dtype, kv dtype, layout) the torch backend declares, both attention ops."""
    for op in ATTN_OPS:
        assert not C.unsupported("torch", op, dispatch.arch_facts("cpu"), dtype=dtype,
                                 kv_dtype=kv, layout=layout)
    run_decode("torch", dtype, kv, layout)
    run_extend("torch", dtype, kv, layout)


# one factor at a time over the other declared dimensions ("any" -> representative values)
TORCH_ONE_FACTOR = (
    [("paged_decode", {"feats": (f,)}) for f in sorted(C.TORCH.ops["paged_decode"].features)
     if f != "spec_decode"]
    + [("paged_decode", {"q_len": 3}), ("paged_decode", {"d": 80, "bs": 1, "group": 1}),
       ("paged_decode", {"bs": 4, "group": 5, "hkv": 1}), ("paged_decode", {"d": 256})]
    + [("extend_attention", {"feats": (f,)})
       for f in sorted(C.TORCH.ops["extend_attention"].features)]
    + [("extend_attention", {"d": 80, "bs": 1, "group": 1}),
       ("extend_attention", {"bs": 4, "group": 5, "hkv": 1})])


@pytest.mark.parametrize("op,kw", TORCH_ONE_FACTOR,
                         ids=[f"{o[:6]}-" + "-".join(f"{k}{v}" for k, v in kw.items())
                              for o, kw in TORCH_ONE_FACTOR])
def test_torch_declared_features_shapes_run(op, kw):
    run = run_decode if op == "paged_decode" else run_extend
    run("torch", torch.float32, torch.float32, "bshd", **kw)


@pytest.mark.parametrize("kv", [torch.float16, torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("layout", C.LAYOUTS)
def test_torch_declared_store_and_copy_run(kv, layout):
    kc, vc = pa.make_kv_cache(4, 4, 2, 64, layout=layout, dtype=kv)
    kc.zero_(), vc.zero_()
    k, v = torch.randn(3, 2, 64, dtype=torch.float16), torch.randn(3, 2, 64, dtype=torch.float16)
    sc = {"k_scale": 0.5, "v_scale": 2.0} if kv in FP8 else {}
    pa.store_kv(k, v, kc, vc, torch.tensor([5, 6, -1]), layout=layout, backend="torch", **sc)
    for cache, which, x, s in ((kc, "k", k, sc.get("k_scale", 1.0)),
                               (vc, "v", v, sc.get("v_scale", 1.0))):
        for t, slot in ((0, 5), (1, 6)):
            want = (x[t].float() / s).clamp(-torch.finfo(kv).max, torch.finfo(kv).max).to(kv)
            assert torch.equal(dense_get(cache, layout, which, slot // 4, slot % 4).float(),
                               want.float())
    pa.copy_blocks(kc, vc, [(1, 3)], backend="torch")
    assert torch.equal(kc[3].float(), kc[1].float()) and torch.equal(vc[3].float(), vc[1].float())


def _kernel_module(op):
    """The Triton module serving ``op`` (a missing module fails the test: every op has one)."""
    from pagedattn.triton_kernels import _MODULES
    return importlib.import_module(_MODULES[op])


# Triton under the interpreter: a small subset (each launch costs ~1 s on 2 cores).
TRITON_CPU = [
    ("paged_decode", torch.float16, torch.float16, "bhsd", {"group": 4}),
    ("paged_decode", torch.float32, torch.float8_e5m2, "vllm", {"bs": 1, "group": 1}),
    ("paged_decode", torch.float16, torch.float16, "hcu", {"feats": ("window", "soft_cap",
                                                                      "lse")}),
    ("extend_attention", torch.float16, torch.float16, "bshd", {"group": 2}),
    ("extend_attention", torch.float32, torch.float8_e4m3fn, "bhsd", {"feats": ("k_new",)}),
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tier runs the full grid")
@pytest.mark.parametrize("op,dtype,kv,layout,kw", TRITON_CPU,
                         ids=[f"{c[0][:6]}-{str(c[2])[6:]}-{c[3]}" for c in TRITON_CPU])
def test_triton_declared_runs_under_interpreter(monkeypatch, op, dtype, kv, layout, kw):
    _kernel_module(op)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    feats = frozenset(kw.get("feats", ()))
    assert not C.unsupported("triton", op, dispatch.arch_facts("cpu"), dtype=dtype, kv_dtype=kv,
                             layout=layout, block_size=kw.get("bs", 16),
                             group=kw.get("group", 2), features=feats, interpret=True)
    (run_decode if op == "paged_decode" else run_extend)("triton", dtype, kv, layout, **kw)


def _facts_for(op, dtype, kv, layout, d, bs, group, q_len=1, device="cpu"):
    """Facts as the public op passes them to resolve (tiny tensors; nothing launched)."""
    hkv = 1
    k, _ = pa.make_kv_cache(2, bs, hkv, d, layout=layout, dtype=kv, device=device)
    shape = (1, hkv * group, d) if q_len == 1 else (1, q_len, hkv * group, d)
    q = torch.zeros(shape, dtype=dtype, device=device)
    g = pa.layouts.cache_geometry(k, layout)
    sc = 1.0 if kv in FP8 else None
    opts = pa.validation.attn_options(q=q, g=g, kv_dtype=kv, scale=None, k_scale=sc,
                                      v_scale=sc, sliding_window=None, logit_cap=None,
                                      alibi_slopes=None, sinks=None)
    return dict(q=q, k_cache=k, layout=layout, geom=g, opts=opts)


@pytest.mark.parametrize("backend,package", [("triton", "pagedattn.triton_kernels"),
                                             ("hip", "pagedattn.hip_kernels")])
def test_declared_table_agrees_with_backend_supports(monkeypatch, backend, package):
    """capabilities.py vs the backend module's own supports(), where the module imports."""
    mod = importlib.import_module(package)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    monkeypatch.setenv("TRITON_INTERPRET", "1" if dev == "cpu" else "0")
    arch = dispatch.detect_arch(dev)
    facts = dispatch.device_facts(dev)
    dtypes = [dt for dt in (torch.float16, torch.float32) if dt in facts.dtypes]
    checked, disagree = 0, []
    for op in ATTN_OPS:
        if backend == "triton":
            _kernel_module(op)
        for dt in dtypes:
            for d in (64, 80, 128, 256):
                for bs in (1, 16):
                    for group in (1, 8, 128, 200):
                        for q_len in ((1, 4) if op == "paged_decode" else (1,)):
                            call = _facts_for(op, dt, dt, "bhsd", d, bs, group, q_len, dev)
                            declared = C.unsupported(
                                backend, op, facts, dtype=dt, kv_dtype=dt, layout="bhsd",
                                head_dim=d, block_size=bs, group=group, q_len=q_len,
                                features=frozenset({"spec_decode"} if q_len > 1 else ()),
                                interpret=dev == "cpu")
                            actual = list(mod.supports(op, **call))
                            checked += 1
                            if bool(declared) != bool(actual):
                                disagree.append((op, arch, dt, d, bs, group, q_len, declared,
                                                 actual))
    if backend == "hip" and all(d[-1] for d in disagree) and len(disagree) == checked:
        pytest.skip(f"hip backend unavailable here: {disagree[0][-1]}")
    assert not disagree, f"{len(disagree)}/{checked} disagree, first: {disagree[:3]}"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "hip"])
def test_gpu_declared_combinations_run(backend):
    """H200 tier: every declared-supported combination of a small grid runs and is correct."""
    dev = "cuda"
    facts = dispatch.device_facts(dev)
    ran = 0
    for op in ATTN_OPS:
        for dt in (torch.float16, torch.bfloat16):
            for kv in _kv_dtypes(dt):
                for layout in C.LAYOUTS:
                    for bs, group in ((1, 1), (16, 4), (64, 16)):
                        why = C.unsupported(backend, op, facts, dtype=dt, kv_dtype=kv,
                                            layout=layout, head_dim=128, block_size=bs,
                                            group=group)
                        call = _facts_for(op, dt, kv, layout, 128, bs, group, device=dev)
                        if why or dispatch.load(backend).supports(op, **call):
                            continue
                        run = run_decode if op == "paged_decode" else run_extend
                        run(backend, dt, kv, layout, d=128, bs=bs, group=group, device=dev)
                        ran += 1
    if not ran:
        pytest.skip(f"{backend}: nothing declared and available on {facts.arch}")
