"""SGLang's Triton attention ops, served by pagedattn: an extend step whose first request reuses
a cached prefix, then a decode step, with SGLang's metadata (a token pool addressed by slots,
``req_to_token`` rows per request, ``kv_indptr`` from the lengths and ``kv_indices`` gathered
from those rows, as SGLang's Triton backend builds them).

Runs on any device: a GPU picks its fastest backend, the CPU runs the Triton interpreter
(TRITON_INTERPRET=1) or the torch reference.
"""
import torch

from pagedattn.compat.sglang import decode_attention_fwd, extend_attention_fwd

dev = "cuda" if torch.cuda.is_available() else "cpu"
SLOTS, HQ, HKV, D, MAX_CTX, MAX_SPLITS = 256, 8, 2, 64, 64, 8
gen = torch.Generator().manual_seed(0)
rnd = lambda *s: torch.randn(*s, generator=gen).half().to(dev)  # noqa: E731
k_pool, v_pool = rnd(SLOTS, HKV, D), rnd(SLOTS, HKV, D)  # layer 0's token pool
free = (torch.randperm(SLOTS - 1, generator=gen) + 1).tolist()  # slot 0 is SGLang's padding
req_to_token = torch.zeros(2, MAX_CTX, dtype=torch.int32, device=dev)
seq = [0, 0]


def indptr(lens):
    out = torch.zeros(len(lens) + 1, dtype=torch.int32, device=dev)
    out[1:] = torch.cumsum(torch.tensor(lens, device=dev), 0)
    return out


def gather(lens):  # create_flashinfer_kv_indices_triton: the first lens[r] slots of each row
    return torch.cat([req_to_token[r, :n] for r, n in enumerate(lens)])


def dense(q, r, n_new):
    """Causal attention of request r's last n_new tokens over its slots."""
    ids = req_to_token[r, : seq[r]].long()
    k = k_pool[ids].float().repeat_interleave(HQ // HKV, 1)
    v = v_pool[ids].float().repeat_interleave(HQ // HKV, 1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * D ** -0.5
    pos = torch.arange(seq[r] - n_new, seq[r], device=dev).view(-1, 1)
    s = s.masked_fill(torch.arange(seq[r], device=dev) > pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)


# request 0 holds a 20-token prefix from the radix cache; request 1 starts empty
req_to_token[0, :20] = torch.tensor([free.pop() for _ in range(20)], dtype=torch.int32)
seq[0] = 20
prefix, new = [20, 0], [6, 9]
kv_indptr, kv_indices = indptr(prefix), gather(prefix)
qo_indptr = indptr(new)
q, k_new, v_new = rnd(15, HQ, D), rnd(15, HKV, D), rnd(15, HKV, D)
for r in (0, 1):  # out_cache_loc: slots for the new tokens, written before attention
    loc = torch.tensor([free.pop() for _ in range(new[r])], dtype=torch.int32, device=dev)
    req_to_token[r, seq[r]:seq[r] + new[r]] = loc
    k_pool[loc.long()], v_pool[loc.long()] = k_new[qo_indptr[r]:qo_indptr[r + 1]], \
        v_new[qo_indptr[r]:qo_indptr[r + 1]]
    seq[r] += new[r]
o = torch.empty_like(q)
extend_attention_fwd(q, k_new, v_new, o, k_pool, v_pool, qo_indptr, kv_indptr, kv_indices,
                     None, True, None, max(new), 1.0, 1.0, sm_scale=D ** -0.5)
err = max((o[:6].float() - dense(q[:6], 0, 6)).abs().max().item(),
          (o[6:].float() - dense(q[6:], 1, 9)).abs().max().item())

for r in (0, 1):  # decode: one new token each
    loc = free.pop()
    req_to_token[r, seq[r]] = loc
    k_pool[loc], v_pool[loc] = rnd(HKV, D), rnd(HKV, D)
    seq[r] += 1
q, o = rnd(2, HQ, D), torch.empty(2, HQ, D, dtype=torch.float16, device=dev)
attn_logits = torch.empty(2, HQ, MAX_SPLITS, D, dtype=torch.float32, device=dev)  # unused here
attn_lse = torch.empty(2, HQ, MAX_SPLITS, dtype=torch.float32, device=dev)
num_kv_splits = torch.full((2,), MAX_SPLITS, dtype=torch.int32, device=dev)
decode_attention_fwd(q, k_pool, v_pool, o, indptr(seq), gather(seq), attn_logits, attn_lse,
                     num_kv_splits, MAX_SPLITS, D ** -0.5, 1.0, 1.0)
for r in (0, 1):
    err = max(err, (o[r:r + 1].float() - dense(q[r:r + 1], r, 1)).abs().max().item())
print(f"sglang compat: extend + decode, max abs error {err:.2e}")
assert err < 1e-2
