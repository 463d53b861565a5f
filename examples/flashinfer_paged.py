"""FlashInfer's plan/run wrappers, served by pagedattn: prefill two prompts into a paged cache,
then decode one token each, with the page lists built the way vLLM's FlashInfer backend builds
them (indptr over each request's pages, the page ids, the fill of each last page).

Runs on any device: a GPU picks its fastest backend, the CPU runs the Triton interpreter
(TRITON_INTERPRET=1) or the torch reference.
"""
import torch

from pagedattn.compat.flashinfer import (BatchDecodeWithPagedKVCacheWrapper,
                                         BatchPrefillWithPagedKVCacheWrapper)

dev = "cuda" if torch.cuda.is_available() else "cpu"
PAGE, HQ, HKV, D, PAGES = 16, 8, 2, 64, 32
gen = torch.Generator().manual_seed(0)
cache = torch.zeros(PAGES, 2, PAGE, HKV, D, dtype=torch.float16, device=dev)  # NHD, K and V
free = list(torch.randperm(PAGES, generator=gen).tolist())  # a page allocator's free list
pages = {0: [], 1: []}
lens = {0: 0, 1: 0}


def append(r, k, v):
    """Write new tokens' K/V of request r into its pages (allocating as it grows)."""
    for t in range(k.shape[0]):
        if lens[r] % PAGE == 0:
            pages[r].append(free.pop())
        cache[pages[r][-1], :, lens[r] % PAGE] = torch.stack([k[t], v[t]])
        lens[r] += 1


def page_lists():
    ids = [pages[r] for r in (0, 1)]
    indptr = torch.tensor([0, len(ids[0]), len(ids[0]) + len(ids[1])], dtype=torch.int32)
    indices = torch.tensor(ids[0] + ids[1], dtype=torch.int32)
    last = torch.tensor([(lens[r] - 1) % PAGE + 1 for r in (0, 1)], dtype=torch.int32)
    return indptr.to(dev), indices.to(dev), last.to(dev)


def dense(q, r, n_new):
    """Causal attention of request r's last n_new tokens, from a plain copy of its K/V."""
    kv = torch.cat([cache[p] for p in pages[r]], 1)[:, : lens[r]].float()  # [2, L, HKV, D]
    k, v = kv.repeat_interleave(HQ // HKV, 2)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * D ** -0.5
    pos = torch.arange(lens[r] - n_new, lens[r], device=dev).view(-1, 1)
    s = s.masked_fill(torch.arange(lens[r], device=dev) > pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)


workspace = torch.empty(16 * 1024 * 1024, dtype=torch.uint8, device=dev)
prompt = [37, 5]
rnd = lambda *s: torch.randn(*s, generator=gen).half().to(dev)  # noqa: E731
for r in (0, 1):
    append(r, rnd(prompt[r], HKV, D), rnd(prompt[r], HKV, D))
prefill = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
qo_indptr = torch.tensor([0, prompt[0], sum(prompt)], dtype=torch.int32, device=dev)
prefill.plan(qo_indptr, *page_lists(), HQ, HKV, D, PAGE, causal=True)
q = rnd(sum(prompt), HQ, D)
out = prefill.run(q, cache)
err = max((out[:37].float() - dense(q[:37], 0, 37)).abs().max().item(),
          (out[37:].float() - dense(q[37:], 1, 5)).abs().max().item())

decode = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
for r in (0, 1):
    append(r, rnd(1, HKV, D), rnd(1, HKV, D))
decode.plan(*page_lists(), HQ, HKV, D, PAGE, q_data_type=torch.float16)
q = rnd(2, HQ, D)
out, lse = decode.run(q, cache, return_lse=True)  # lse in base 2, as FlashInfer's
for r in (0, 1):
    err = max(err, (out[r:r + 1].float() - dense(q[r:r + 1], r, 1)).abs().max().item())
print(f"flashinfer compat: prefill + decode, max abs error {err:.2e}")
assert err < 1e-2
