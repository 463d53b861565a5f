"""The eager fast path of the Triton backend (``triton_kernels/_replay.py``).

CPU: the recorder and replay mechanics on stand-in kernels, the decode metadata key, and the
refusals (aliased tensors, unnamed tensors, CPU tensors). GPU: a replayed call equals the normal
path bit for bit over both decode kernels, both launch shapes, fp8 with float scales, options,
lse, speculative q_len and misaligned views, and inside a CUDA graph.
"""
import importlib

import pytest
import torch

import pagedattn as pa
from attn_utils import (assert_attn_close, dense_attention, dense_kv, make_paged_batch,
                        replay_in_cuda_graph, tol_key)

R = importlib.import_module("pagedattn.triton_kernels._replay")
PD = importlib.import_module("pagedattn.triton_kernels.decode")


# ----------------------------------------------------------------------------------------------
# CPU: mechanics on stand-ins
# ----------------------------------------------------------------------------------------------

class _Kernel:
    """A compiled kernel stand-in: records what its launcher got."""

    function, packed_metadata = "fn", ("meta",)

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)


class _JF:
    pre_run_hooks = []


def test_recorder_replays_with_the_calls_tensors(monkeypatch):
    monkeypatch.setattr(R, "bound_params",
                        lambda jf, args, kw: dict(zip(("a", "b", "n", "ws", "d", "C"),
                                                      args + tuple(kw.values()))))
    q, k, ws, dummy = torch.ones(2), torch.ones(3), torch.ones(4), torch.ones(1)
    rec = R.Recorder({id(q): "q", id(k): "k", id(ws): "ws", id(dummy): "dummy"},
                     {"ws": ((4, 2), torch.float32)}, {"dummy": dummy})
    kern = _Kernel()
    rec.add(_JF(), kern, (3, 2), (q, k, 7), dict(ws=ws, d=dummy, C=True))
    rep = rec.replay()
    assert rep is not None and not kern.calls  # recording does not launch
    q2, k2 = torch.zeros(2), torch.zeros(3)
    vals = rep({"q": q2, "k": k2}, torch.device("cpu"), 99)
    (args,) = kern.calls
    assert args[:7] == (3, 2, 1, 99, "fn", ("meta",), None) and args[7:9] == (None, None)
    a, b, n, w, d, c = args[9:]
    assert a is q2 and b is k2 and n == 7 and d is dummy and c is True
    assert w is vals["ws"] and w is not ws and w.shape == (4, 2) and w.dtype == torch.float32


def test_recorder_refuses_a_tensor_it_cannot_name(monkeypatch):
    monkeypatch.setattr(R, "bound_params", lambda jf, args, kw: {"a": args[0], "b": args[1]})
    q = torch.ones(2)
    rec = R.Recorder({id(q): "q"}, {}, {})
    rec.add(_JF(), _Kernel(), (1,), (q, torch.ones(2)), {})
    assert rec.replay() is None
    rec = R.Recorder({id(q): "q"}, {}, {})
    hooked = _JF()
    hooked.pre_run_hooks = [print]
    rec.add(hooked, _Kernel(), (1,), (q, 1), {})
    assert rec.replay() is None  # pre-run hooks must run: no replay
    assert R.Recorder({}, {}, {}).replay() is None  # nothing recorded


def _capture_call(monkeypatch, **kw):
    """The validated DecodeCall paged_decode hands the Triton backend (CPU tensors)."""
    calls = []
    monkeypatch.setattr(PD, "run", lambda call: calls.append(call))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    d = kw.pop("d", 64)
    kc, vc = pa.make_kv_cache(8, 16, 2, d, dtype=kw.pop("kv_dtype", torch.float16))
    if kw.pop("same_kv", False):
        vc = kc
    q = kw.pop("q", None)
    q = torch.randn(2, 4, d, dtype=torch.float16) if q is None else q
    pa.paged_decode(q, kc, vc, torch.zeros(2, 4, dtype=torch.int32),
                    torch.tensor([3, 9], dtype=torch.int32), backend="triton", **kw)
    return calls.pop()


