"""GPU tier: the compat calls engines capture in CUDA graphs replay exactly, with the metadata of
a later plan (FlashInfer) or of later contents of the same metadata tensors (SGLang, vLLM)."""
import dataclasses

import pytest
import torch

from attn_utils import assert_attn_close, capture_graph, make_paged_batch
from compat_batches import flashinfer_pages, token_pool, token_slots
from pagedattn import reference as R
from pagedattn.compat import flashinfer as F
from pagedattn.compat import sglang as S
from pagedattn.compat import vllm as VL

pytestmark = pytest.mark.gpu


def _pool(lens, device, gen, **kw):
    """One cache holding two batches: rows [0, 2) and [2, 4) of the table."""
    return make_paged_batch(lens, num_kv_heads=8, head_dim=128, block_size=16, layout="bshd",
                            dtype=torch.float16, device=device, gen=gen, **kw)


def _sub(b, lo):
    """Rows lo, lo + 1 of the pool's batch, over the same cache."""
    return dataclasses.replace(b, block_table=b.block_table[lo:lo + 2],
                               seq_lens=b.seq_lens[lo:lo + 2])


def _replay_matches_reference(graph, out, q, b, sub):
    """Replay `graph` into a NaN-poisoned `out` and compare it with the float32 reference decode
    of `q` over the batch `b` restricted to `sub`."""
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref = R.paged_decode(q, b.k_cache, b.v_cache, sub.block_table, sub.seq_lens, layout="bshd")
    assert_attn_close(out, ref, torch.float16)


def test_flashinfer_decode_graph_replays_a_new_plan(device, monkeypatch):
    monkeypatch.setenv("PAGEDATTN_VALIDATE", "0")  # device-data checks would sync in run
    gen = torch.Generator().manual_seed(50)
    b = _pool([700, 33, 50, 400], device, gen)
    ws = torch.empty(1, device=device)
    bufs = dict(paged_kv_indptr_buffer=torch.empty(3, dtype=torch.int32, device=device),
                paged_kv_indices_buffer=torch.empty(128, dtype=torch.int32, device=device),
                paged_kv_last_page_len_buffer=torch.empty(2, dtype=torch.int32, device=device))
    w = F.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True, **bufs)
    q = torch.empty(2, 32, 128, dtype=torch.float16, device=device)
    out = torch.empty_like(q)
    graph = None
    for lo in (0, 2):
        sub = _sub(b, lo)
        w.plan(*flashinfer_pages(sub), 32, 8, 128, 16)
        q.copy_(torch.randn(2, 32, 128, generator=gen).half())
        if graph is None:
            graph = capture_graph(lambda: w.run(q, (b.k_cache, b.v_cache), out=out))
        _replay_matches_reference(graph, out, q, b, sub)


def test_sglang_decode_graph_with_a_context_bound(device, monkeypatch):
    monkeypatch.setenv("PAGEDATTN_VALIDATE", "0")
    gen = torch.Generator().manual_seed(51)
    b = _pool([700, 33, 50, 400], device, gen)
    kb, vb = token_pool(b)
    q = torch.empty(2, 32, 128, dtype=torch.float16, device=device)
    o = torch.empty_like(q)
    indptr = torch.zeros(3, dtype=torch.int32, device=device)
    indices = torch.zeros(1200, dtype=torch.int32, device=device)
    S.set_max_context_len(1024)
    graph = None
    try:
        for lo in (0, 2):
            sub = _sub(b, lo)
            ip, ix = token_slots(sub, sub.seq_lens.tolist())
            indptr.copy_(ip)
            indices.zero_()[: ix.numel()].copy_(ix)
            q.copy_(torch.randn(2, 32, 128, generator=gen).half())
            if graph is None:
                graph = capture_graph(lambda: S.decode_attention_fwd(
                    q, kb, vb, o, indptr, indices, None, None, None, 8, 128 ** -0.5, 1.0, 1.0,
                    page_size=16))
            _replay_matches_reference(graph, o, q, b, sub)
    finally:
        S.set_max_context_len(None)


def test_vllm_unified_decode_graph(device, monkeypatch):
    monkeypatch.setenv("PAGEDATTN_VALIDATE", "0")
    gen = torch.Generator().manual_seed(52)
    b = _pool([700, 33, 50, 400], device, gen)
    table = torch.zeros(2, b.block_table.shape[1], dtype=torch.int32, device=device)
    lens = torch.zeros(2, dtype=torch.int32, device=device)
    cu = torch.arange(3, dtype=torch.int32, device=device)
    q = torch.empty(2, 32, 128, dtype=torch.float16, device=device)
    out = torch.empty_like(q)
    graph = None
    for lo in (0, 2):
        sub = _sub(b, lo)
        table.copy_(sub.block_table)
        lens.copy_(sub.seq_lens)
        q.copy_(torch.randn(2, 32, 128, generator=gen).half())
        if graph is None:
            graph = capture_graph(lambda: VL.unified_attention(
                q, b.k_cache, b.v_cache, out, cu, 1, lens, 1024, 128 ** -0.5, True, (-1, -1),
                table, 0.0, None, None, None))
        _replay_matches_reference(graph, out, q, b, sub)
