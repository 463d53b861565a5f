"""What the compat entry points refuse, what they never do on the host, and the examples.

* Every docs/compat.md row whose status says "raises" has a call here that raises
  ``NotImplementedError`` naming that argument, and every such call has its row.
* The per-layer calls meant for CUDA graphs (FlashInfer's ``run``, the vLLM entry points, the
  SGLang ops with a context bound) read nothing back from the device: with pagedattn's op
  replaced by a recorder, the wrapper's own code runs with every host-read method of
  ``torch.Tensor`` raising.
* The scripts in examples/ run and check their own results.
"""
import contextlib
import glob
import os
import re
import runpy

import pytest
import torch

from compat_batches import i32
from test_compat_signatures import doc_tables
from pagedattn.compat import _flashinfer_prefill
from pagedattn.compat import flashinfer as F
from pagedattn.compat import sglang as S
from pagedattn.compat import vllm as VL

WS = torch.empty(0)
DEC, PRE = "flashinfer.BatchDecodeWithPagedKVCacheWrapper", \
    "flashinfer.BatchPrefillWithPagedKVCacheWrapper"
CACHE = torch.randn(2, 2, 16, 2, 32).half()  # NHD pages, K and V
Q1 = torch.randn(1, 4, 32).half()


def fi_decode(**kw):
    w = F.BatchDecodeWithPagedKVCacheWrapper(WS, "NHD")
    w.plan(i32([0, 1]), i32([1]), i32([3]), 4, 2, 32, 16, **kw)
    return w


def fi_prefill(**kw):
    w = F.BatchPrefillWithPagedKVCacheWrapper(WS, "NHD")
    w.plan(i32([0, 1]), i32([0, 1]), i32([1]), i32([3]), 4, 2, 32, 16, causal=True, **kw)
    return w


def sg_decode(k_scale=1.0, v_scale=1.0, **kw):
    pool = torch.randn(8, 2, 32).half()
    S.decode_attention_fwd(Q1, pool, kw.pop("v_buffer", pool), torch.empty_like(Q1), i32([0, 2]),
                           i32([3, 5]), None, None, None, 4, 0.2, k_scale, v_scale, **kw)


def sg_extend(*, k_scale=1.0, v_scale=1.0, is_causal=True, mask=None, **kw):
    pool = torch.randn(8, 2, 32).half()
    new = torch.randn(2, 2, 32).half()
    q = torch.randn(2, 4, 32).half()
    S.extend_attention_fwd(q, new, new, torch.empty_like(q), pool, pool, i32([0, 2]), i32([0, 1]),
                           i32([4]), mask, is_causal, None if mask is None else i32([0, 6]), 2,
                           k_scale, v_scale, **kw)


def vl_unified(q_lens=(1,), **kw):
    k = torch.randn(4, 16, 2, 32).half()
    q = torch.randn(sum(q_lens), 4, 32).half()
    VL.unified_attention(q, k, k, torch.empty_like(q), i32([0, sum(q_lens)]), max(q_lens),
                         i32([5]), 5, 0.2, kw.pop("causal", True), kw.pop("window", (-1, -1)),
                         i32([[1]]), 0.0, None, None, None, **kw)


def vl_legacy(fn, **kw):
    k, v = torch.randn(4, 2, 4, 16, 8).half(), torch.randn(4, 2, 32, 16).half()
    args = [torch.empty_like(Q1), Q1, k, v, 2, 0.2, i32([[1]]), i32([5]), 16, 5, None,
            kw.pop("kv_cache_dtype", "auto"), 1.0, 1.0]
    if fn is VL.paged_attention_v2:
        args[1:1] = [None, None, None]
    fn(*args, **kw)