def test_decode_key_follows_the_metadata(monkeypatch):
    """Equal for fresh tensors of the same metadata; different for every input a launch
    argument or Triton's specialisation depends on."""
    base = R.decode_key(_capture_call(monkeypatch), None, 0)
    assert R.decode_key(_capture_call(monkeypatch), None, 0) == base
    flat = torch.randn(2 * 4 * 64 + 1, dtype=torch.float16)
    h16 = dict(dtype=torch.float16)
    others = {
        "misaligned q": _capture_call(monkeypatch, q=flat[1:].view(2, 4, 64)),
        "q strides": _capture_call(monkeypatch, q=torch.randn(4, 2, 64, **h16).transpose(0, 1)),
        "head dim": _capture_call(monkeypatch, d=128, q=torch.randn(2, 4, 128, **h16)),
        "scale": _capture_call(monkeypatch, scale=0.3),
        "window": _capture_call(monkeypatch, sliding_window=4),
        "cap": _capture_call(monkeypatch, logit_cap=2.0),
        "sinks": _capture_call(monkeypatch, sinks=torch.zeros(4)),
        "partition": _capture_call(monkeypatch, partition_size=64),
        "lse": _capture_call(monkeypatch, return_lse=True),
        "fp8": _capture_call(monkeypatch, kv_dtype=torch.float8_e4m3fn, k_scale=0.5,
                             v_scale=0.5),
    }
    keys = {name: R.decode_key(c, None, 0) for name, c in others.items()}
    keys["force mode"] = R.decode_key(_capture_call(monkeypatch), "split", 0)
    # decode.run passes its test overrides (FORCE_MODE, PPP, BALANCE): each is in the key
    keys["partitions per program"] = R.decode_key(_capture_call(monkeypatch), (None, 2, None), 0)
    keys["balance plan"] = R.decode_key(_capture_call(monkeypatch), (None, None, (1, 2, 3)), 0)
    keys["device"] = R.decode_key(_capture_call(monkeypatch), None, 1)
    for knob in R.DECODE_KNOBS[:-1]:
        monkeypatch.setenv(knob, "x")
        keys[knob] = R.decode_key(_capture_call(monkeypatch), None, 0)
        monkeypatch.delenv(knob)
    for name, key in keys.items():
        assert key != base, name
    assert len(set(keys.values())) == len(keys)


def test_aliased_tensors_are_part_of_the_key(monkeypatch):
    """One object in two argument slots (here k_cache is v_cache) keys apart from two objects, so
    the slot the recorder gives both holds the right tensor on every call of the key."""
    base = R.decode_key(_capture_call(monkeypatch), None, 0)
    call = _capture_call(monkeypatch, same_kv=True)
    assert call.k_cache is call.v_cache
    assert R.decode_key(call, None, 0) != base
    dummy = torch.empty(1)
    rec = R.decode_recorder(call, call.q, call.out, dummy, dummy, dummy, dummy)
    assert rec.allocs == {} and rec.slots[id(dummy)] == "dummy"
    assert rec.slots[id(call.k_cache)] in ("k", "v")


def test_float_scales_become_one_device_tensor(monkeypatch):
    """validation._scale_tensor: a float fp8 scale is made into a tensor once per value (no
    host-to-device copy per call, which would wait for the stream)."""
    a = _capture_call(monkeypatch, kv_dtype=torch.float8_e4m3fn, k_scale=0.5, v_scale=0.25)
    b = _capture_call(monkeypatch, kv_dtype=torch.float8_e4m3fn, k_scale=0.5, v_scale=0.5)
    assert a.opts.k_scale is b.opts.k_scale is b.opts.v_scale
    assert a.opts.v_scale.tolist() == [0.25, 0.25] and a.opts.k_scale.dtype == torch.float32


def test_replay_off_on_cpu_and_by_knob(monkeypatch):
    assert not R.enabled(torch.device("cpu"))
    monkeypatch.setenv("PAGEDATTN_LAUNCH_REPLAY", "0")
    assert not R.enabled(torch.device("cuda"))


# ----------------------------------------------------------------------------------------------
# GPU: replayed calls against the normal path
# ----------------------------------------------------------------------------------------------

REPLAY_CASES = {  # name: (Hq, Hkv, block, layout, kv dtype, q_len, lens, options, env)
    "gqa split (Triton kernel)": (32, 8, 16, "bhsd", torch.bfloat16, 1, [1, 700, 2049], {}, {}),
    "mha split (Gluon kernel)": (8, 8, 16, "bshd", torch.bfloat16, 1, [5, 1024, 3000], {}, {}),
    "gqa p64 one pass": (32, 8, 64, "bhsd", torch.float16, 1, [64, 65, 999] * 20, {},
                         {"PAGEDATTN_DEV_DECODE_MODE": "one_pass"}),
    "fp8 float scales, lse": (16, 4, 16, "vllm", torch.float8_e4m3fn, 1, [9, 1500], {}, {}),
    "fp8 one scale for k and v": (16, 4, 16, "bhsd", torch.float8_e5m2, 1, [9, 1500],
                                  {"one_scale": True}, {}),
    "options, q_len 3": (8, 2, 32, "hcu", torch.bfloat16, 3, [3, 40, 777],
                         dict(sliding_window=100, logit_cap=20.0, sinks=True), {}),
}


