"""Bad inputs: a typed error naming the argument, before any launch (docs/layout.md, "Malformed
metadata")."""
import pytest
import torch

import pagedattn as pa

B, HQ, HKV, D, BS, NB = 2, 4, 2, 64, 4, 8


def _good(layout="bhsd", dtype=torch.float32):
    k, v = pa.make_kv_cache(NB, BS, HKV, D, layout=layout, dtype=dtype)
    k.normal_() if dtype not in (torch.float8_e4m3fn, torch.float8_e5m2) else None
    v.normal_() if dtype not in (torch.float8_e4m3fn, torch.float8_e5m2) else None
    return dict(
        q=torch.randn(B, HQ, D),
        k_cache=k, v_cache=v,
        block_table=torch.tensor([[1, 2, 3], [4, 5, 0]], dtype=torch.int32),
        seq_lens=torch.tensor([9, 5], dtype=torch.int32),
    )


def _call(**over):
    a = _good()
    kw = {k: over.pop(k) for k in list(over) if k not in a}
    a.update(over)
    return pa.paged_decode(a["q"], a["k_cache"], a["v_cache"], a["block_table"], a["seq_lens"],
                           backend="torch", **kw)


def test_good_call_runs():
    out, lse = _call(return_lse=True)
    assert out.shape == (B, HQ, D) and lse.shape == (B, HQ)
    assert torch.isfinite(out).all()