ALIBI = {"pos_encoding_mode": "ALIBI"}
META = torch.tensor(0.5, device="meta")  # a scale that lives on a device
REFUSALS = {
    (f"{DEC}.__init__", "backend"): lambda: F.BatchDecodeWithPagedKVCacheWrapper(WS, backend="fa2"),
    (f"{DEC}.__init__", "jit_args"): lambda: F.BatchDecodeWithPagedKVCacheWrapper(WS, jit_args=[]),
    (f"{DEC}.__init__", "jit_kwargs"):
        lambda: F.BatchDecodeWithPagedKVCacheWrapper(WS, jit_kwargs={}),
    (f"{DEC}.plan", "pos_encoding_mode"): lambda: fi_decode(pos_encoding_mode="ROPE_LLAMA"),
    (f"{DEC}.plan", "window_right"): lambda: fi_decode(window_right=-1),
    (f"{DEC}.plan", "logits_soft_cap"): lambda: fi_decode(logits_soft_cap=5.0, **ALIBI),
    (f"{DEC}.plan", "o_data_type"): lambda: fi_decode(o_data_type=torch.float32),
    (f"{DEC}.plan", "fixed_split_size"): lambda: fi_decode(fixed_split_size=3),
    (f"{DEC}.plan", "is_causal"): lambda: fi_decode(is_causal=True),
    (f"{DEC}.plan", "use_token_head_sf"): lambda: fi_decode(use_token_head_sf=True),
    (f"{DEC}.run", "args"): lambda: fi_decode().run(Q1, CACHE, 1),
    (f"{DEC}.run", "q_scale"): lambda: fi_decode().run(Q1, CACHE, q_scale=META),
    (f"{DEC}.run", "k_scale"): lambda: fi_decode().run(Q1, CACHE, k_scale=META),
    (f"{DEC}.run", "return_lse"): lambda: fi_decode(**ALIBI).run(Q1, CACHE, return_lse=True),
    (f"{DEC}.run", "sinks"): lambda: fi_decode(**ALIBI).run(Q1, CACHE, sinks=torch.zeros(4)),
    (f"{DEC}.run", "skip_softmax_threshold_scale_factor"):
        lambda: fi_decode().run(Q1, CACHE, skip_softmax_threshold_scale_factor=1.0),
    (f"{DEC}.run", "kv_cache_sf"): lambda: fi_decode().run(Q1, CACHE, kv_cache_sf=CACHE),
    (f"{PRE}.__init__", "backend"):
        lambda: F.BatchPrefillWithPagedKVCacheWrapper(WS, backend="trtllm-gen"),
    (f"{PRE}.__init__", "jit_args"): lambda: F.BatchPrefillWithPagedKVCacheWrapper(WS, jit_args=[]),
    (f"{PRE}.__init__", "jit_kwargs"):
        lambda: F.BatchPrefillWithPagedKVCacheWrapper(WS, jit_kwargs={}),
    (f"{PRE}.__init__", "variant_owns_mask"):
        lambda: F.BatchPrefillWithPagedKVCacheWrapper(WS, variant_owns_mask=True),
    (f"{PRE}.plan", "pos_encoding_mode"): lambda: fi_prefill(pos_encoding_mode="ROPE_LLAMA"),
    (f"{PRE}.plan", "logits_soft_cap"): lambda: fi_prefill(logits_soft_cap=5.0, **ALIBI),
    (f"{PRE}.plan", "o_data_type"): lambda: fi_prefill(o_data_type=torch.bfloat16),
    (f"{PRE}.plan", "prefix_len_ptr"): lambda: fi_prefill(prefix_len_ptr=i32([0])),
    (f"{PRE}.plan", "token_pos_in_items_ptr"): lambda: fi_prefill(token_pos_in_items_ptr=i32([0])),
    (f"{PRE}.plan", "token_pos_in_items_len"): lambda: fi_prefill(token_pos_in_items_len=4),
    (f"{PRE}.plan", "max_item_len_ptr"): lambda: fi_prefill(max_item_len_ptr=i32([0])),
    (f"{PRE}.plan", "use_token_head_sf"): lambda: fi_prefill(use_token_head_sf=True),
    (f"{PRE}.run", "args"): lambda: fi_prefill().run(Q1, CACHE, 1),
    (f"{PRE}.run", "q_scale"): lambda: fi_prefill().run(Q1, CACHE, q_scale=META),
    (f"{PRE}.run", "k_scale"): lambda: fi_prefill().run(Q1, CACHE, k_scale=META),
    (f"{PRE}.run", "return_lse"): lambda: fi_prefill(**ALIBI).run(Q1, CACHE, return_lse=True),
    (f"{PRE}.run", "sinks"): lambda: fi_prefill(**ALIBI).run(Q1, CACHE, sinks=torch.zeros(4)),
    (f"{PRE}.run", "kv_cache_sf"): lambda: fi_prefill().run(Q1, CACHE, kv_cache_sf=CACHE),
    (f"{PRE}.run", "skip_softmax_threshold_scale_factor"):
        lambda: fi_prefill().run(Q1, CACHE, skip_softmax_threshold_scale_factor=1.0),
    (f"{PRE}.run", "uses_spcompress"): lambda: fi_prefill().run(Q1, CACHE, uses_spcompress=True),
    ("sglang.decode_attention_fwd", "xai_temperature_len"):
        lambda: sg_decode(xai_temperature_len=8),
    ("sglang.decode_attention_fwd", "k_scale"): lambda: sg_decode(k_scale=META),
    ("sglang.decode_attention_fwd", "score_mod"): lambda: sg_decode(score_mod=max),
    ("sglang.decode_attention_fwd", "aux_tensors"): lambda: sg_decode(aux_tensors=[Q1]),
    ("sglang.extend_attention_fwd", "k_scale"): lambda: sg_extend(k_scale=0.5),
    ("sglang.extend_attention_fwd", "v_scale"): lambda: sg_extend(v_scale=0.5),
    ("sglang.extend_attention_fwd", "sliding_window_size"):
        lambda: sg_extend(is_causal=False, sliding_window_size=4),
    ("sglang.extend_attention_fwd", "window_kv_offsets"):
        lambda: sg_extend(window_kv_offsets=i32([0])),
    ("sglang.extend_attention_fwd", "xai_temperature_len"):
        lambda: sg_extend(xai_temperature_len=8),
    ("sglang.extend_attention_fwd", "skip_prefix"):
        lambda: sg_extend(mask=torch.ones(6, dtype=torch.bool), skip_prefix=True),
    ("sglang.extend_attention_fwd", "skip_extend"): lambda: sg_extend(skip_extend=True),
    ("sglang.extend_attention_fwd", "score_mod"): lambda: sg_extend(score_mod=max),
    ("sglang.extend_attention_fwd", "aux_tensors"): lambda: sg_extend(aux_tensors=[Q1]),
    ("vllm.unified_attention", "causal"): lambda: vl_unified(causal=i32([1])),
    ("vllm.unified_attention", "alibi_slopes"):
        lambda: vl_unified(q_lens=(2,), alibi_slopes=torch.ones(4), sinks=torch.zeros(4)),
    ("vllm.unified_attention", "output_scale"): lambda: vl_unified(output_scale=torch.ones(1)),
    ("vllm.unified_attention", "qq_bias"): lambda: vl_unified(qq_bias=torch.ones(1, 1)),
    ("vllm.unified_attention", "mm_prefix_range"):
        lambda: vl_unified(mm_prefix_range=torch.zeros(1, 1, 2)),
    ("vllm.unified_attention", "rswa_prefix_lens"): lambda: vl_unified(rswa_prefix_lens=i32([1])),
    ("vllm.unified_attention", "rswa_window"): lambda: vl_unified(rswa_window=4),
    ("vllm.unified_attention", "use_alibi_sqrt"): lambda: vl_unified(use_alibi_sqrt=True),
    ("vllm.unified_attention", "kv_quant_mode"):
        lambda: vl_unified(kv_quant_mode=VL.KVQuantMode.INT8_PER_TOKEN_HEAD),
    ("vllm.unified_attention", "chunk_lookback"):
        lambda: vl_unified(window=(7, 0), chunk_lookback=1),
    ("vllm.paged_attention_v1", "kv_cache_dtype"):
        lambda: vl_legacy(VL.paged_attention_v1, kv_cache_dtype="int8"),
    ("vllm.paged_attention_v1", "blocksparse_vert_stride"):
        lambda: vl_legacy(VL.paged_attention_v1, blocksparse_vert_stride=2),
    ("vllm.paged_attention_v2", "kv_cache_dtype"):
        lambda: vl_legacy(VL.paged_attention_v2, kv_cache_dtype="fp8_inc"),
    ("vllm.paged_attention_v2", "blocksparse_vert_stride"):
        lambda: vl_legacy(VL.paged_attention_v2, blocksparse_vert_stride=4),
}