def _batch_and_q(case, device, seed):
    hq, hkv, bs, layout, kvd, q_len, lens, opts, _ = REPLAY_CASES[case]
    gen = torch.Generator().manual_seed(seed)
    scales = (0.5, 0.5 if opts.get("one_scale") else 0.25)
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=128, block_size=bs, layout=layout,
                         dtype=kvd, device=device, gen=gen, kv_scales=scales)
    qd = torch.float16 if kvd == torch.float16 else torch.bfloat16
    shape = (len(lens), hq, 128) if q_len == 1 else (len(lens), q_len, hq, 128)
    q = torch.randn(shape, generator=gen).to(device=device, dtype=qd)
    kw = dict(opts)
    if kw.pop("sinks", False):
        kw["sinks"] = torch.randn(hq, generator=gen).to(device)
    if kvd in (torch.float8_e4m3fn, torch.float8_e5m2):  # floats: one device tensor per value
        kw.update(k_scale=0.5, v_scale=0.5 if kw.pop("one_scale", False) else 0.25)
    return b, q, kw


def _call(b, q, kw, out=None):
    return pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout=b.layout,
                           backend="triton", out=out, return_lse=True, validate=False, **kw)


def _replays(monkeypatch):
    n = [0]
    real = R.Replay.__call__

    def counted(self, *a, **kw):
        n[0] += 1
        return real(self, *a, **kw)
    monkeypatch.setattr(R.Replay, "__call__", counted)
    return n


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(REPLAY_CASES))
def test_gpu_replay_equals_the_normal_path(case, device, monkeypatch):
    if not R.enabled(device):
        pytest.skip("launch replay needs triton 3.6 on CUDA")
    for k, v in REPLAY_CASES[case][-1].items():
        monkeypatch.setenv(k, v)
    n = _replays(monkeypatch)
    b, q, kw = _batch_and_q(case, device, 0)
    _call(b, q, kw)  # records
    assert n[0] == 0
    b, q, kw = _batch_and_q(case, device, 1)  # fresh data, same metadata
    out = torch.full_like(q, float("nan"))
    got, lse = _call(b, q, kw, out)
    assert n[0] == 1, "the second call was not replayed"
    monkeypatch.setenv("PAGEDATTN_LAUNCH_REPLAY", "0")
    want, want_lse = _call(b, q, kw, torch.full_like(q, float("nan")))
    assert n[0] == 1
    assert torch.equal(got, want) and torch.equal(lse, want_lse)
    # and against the oracle: a replay that launched nothing would fail here
    q4, o4 = (q, got) if q.dim() == 4 else (q.unsqueeze(1), got.unsqueeze(1))
    q_len = q4.shape[1]
    for i, s in enumerate(b.seq_lens.tolist()[:3]):
        k, v = dense_kv(b, i, s)
        ro, _ = dense_attention(q4[i].cpu(), k.cpu(), v.cpu(), range(s - q_len, s),
                                scale=128 ** -0.5, window=kw.get("sliding_window"),
                                cap=kw.get("logit_cap"),
                                sinks=None if "sinks" not in kw else kw["sinks"].cpu())
        assert_attn_close(o4[i], ro, tol_key(q.dtype, b.k_cache.dtype), what=f"seq {i}",
                          magnitude_guard=b.k_cache.dtype.itemsize > 1)


@pytest.mark.gpu
def test_gpu_replay_keeps_misaligned_views_apart(device, monkeypatch):
    """An aligned call records; a q 2 bytes off alignment (the Gluon gate refuses it, Triton
    specialises on it) records its own launches, and each replays its own."""
    if not R.enabled(device):
        pytest.skip("launch replay needs triton 3.6 on CUDA")
    n = _replays(monkeypatch)
    b, q, kw = _batch_and_q("mha split (Gluon kernel)", device, 2)
    flat = torch.empty(q.numel() + 1, dtype=q.dtype, device=device)
    q_off = flat[1:].view(q.shape)
    q_off.copy_(q)
    aligned, _ = _call(b, q, kw)
    off, _ = _call(b, q_off, kw)
    assert n[0] == 0
    assert torch.equal(_call(b, q_off, kw)[0], off) and torch.equal(_call(b, q, kw)[0], aligned)
    assert n[0] == 2
    torch.testing.assert_close(off, aligned, atol=2e-2, rtol=2e-2)  # two kernels, one answer
    monkeypatch.setenv("PAGEDATTN_LAUNCH_REPLAY", "0")
    assert torch.equal(_call(b, q_off, kw)[0], off)


