"""The Gluon sm_90 decode kernels (``_decode_gluon``): the gate and the knobs on any machine,
launches (against the float64 oracle, split == one pass bit for bit) on the H200."""
import importlib

import pytest
import torch

import pagedattn as pa
from attn_utils import FP8, make_paged_batch, tol_key
from test_triton_decode import _check, _decode

PD = importlib.import_module("pagedattn.triton_kernels.decode")

KERNEL_ENV = "PAGEDATTN_DEV_DECODE_KERNEL"


def test_decode_kernel_override_and_forms(monkeypatch):
    """The internal kernel override is validated; the Gluon forms follow the rows and the tile:
    swap for one row (MHA decode) on 64-token tiles, with one partition per split program,
    rows otherwise."""
    monkeypatch.setenv(KERNEL_ENV, "fast")
    with pytest.raises(ValueError, match=KERNEL_ENV):
        PD.variant()
    for name in ("gluon", "triton", "auto"):
        monkeypatch.setenv(KERNEL_ENV, name)
        assert PD.variant() == name
    monkeypatch.delenv(KERNEL_ENV)
    assert PD.variant() == "auto"
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from pagedattn.triton_kernels import _decode_gluon as G
    assert G.form(1, 64) == G.form(1, 128) == "swap" and G.one_partition(1, 64)
    assert G.form(1, 32) == G.form(2, 64) == G.form(4, 64) == "rows"
    assert not G.one_partition(2, 64)
    assert G.occupancy(4, 64) == (4, None)


