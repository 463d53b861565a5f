"""vLLM's Triton ``unified_attention``, served by pagedattn: one mixed batch (a prompt chunk and
two decodes), with vLLM's metadata (block tables from a free-block pool, ``slot_mapping`` for
the new tokens' K/V, written into the cache before attention, ``cu_seqlens_q`` from the query
lengths and ``seqused_k`` from the total ones).

Runs on any device: a GPU picks its fastest backend, the CPU runs the Triton interpreter
(TRITON_INTERPRET=1) or the torch reference.
"""
import torch

import pagedattn as pa
from pagedattn.compat.vllm import unified_attention

dev = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK, BLOCKS, HQ, HKV, D = 16, 24, 8, 2, 64
gen = torch.Generator().manual_seed(0)
rnd = lambda *s: torch.randn(*s, generator=gen).half().to(dev)  # noqa: E731
k_cache = torch.zeros(BLOCKS, BLOCK, HKV, D, dtype=torch.float16, device=dev)
v_cache = torch.zeros_like(k_cache)
free = (torch.randperm(BLOCKS - 1, generator=gen) + 1).tolist()  # block 0: vLLM's null block

cached = [0, 30, 5]  # tokens already in the cache: a new prompt, two running requests
query = [12, 1, 1]  # tokens this step: a prompt chunk and two decodes
total = [c + n for c, n in zip(cached, query)]
width = max(-(-t // BLOCK) for t in total)
block_table = torch.zeros(3, width, dtype=torch.int32)
for r, t in enumerate(total):
    block_table[r, : -(-t // BLOCK)] = torch.tensor([free.pop() for _ in range(-(-t // BLOCK))])
block_table = block_table.to(dev)
for r in (1, 2):  # the running requests' earlier tokens
    pos = torch.arange(cached[r], device=dev)
    slots = block_table[r, pos // BLOCK] * BLOCK + pos % BLOCK
    pa.store_kv(rnd(cached[r], HKV, D), rnd(cached[r], HKV, D), k_cache, v_cache, slots,
                layout="bshd")

# this step: slot_mapping of the new tokens, then reshape_and_cache, then attention
pos = torch.cat([torch.arange(c, t) for c, t in zip(cached, total)]).to(dev)
req = torch.cat([torch.full((n,), r) for r, n in enumerate(query)]).to(dev)
slot_mapping = block_table[req, pos // BLOCK].long() * BLOCK + pos % BLOCK
pa.store_kv(rnd(14, HKV, D), rnd(14, HKV, D), k_cache, v_cache, slot_mapping, layout="bshd")
cu_seqlens_q = torch.tensor([0, 12, 13, 14], dtype=torch.int32, device=dev)
seqused_k = torch.tensor(total, dtype=torch.int32, device=dev)
q, out = rnd(14, HQ, D), torch.empty(14, HQ, D, dtype=torch.float16, device=dev)
unified_attention(q, k_cache, v_cache, out, cu_seqlens_q, max(query), seqused_k, max(total),
                  D ** -0.5, True, (-1, -1), block_table, 0.0, None, None, None)

err = 0.0
for r in range(3):
    ids = torch.arange(total[r], device=dev)
    blk, off = block_table[r, ids // BLOCK].long(), ids % BLOCK
    k = k_cache[blk, off].float().repeat_interleave(HQ // HKV, 1)
    v = v_cache[blk, off].float().repeat_interleave(HQ // HKV, 1)
    rows = slice(int(cu_seqlens_q[r]), int(cu_seqlens_q[r + 1]))
    s = torch.einsum("qhd,khd->hqk", q[rows].float(), k) * D ** -0.5
    qpos = torch.arange(cached[r], total[r], device=dev).view(-1, 1)
    s = s.masked_fill(ids > qpos, float("-inf"))
    want = torch.einsum("hqk,khd->qhd", s.softmax(-1), v)
    err = max(err, (out[rows].float() - want).abs().max().item())
print(f"vllm compat: mixed prefill/decode batch, max abs error {err:.2e}")
assert err < 1e-2