@pytest.mark.gpu
def test_gpu_replay_inside_a_cuda_graph(device, monkeypatch):
    if not R.enabled(device):
        pytest.skip("launch replay needs triton 3.6 on CUDA")
    n = _replays(monkeypatch)
    b, q, kw = _batch_and_q("gqa split (Triton kernel)", device, 3)
    out = torch.empty_like(q)
    want, _ = _call(b, q, kw)  # records
    replay_in_cuda_graph(lambda: _call(b, q, kw, out), out)
    assert n[0] == 2 and torch.equal(out, want)


@pytest.mark.gpu
def test_gpu_decode_route_is_remembered_per_metadata_and_environment(device, monkeypatch):
    """api._decode_route resolves a GPU call's backend once per metadata key; the environment
    dispatch reads and dispatch.cache_clear are part of the key."""
    from pagedattn import api, dispatch
    seen = []
    real = dispatch.resolve
    monkeypatch.setattr(dispatch, "resolve", lambda *a, **kw: seen.append(a[1]) or real(*a, **kw))
    b, q, kw = _batch_and_q("gqa split (Triton kernel)", device, 4)
    run = lambda: pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens,  # noqa
                                  layout=b.layout, validate=False, **kw)
    first = run()
    run()
    assert len(seen) == 1
    monkeypatch.setenv("PAGEDATTN_BACKEND", "torch")
    ref = run()
    assert len(seen) == 2 and api._ROUTES
    dispatch.cache_clear()
    run()
    assert len(seen) == 3
    torch.testing.assert_close(first, ref, atol=2e-2, rtol=2e-2)


def test_env_values_follow_the_environment(monkeypatch):
    """config.values (the per-call reads behind the keys above) sees setenv and delenv."""
    from pagedattn import config
    key = config.names("PAGEDATTN_DEV_DECODE_MODE", "PAGEDATTN_DEV_DECODE_KERNEL")
    monkeypatch.delenv("PAGEDATTN_DEV_DECODE_MODE", raising=False)
    monkeypatch.delenv("PAGEDATTN_DEV_DECODE_KERNEL", raising=False)
    assert config.values(key) == (None, None)
    monkeypatch.setenv("PAGEDATTN_DEV_DECODE_KERNEL", "x")
    a, b = config.values(key)
    assert a is None and b in ("x", b"x")
    monkeypatch.delenv("PAGEDATTN_DEV_DECODE_KERNEL")
    assert config.values(key) == (None, None)


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bfloat16", "float8_e4m3fn"])
def test_gpu_store_kv_replay_equals_the_normal_path(kv, device, monkeypatch):
    """store_kv records once per metadata without the token count; later calls of any token
    count replay with their own grid and write the same bytes as the normal path."""
    if not R.enabled(device):
        pytest.skip("launch replay needs triton 3.6 on CUDA")
    n = _replays(monkeypatch)
    kvd = getattr(torch, kv)
    gen = torch.Generator(device=device).manual_seed(5)
    scales = dict(k_scale=0.5, v_scale=2.0) if kvd != torch.bfloat16 else {}

    def store(t, replay):
        monkeypatch.setenv("PAGEDATTN_LAUNCH_REPLAY", "1" if replay else "0")
        kc, vc = pa.make_kv_cache(64, 16, 4, 128, layout="vllm", dtype=kvd, device=device)
        kc.view(torch.uint8).fill_(0x7F)  # poison: every written byte must come from k/v
        vc.view(torch.uint8).fill_(0x7F)
        k = torch.randn(t, 4, 128, dtype=torch.bfloat16, device=device, generator=gen)
        v = torch.randn(t, 4, 128, dtype=torch.bfloat16, device=device, generator=gen)
        slots = torch.randperm(64 * 16, device=device, generator=gen)[:t]
        slots[::7] = -1  # padding tokens are skipped
        pa.store_kv(k, v, kc, vc, slots, layout="vllm", validate=False, **scales)
        return kc, vc, (k, v, slots)

    store(3, True)  # records
    gen.manual_seed(6)
    got = store(200, True)  # another token count: replayed
    assert n[0] == 1
    gen.manual_seed(6)
    want = store(200, False)
    assert n[0] == 1
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(got[1].view(torch.uint8), want[1].view(torch.uint8))
    assert (got[0].view(torch.uint8) != 0x7F).any()  # it wrote


@pytest.mark.gpu
def test_gpu_fp8_float_scales_in_a_cuda_graph(device, monkeypatch):
    """Float fp8 scales become one device tensor per value: a decode call with them can be
    captured after a warm-up call (a per-call host-to-device copy cannot be captured)."""
    b, q, kw = _batch_and_q("fp8 float scales, lse", device, 7)
    out = torch.empty_like(q)
    want, _ = _call(b, q, kw)
    replay_in_cuda_graph(lambda: _call(b, q, kw, out), out)
    assert torch.equal(out, want)
