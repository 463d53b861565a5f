"""plan_decode / run_decode: one plan, several layers; metadata checked once; mismatches rejected."""
import dataclasses

import pytest
import torch

import pagedattn as pa
from attn_utils import (assert_attn_close, dense_attention, dense_kv, make_paged_batch,
                        replay_in_cuda_graph)

BACKENDS = ["torch", "triton"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_plan_once_run_three_layers(backend, device):
    gen = torch.Generator().manual_seed(3)
    lens = [1, 16, 37]
    base = make_paged_batch(lens, num_kv_heads=2, head_dim=64, block_size=16, layout="bshd",
                            dtype=torch.float16, device=device, gen=gen)
    # every layer shares one block table (as in a real model); other layers hold other values
    layers = [base] + [dataclasses.replace(base, k_cache=(base.k_cache * s + 0.5).half(),
                                           v_cache=(base.v_cache * -s).half()) for s in (0.5, 2.0)]
    table, seq_lens = base.block_table, base.seq_lens
    n = layers[0].k_cache.shape[0]
    plan = pa.plan_decode(table, seq_lens, num_q_heads=8, num_kv_heads=2, head_dim=64,
                          block_size=16, num_blocks=n, q_dtype=torch.float16, layout="bshd",
                          backend=backend, partition_size=16)
    assert plan.backend == backend
    for b in layers:
        q = torch.randn(3, 8, 64, generator=gen).to(device=device, dtype=torch.float16)
        out = torch.full_like(q, float("nan"))
        pa.run_decode(plan, q, b.k_cache, b.v_cache, out=out)
        for i, L in enumerate(lens):
            k, v = dense_kv(b, i, L)
            ref, _ = dense_attention(q[i:i + 1].cpu(), k.cpu(), v.cpu(), [L - 1],
                                     scale=64 ** -0.5)
            assert_attn_close(out[i], ref[0], torch.float16)


def test_two_plans_back_to_back_keep_their_metadata(device):
    """mini-sglang #103 class: a second plan must not change the first one's metadata."""
    gen = torch.Generator().manual_seed(4)
    a = make_paged_batch([20, 5], num_kv_heads=1, head_dim=64, block_size=4, layout="bhsd",
                         dtype=torch.float32, device=device, gen=gen, extra_blocks=20)
    kw = dict(num_q_heads=2, num_kv_heads=1, head_dim=64, block_size=4,
              num_blocks=a.k_cache.shape[0], q_dtype=torch.float32, backend="torch")
    p1 = pa.plan_decode(a.block_table, a.seq_lens, **kw)
    other = torch.randint(1, a.k_cache.shape[0], a.block_table.shape, generator=gen)
    p2 = pa.plan_decode(other.to(device=device, dtype=torch.int32),
                        torch.tensor([3, 9], dtype=torch.int32, device=device), **kw)
    q = torch.randn(2, 2, 64, generator=gen).to(device)
    o1 = pa.run_decode(p1, q, a.k_cache, a.v_cache)
    want = pa.paged_decode(q, a.k_cache, a.v_cache, a.block_table, a.seq_lens, backend="torch")
    assert torch.equal(o1, want)
    assert p2.seq_lens.tolist() == [3, 9]


def test_plan_rejects_bad_metadata_and_run_rejects_mismatches():
    table = torch.tensor([[1, 2], [3, 9]], dtype=torch.int32)
    lens = torch.tensor([5, 7], dtype=torch.int32)
    kw = dict(num_q_heads=4, num_kv_heads=2, head_dim=64, block_size=4, num_blocks=8,
              q_dtype=torch.float32, backend="torch")
    with pytest.raises(ValueError, match="block id out of range"):
        pa.plan_decode(table, lens, **kw)
    with pytest.raises(ValueError, match="num_q_heads"):
        pa.plan_decode(table.clamp(max=7), lens, **{**kw, "num_q_heads": 3})
    with pytest.raises(ValueError, match="capacity"):
        pa.plan_decode(table.clamp(max=7), torch.tensor([5, 9], dtype=torch.int32), **kw)
    plan = pa.plan_decode(table.clamp(max=7), lens, **kw)
    k, v = pa.make_kv_cache(8, 4, 2, 64, dtype=torch.float32)
    with pytest.raises(ValueError, match="q"):
        pa.run_decode(plan, torch.randn(3, 4, 64), k, v)
    with pytest.raises(TypeError, match="q"):
        pa.run_decode(plan, torch.randn(2, 4, 64, dtype=torch.float16), k, v)
    k2, v2 = pa.make_kv_cache(9, 4, 2, 64, dtype=torch.float32)
    with pytest.raises(ValueError, match="geometry"):
        pa.run_decode(plan, torch.randn(2, 4, 64), k2, v2)
    k3, v3 = pa.make_kv_cache(8, 4, 2, 64, dtype=torch.float16)
    with pytest.raises(TypeError, match="k_cache"):
        pa.run_decode(plan, torch.randn(2, 4, 64), k3, v3)


@pytest.mark.gpu
@pytest.mark.parametrize("entry", ["run_decode", "paged_decode"])
def test_decode_captures_in_a_cuda_graph(device, entry):
    """No host sync after planning: the call records into a CUDA graph and replays exactly."""
    gen = torch.Generator().manual_seed(9)
    b = make_paged_batch([700, 33, 1], num_kv_heads=8, head_dim=128, block_size=16,
                         layout="bhsd", dtype=torch.bfloat16, device=device, gen=gen)
    q = torch.randn(3, 32, 128, generator=gen).to(device=device, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    if entry == "run_decode":
        plan = pa.plan_decode(b.block_table, b.seq_lens, num_q_heads=32, num_kv_heads=8,
                              head_dim=128, block_size=16, num_blocks=b.k_cache.shape[0],
                              q_dtype=torch.bfloat16, backend="triton")

        def step():
            pa.run_decode(plan, q, b.k_cache, b.v_cache, out=out)
    else:
        def step():
            pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens,
                            backend="triton", out=out, validate=False)
    step()  # compile outside the capture
    want = out.clone()
    replay_in_cuda_graph(step, out)
    assert torch.equal(out, want)