def test_decode_auto_variant_rule(monkeypatch):
    """``auto`` hands the Gluon kernel MHA calls and calls on pages of >= one Gluon tile, never
    GQA on shorter pages; ``gluon`` everything its gate accepts; ``triton`` nothing (host-only:
    the module and its gate are stubbed)."""
    from types import SimpleNamespace as NS
    fake = NS(tile=lambda: (64, 2), unsupported=lambda *a: [])
    monkeypatch.setattr(PD, "gluon_kernel", lambda: fake)
    cuda = NS(type="cuda")

    def picked(hq, hkv, bs):
        call = NS(q=torch.empty(1, hq, 8), geom=NS(num_kv_heads=hkv, block_size=bs))
        gk, tile = PD._gluon(call, None, None, hq // hkv, 512, cuda)
        assert (tile == (64, 2)) == (gk is fake)
        return gk is fake
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    assert picked(8, 8, 16) and picked(8, 2, 64) and picked(8, 2, 128)
    assert not picked(8, 2, 16) and not picked(8, 2, 32)
    monkeypatch.setenv(KERNEL_ENV, "gluon")
    assert picked(8, 2, 16)
    monkeypatch.setenv(KERNEL_ENV, "triton")
    assert not picked(8, 8, 64)
    assert PD._gluon(NS(q=torch.empty(1, 8, 8), geom=NS(num_kv_heads=8, block_size=64)), None,
                     None, 1, 512, NS(type="cpu")) == (None, None)


def test_gluon_decode_unsupported_reasons(monkeypatch):
    """The Gluon decode gate names every reason a call cannot use it, and none of them depends
    on the batch (checked on the host, so on any machine)."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from pagedattn import layouts as L
    from pagedattn.triton_kernels import _decode_gluon as G
    calls = []
    monkeypatch.setattr(PD, "run", lambda call: (calls.append(call), call.out.zero_())[0] and None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors through backend="triton"

    def reasons(layout="bhsd", d=128, bs=16, heads=(32, 8), lq=1, dtype=torch.float16,
                kv_dtype=None, batch=2, part=512, **kw):
        hq, hkv = heads
        kc, vc = pa.make_kv_cache(8, bs, hkv, d, layout=layout, dtype=kv_dtype or dtype)
        q = torch.randn((batch, hq, d) if lq == 1 else (batch, lq, hq, d), dtype=dtype)
        sc = torch.ones(hkv) if kv_dtype in FP8 else None
        pa.paged_decode(q, kc, vc, torch.zeros(batch, 8, dtype=torch.int32),
                        torch.full((batch,), lq, dtype=torch.int32), layout=layout,
                        backend="triton",
                        k_scale=sc, v_scale=sc, **kw)
        c = calls.pop()
        return G.unsupported(c, L.k_strides(c.k_cache, layout), L.v_strides(c.v_cache, layout),
                             (hq // hkv) * lq, part, G.tile()[0])

    base = reasons()
    assert base == ["not an sm_90 GPU"], base  # the CPU: only the device is wrong
    assert reasons(batch=1) == reasons(batch=7) == base  # never the batch
    assert reasons(layout="bshd", d=64, bs=1, heads=(64, 1)) == base
    assert reasons(heads=(32, 8), lq=16) == base  # 64 rows
    assert reasons(bs=256, part=64) == base
    more = {
        "one 16-bit dtype": reasons(dtype=torch.float32),
        "16-bit dtype ": reasons(kv_dtype=torch.float8_e4m3fn),
        "head_dim": reasons(d=96),
        "rows": reasons(heads=(32, 8), lq=17),
        "window": reasons(sliding_window=8),
        "soft-cap": reasons(logit_cap=5.0),
        "ALiBi": reasons(alibi_slopes=torch.ones(32)),
        "sinks": reasons(sinks=torch.ones(32)),
        "contiguous": reasons(layout="vllm"),
        "contiguous ": reasons(layout="hcu"),
        "partition size": reasons(part=32),
    }
    for want, why in more.items():
        assert why[0] == base[0] and any(want.strip() in w for w in why[1:]), (want, why)


def _gluon_count(monkeypatch):
    """Counts the Gluon decode kernel's launches; skips where it cannot run."""
    G = PD.gluon_kernel()
    if G is None or not G.is_sm90(torch.device("cuda")):
        pytest.skip("the Gluon decode kernel runs on sm_90 under triton 3.6")
    n = [0]
    real = G.launch

    def counted(*a, **kw):
        n[0] += 1
        return real(*a, **kw)
    monkeypatch.setattr(G, "launch", counted)
    return n


GLUON_CASES = [  # dtype, layout, (Hq, Hkv), D, block, q_len, partition, lens
    (torch.bfloat16, "bhsd", (32, 8), 128, 16, 1, None, [1, 16, 64, 65, 511, 512, 4097, 9000]),
    (torch.float16, "bshd", (32, 32), 128, 64, 1, 64, [1, 63, 64, 700, 2048]),
    (torch.bfloat16, "bshd", (64, 1), 64, 1, 1, 256, [1, 3, 300, 257]),
    (torch.float16, "bhsd", (16, 2), 64, 256, 2, 512, [2, 255, 256, 257, 3000]),
    (torch.bfloat16, "bhsd", (32, 8), 128, 32, 4, 128, [4, 129, 1000, 5000]),
    (torch.bfloat16, "bshd", (8, 8), 128, 128, 1, 512, [1, 128, 129, 6000]),
    (torch.float16, "bhsd", (16, 16), 64, 16, 1, None, [1, 15, 16, 1000, 4100]),
    (torch.bfloat16, "bshd", (8, 8), 128, 1, 1, 64, [1, 2, 63, 64, 65, 777]),  # SGLang's pool
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(len(GLUON_CASES)))
def test_gpu_gluon_decode(case, device, mode_guard, monkeypatch):
    """The Gluon kernel (both forms: swap for MHA, rows otherwise) against the float64 oracle
    over dtypes, layouts, groups 1-64, D 64/128, blocks 1-256, speculative q_len, NaN-poisoned
    pages and table slack; split (1 and several partitions per program) == one pass, bit for
    bit; it really ran."""
    qd, layout, (hq, hkv), d, bs, q_len, part, lens = GLUON_CASES[case]
    n = _gluon_count(monkeypatch)
    monkeypatch.setenv(KERNEL_ENV, "gluon")
    gen = torch.Generator().manual_seed(100 + case)
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=d, block_size=bs, layout=layout,
                         dtype=qd, device=device, gen=gen, exact_capacity=case % 2 == 0)
    shape = (len(lens), hq, d) if q_len == 1 else (len(lens), q_len, hq, d)
    q = (3 * torch.randn(shape, generator=gen)).to(device=device, dtype=qd)
    one, one_lse = _decode(b, q, mode="one_pass", partition_size=part, return_lse=True)
    assert n[0] == 1, "the Gluon kernel did not run"
    for ppp in (1, 2, None):
        monkeypatch.setattr(PD, "PPP", ppp)
        out = torch.full_like(q, float("nan"))
        _, lse = _decode(b, q, mode="split", partition_size=part, return_lse=True, out=out)
        bad = (out != one).flatten(0, -3).any(-1).nonzero()[:5].tolist()
        assert torch.equal(out, one), f"ppp {ppp}: differing (seq, head): {bad}"
        assert torch.equal(lse, one_lse), f"ppp {ppp}: lse"
    assert n[0] == 4
    _check(b, q, one, one_lse, lens, q_len, tol_key(qd, qd))


@pytest.mark.gpu
def test_gpu_decode_default_picks_gluon_for_mha_or_long_pages(device, mode_guard, monkeypatch):
    """The default (PAGEDATTN_DEV_DECODE_KERNEL=auto) runs the Gluon kernel for MHA and for pages
    of >= 64 tokens, the Triton kernel for GQA on shorter pages; ``triton`` never runs it."""
    n = _gluon_count(monkeypatch)
    gen = torch.Generator().manual_seed(5)
    for (hq, hkv), bs, env, want in (((8, 8), 16, None, 1), ((8, 2), 16, None, 0),
                                     ((8, 2), 64, None, 1), ((8, 8), 16, "triton", 0),
                                     ((8, 2), 16, "gluon", 1)):
        if env:
            monkeypatch.setenv(KERNEL_ENV, env)
        else:
            monkeypatch.delenv(KERNEL_ENV, raising=False)
        b = make_paged_batch([100, 700], num_kv_heads=hkv, head_dim=128, block_size=bs,
                             layout="bhsd", dtype=torch.bfloat16, device=device, gen=gen)
        q = torch.randn(2, hq, 128, generator=gen).to(device=device, dtype=torch.bfloat16)
        before = n[0]
        out = _decode(b, q, mode="split", partition_size=512)
        assert n[0] - before == want, ((hq, hkv), bs, env)
        _check(b, q, out, None, [100, 700], 1, tol_key(q.dtype, q.dtype))