def test_every_documented_refusal_has_a_case():
    raising = {(e, a) for e, rows in doc_tables().items()
               for a, (status, _) in rows.items() if "raises" in status}
    assert raising == set(REFUSALS), (f"documented, untested: {raising - set(REFUSALS)}; "
                                      f"tested, undocumented: {set(REFUSALS) - raising}")


@pytest.mark.parametrize("case", list(REFUSALS), ids=lambda c: f"{c[0].split('.')[-1]}.{c[1]}")
def test_refusal_names_the_argument(case):
    with pytest.raises(NotImplementedError, match=rf"\b{re.escape(case[1])}="):
        REFUSALS[case]()


@contextlib.contextmanager
def no_host_reads():
    """Every torch.Tensor method that reads device data back to the host raises inside."""
    names = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def trap(name):
        def f(*a, **k):
            raise AssertionError(f"host read: Tensor.{name}")
        return f
    for n in names:
        setattr(torch.Tensor, n, trap(n))
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.Tensor, n, f)


def test_per_layer_calls_read_nothing_back(monkeypatch):
    monkeypatch.setenv("PAGEDATTN_VALIDATE", "0")
    calls = []

    def recorder(*a, **k):  # pagedattn's op: q is the first tensor (after run_decode's plan)
        q = a[0] if isinstance(a[0], torch.Tensor) else a[1]
        calls.append(q.shape)
        out = torch.zeros(q.shape, dtype=q.dtype)
        return (out, torch.zeros(q.shape[:-1])) if k.get("return_lse") else out
    for mod, name in ((F, "run_decode"), (_flashinfer_prefill, "extend_attention"),
                      (S, "paged_decode"), (S, "extend_attention"), (VL, "paged_decode"),
                      (VL, "extend_attention")):
        monkeypatch.setattr(mod, name, recorder)
    dec, pre = fi_decode(), fi_prefill()
    S.set_max_context_len(64)
    try:
        with no_host_reads():
            dec.run(Q1, CACHE, sinks=torch.zeros(4), k_scale=0.5, v_scale=2.0)
            dec.run(Q1, CACHE, return_lse=True)
            pre.run(Q1, CACHE, q_scale=2.0)
            sg_decode(page_size=2, v_scale=torch.tensor([2.0]))
            sg_extend(mask=torch.ones(6, dtype=torch.int8), page_size=2)
            vl_unified()
            vl_unified(q_lens=(3,))
    finally:
        S.set_max_context_len(None)
    assert len(calls) == 7


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(
    os.path.dirname(__file__), "..", "examples", "*.py"))), ids=os.path.basename)
def test_example_runs(path, capsys):
    with open(path) as f:
        assert len(f.read().splitlines()) < 80
    runpy.run_path(path, run_name="__main__")
    assert "max abs error" in capsys.readouterr().out
