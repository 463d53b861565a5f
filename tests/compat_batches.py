"""Random paged batches in the peers' metadata forms, for the compat tests.

Each builder starts from attn_utils.make_paged_batch (scattered unique pages, NaN everywhere no
valid token lives, poisoned table slack) and writes the metadata the way each engine does: page
lists with last_page_len (FlashInfer), token-slot lists (SGLang), block tables with
cumulative query offsets (vLLM). The lists are computed here from the table by the plain
formulas, not by pagedattn's converters.
"""
import math
from typing import List

import torch

from attn_utils import make_paged_batch


def i32(x, device="cpu"):
    return torch.tensor(x, dtype=torch.int32, device=device)


def cumsum0(lens: List[int], device="cpu"):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return i32(out, device)


def paged(kv_lens, *, page_size, num_kv_heads=2, head_dim=32, dtype=torch.float16,
          layout="bshd", gen, kv_scales=None, device="cpu"):
    return make_paged_batch(list(kv_lens), num_kv_heads=num_kv_heads, head_dim=head_dim,
                            block_size=page_size, layout=layout, dtype=dtype, device=device,
                            gen=gen, exact_capacity=False, kv_scales=kv_scales)


def flashinfer_pages(batch):
    """(indptr, indices, last_page_len) of every request's pages, FlashInfer's CSR form."""
    ps = batch.block_size
    lens = batch.seq_lens.tolist()
    npages = [math.ceil(n / ps) for n in lens]
    indices = [int(batch.block_table[b, j]) for b, n in enumerate(npages) for j in range(n)]
    last = [(n - 1) % ps + 1 if n else 0 for n in lens]
    dev = batch.block_table.device
    return cumsum0(npages, dev), i32(indices, dev), i32(last, dev)


def token_slots(batch, lens):
    """(kv_indptr, kv_indices): SGLang's slot list of positions [0, lens[b]) of each request,
    slot = page * page_size + offset (the pool seen as [num_pages * page_size, H, D])."""
    ps = batch.block_size
    slots = []
    for b, n in enumerate(lens):
        slots += [int(batch.block_table[b, t // ps]) * ps + t % ps for t in range(n)]
    dev = batch.block_table.device
    return cumsum0(list(lens), dev), i32(slots, dev)


def token_pool(batch):
    """The bshd cache as SGLang's token pool [num_pages * page_size, H, D] (a view)."""
    assert batch.layout == "bshd"
    return batch.k_cache.flatten(0, 1), batch.v_cache.flatten(0, 1)


def new_tokens(q_lens, num_heads, head_dim, dtype, gen, device="cpu"):
    return torch.randn(sum(q_lens), num_heads, head_dim, generator=gen).to(device=device,
                                                                          dtype=dtype)


def nan_like(t):
    return torch.full_like(t, float("nan"))