CASES = [
    # (id, overrides, error, match)
    ("q_dtype_vs_cache", dict(q=torch.randn(B, HQ, D, dtype=torch.float16)), TypeError, "k_cache"),
    ("q_rank", dict(q=torch.randn(B * HQ, D)), ValueError, "q"),
    ("q_int", dict(q=torch.zeros(B, HQ, D, dtype=torch.int32)), TypeError, "q"),
    ("head_dim_mismatch", dict(q=torch.randn(B, HQ, 32)), ValueError, "head_dim"),
    ("heads_not_divisible", dict(q=torch.randn(B, 3, D)), ValueError, "num_q_heads"),
    ("q_last_dim_strided", dict(q=torch.randn(B, HQ, 2 * D)[..., ::2]), ValueError,
     "contiguous last"),
    ("table_int64", dict(block_table=torch.zeros(B, 3, dtype=torch.int64)), TypeError,
     "block_table"),
    ("table_1d", dict(block_table=torch.zeros(3, dtype=torch.int32)), ValueError, "block_table"),
    ("table_rows", dict(block_table=torch.zeros(1, 3, dtype=torch.int32)), ValueError,
     "block_table"),
    ("seq_lens_int64", dict(seq_lens=torch.tensor([1, 1])), TypeError, "seq_lens"),
    ("seq_lens_len", dict(seq_lens=torch.tensor([1, 1, 1], dtype=torch.int32)), ValueError,
     "seq_lens"),
    ("seq_len_over_capacity", dict(seq_lens=torch.tensor([13, 5], dtype=torch.int32)), ValueError,
     "capacity"),
    ("negative_seq_len", dict(seq_lens=torch.tensor([-1, 5], dtype=torch.int32)), ValueError,
     "negative"),
    ("block_id_high", dict(block_table=torch.tensor([[1, 2, NB], [4, 5, 0]], dtype=torch.int32)),
     ValueError, "block id out of range"),
    ("block_id_minus1", dict(block_table=torch.tensor([[1, -1, 3], [4, 5, 0]],
                                                      dtype=torch.int32)),
     ValueError, "block id out of range"),
    ("scale_zero", dict(scale=0.0), ValueError, "scale"),
    ("scale_nan", dict(scale=float("nan")), ValueError, "scale"),
    ("softcap_negative", dict(logit_cap=-1.0), ValueError, "logit_cap"),
    ("window_zero", dict(sliding_window=0), ValueError, "sliding_window"),
    ("alibi_shape", dict(alibi_slopes=torch.ones(HQ + 1)), ValueError, "alibi_slopes"),
    ("sinks_shape", dict(sinks=torch.ones(2, HQ)), ValueError, "sinks"),
    ("partition_not_pow2", dict(partition_size=300), ValueError, "partition_size"),
    ("out_shape", dict(out=torch.empty(B, HQ, D + 1)), ValueError, "out"),
    ("out_dtype", dict(out=torch.empty(B, HQ, D, dtype=torch.float16)), TypeError, "out"),
    ("bad_backend", dict(backend_="nope"), ValueError, "backend"),
    ("bad_layout", dict(layout="nhd"), ValueError, "layout"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_decode_rejects(case):
    _, over, err, match = case
    over = dict(over)
    if "backend_" in over:
        a = _good()
        with pytest.raises(err, match=match):
            pa.paged_decode(a["q"], a["k_cache"], a["v_cache"], a["block_table"], a["seq_lens"],
                            backend=over["backend_"])
        return
    with pytest.raises(err, match=match):
        _call(**over)


def test_out_aliasing_q_rejected():
    a = _good()
    with pytest.raises(ValueError, match="alias"):
        _call(out=a["q"], q=a["q"])


@pytest.mark.parametrize("shape", [(NB, HKV, BS + 1, D), (NB, HKV + 1, BS, D),
                                   (NB + 1, HKV, BS, D), (NB, HKV, BS)],
                         ids=["block_size", "heads", "blocks", "rank"])
def test_cache_shape_mismatch(shape):
    with pytest.raises(ValueError, match="v_cache"):
        _call(v_cache=torch.randn(shape))


def test_v_width_may_differ():
    """K 64 / V 72 wide: accepted; out takes V's width."""
    out = _call(v_cache=torch.randn(NB, HKV, BS, D + 8).normal_())
    assert out.shape == (B, HQ, D + 8)


def test_head_dim_v_checked_against_v_cache():
    with pytest.raises(ValueError, match="head_dim_v"):
        _call(head_dim_v=D + 1)


def test_mla_v_cache_none_needs_head_dim_v():
    with pytest.raises(ValueError, match="head_dim_v"):
        _call(v_cache=None)
    with pytest.raises(ValueError, match="head_dim_v"):
        _call(v_cache=None, head_dim_v=D + 1)  # wider than the K cache it reads


def test_mla_v_cache_none_needs_head_dim_inner_layout():
    k = torch.randn(NB, HKV, D // 16, BS, 4)  # vllm layout, fp32: x = 4
    with pytest.raises(ValueError, match="v_cache"):
        pa.paged_decode(torch.randn(B, HQ, D), k, None, _good()["block_table"],
                        _good()["seq_lens"], layout="vllm", head_dim_v=32, backend="torch")


@pytest.mark.parametrize("bs", [1, 3, 5, 48])
def test_any_block_size_accepted(bs):
    k = torch.randn(NB, HKV, bs, D)
    lens = torch.tensor([min(9, 3 * bs), 1], dtype=torch.int32)
    out = _call(k_cache=k, v_cache=torch.randn_like(k), seq_lens=lens)
    assert out.shape == (B, HQ, D)


@pytest.mark.parametrize("d", [0, 577])
def test_unsupported_head_dim(d):
    k = torch.randn(NB, HKV, BS, d)
    with pytest.raises(ValueError, match="head_dim"):
        _call(k_cache=k, v_cache=k.clone(), q=torch.randn(B, HQ, d))


@pytest.mark.parametrize("dt", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_scale_required_and_positive(dt):
    a = _good(dtype=dt)
    args = (a["q"], a["k_cache"], a["v_cache"], a["block_table"], a["seq_lens"])
    with pytest.raises(ValueError, match="k_scale"):
        pa.paged_decode(*args, backend="torch")
    with pytest.raises(ValueError, match="k_scale"):
        pa.paged_decode(*args, k_scale=-1.0, v_scale=1.0, backend="torch")
    with pytest.raises(ValueError, match="v_scale"):
        pa.paged_decode(*args, k_scale=0.5, v_scale=torch.tensor([1.0, float("nan")]),
                        backend="torch")
    with pytest.raises(ValueError, match="k_scale"):
        pa.paged_decode(*args, k_scale=torch.ones(3), v_scale=1.0, backend="torch")


def test_empty_batch_returns_empty():
    a = _good()
    out, lse = pa.paged_decode(a["q"][:0], a["k_cache"], a["v_cache"], a["block_table"][:0],
                               a["seq_lens"][:0], backend="torch", return_lse=True)
    assert out.shape == (0, HQ, D) and lse.shape == (0, HQ)


def test_speculative_q_longer_than_seq_rejected():
    a = _good()
    with pytest.raises(ValueError, match="seq_lens"):
        _call(q=torch.randn(B, 6, HQ, D))


# ---------------------------------------------------------------------------------------------
# extend
# ---------------------------------------------------------------------------------------------

def _ext(**over):
    a = _good()
    a.pop("q")
    a.update(q=torch.randn(5, HQ, D), cu_seqlens_q=torch.tensor([0, 3, 5], dtype=torch.int32))
    kw = {k: over.pop(k) for k in list(over) if k not in a}
    a.update(over)
    return pa.extend_attention(a["q"], a["k_cache"], a["v_cache"], a["block_table"],
                               a["cu_seqlens_q"], a["seq_lens"], backend="torch", **kw)


def test_extend_good_call():
    assert _ext().shape == (5, HQ, D)


EXT_CASES = [
    ("cu_last", dict(cu_seqlens_q=torch.tensor([0, 3, 4], dtype=torch.int32)), ValueError,
     "cu_seqlens_q"),
    ("cu_len", dict(cu_seqlens_q=torch.tensor([0, 5], dtype=torch.int32)), ValueError,
     "seq_lens"),
    ("cu_decreasing", dict(cu_seqlens_q=torch.tensor([0, 6, 5], dtype=torch.int32),
                           seq_lens=torch.tensor([9, 9], dtype=torch.int32)),
     ValueError, "cu_seqlens_q"),
    ("cu_first", dict(cu_seqlens_q=torch.tensor([1, 3, 5], dtype=torch.int32)), ValueError,
     "cu_seqlens_q"),
    ("cu_int64", dict(cu_seqlens_q=torch.tensor([0, 3, 5])), TypeError, "cu_seqlens_q"),
    ("negative_prefix", dict(seq_lens=torch.tensor([2, 5], dtype=torch.int32)), ValueError,
     "negative prefix"),
    ("k_new_alone", dict(k_new=torch.randn(5, HKV, D)), ValueError, "k_new"),
    ("k_new_shape", dict(k_new=torch.randn(4, HKV, D), v_new=torch.randn(4, HKV, D)), ValueError,
     "k_new"),
    ("mask_alone", dict(custom_mask=torch.ones(10, dtype=torch.bool)), ValueError,
     "custom_mask"),
    ("mask_size", dict(custom_mask=torch.ones(10, dtype=torch.bool),
                       mask_indptr=torch.tensor([0, 5, 10], dtype=torch.int32)),
     ValueError, "mask_indptr"),
    ("causal_not_bool", dict(causal=1), TypeError, "causal"),
    ("max_q_len_small", dict(max_q_len=2), ValueError, "max_q_len"),
]


@pytest.mark.parametrize("case", EXT_CASES, ids=[c[0] for c in EXT_CASES])
def test_extend_rejects(case):
    _, over, err, match = case
    with pytest.raises(err, match=match):
        _ext(**dict(over))


# ---------------------------------------------------------------------------------------------
# store_kv / copy_blocks
# ---------------------------------------------------------------------------------------------

def test_store_kv_rejects():
    a = _good()
    k = torch.randn(3, HKV, D)
    with pytest.raises(ValueError, match="slot_mapping"):
        pa.store_kv(k, k, a["k_cache"], a["v_cache"], torch.tensor([0, 1, NB * BS]),
                    backend="torch")
    with pytest.raises(ValueError, match="duplicate"):
        pa.store_kv(k, k, a["k_cache"], a["v_cache"], torch.tensor([0, 1, 1]), backend="torch")
    with pytest.raises(TypeError, match="slot_mapping"):
        pa.store_kv(k, k, a["k_cache"], a["v_cache"], torch.tensor([0.0, 1, 2]), backend="torch")
    with pytest.raises(ValueError, match="k"):
        pa.store_kv(torch.randn(3, HKV, D + 1), k, a["k_cache"], a["v_cache"],
                    torch.tensor([0, 1, 2]), backend="torch")


def test_copy_blocks_rejects():
    a = _good()
    kc, vc = a["k_cache"], a["v_cache"]
    with pytest.raises(ValueError, match="out of range"):
        pa.copy_blocks(kc, vc, [(1, NB)], backend="torch")
    with pytest.raises(ValueError, match="duplicate destination"):
        pa.copy_blocks(kc, vc, [(1, 3), (2, 3)], backend="torch")
    with pytest.raises(ValueError, match="also a source"):
        pa.copy_blocks(kc, vc, [(1, 3), (3, 4)], backend="torch")
    with pytest.raises(ValueError, match="equally many"):
        pa.copy_blocks([kc], [vc, vc], [(1, 3)], backend="torch")
    with pytest.raises(ValueError, match="block_mapping"):
        pa.copy_blocks(kc, vc, torch.zeros(2, 3, dtype=torch.int64), backend="torch")


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("validate", [None, True, False])
def test_extend_empty_batch_returns_empty(backend, validate):
    """No requests at all (cu_seqlens_q = [0]): empty out and lse in every validation mode."""
    a = _good()
    q = torch.randn(0, HQ, D)
    out, lse = pa.extend_attention(q, a["k_cache"], a["v_cache"], a["block_table"][:0],
                                   torch.tensor([0], dtype=torch.int32), a["seq_lens"][:0],
                                   backend=backend, validate=validate, return_lse=True)
    assert out.shape == (0, HQ, D) and lse.shape == (0, HQ)
    assert lse.dtype == torch.float32
    if validate or (validate is None and backend == "torch"):
        with pytest.raises(ValueError, match="cu_seqlens_q"):  # q rows without a request
            pa.extend_attention(torch.randn(2, HQ, D), a["k_cache"], a["v_cache"],
                                a["block_table"][:0], torch.tensor([0], dtype=torch.int32),
                                a["seq_lens"][:0], backend=backend, validate=validate)


@pytest.mark.parametrize("cache_layout,passed,hint", [("bshd", "bhsd", "bshd"),
                                                      ("bshd", "hcu", "bshd"),
                                                      ("bhsd", "bshd", "bhsd")])
def test_cache_in_another_layout_is_named(cache_layout, passed, hint):
    """A cache passed with the wrong layout reads block_size as num_kv_heads: the head-count
    error says which layout its shape fits (16 tokens per block, 2 KV heads, 8 query heads)."""
    k, v = pa.make_kv_cache(NB, 16, 2, D, layout=cache_layout, dtype=torch.float32)
    if passed == "hcu":
        v = v.transpose(2, 3).contiguous()  # hcu's V: [blocks, heads, D, block_size]
    table = torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=rf"num_q_heads 8 is not a multiple of num_kv_heads 16; "
                                         rf"is k_cache in layout '{hint}'\? pass layout='{hint}'"):
        pa.paged_decode(torch.randn(1, 8, D), k, v, table, torch.ones(1, dtype=torch.int32),
                        layout=passed, backend="torch")
    with pytest.raises(ValueError, match=rf"layout='{hint}'"):
        pa.extend_attention(torch.randn(1, 8, D), k, v, table,
                            torch.tensor([0, 1], dtype=torch.int32),
                            torch.ones(1, dtype=torch.int32), layout=passed, backend="torch")


def test_head_count_error_without_a_layout_that_fits_has_no_hint():
    """3 query heads fit neither reading (2 heads in bhsd, 4 in bshd): no hint."""
    with pytest.raises(ValueError, match="num_q_heads 3 is not a multiple of num_kv_heads 2$"):
        _call(q=torch.randn(B, 3, D))
