"""Helpers the three compat modules share: typed refusals, dtype names, and the translation of
CSR page/token lists into pagedattn's block tables.

Two kinds of translation live here:

* host-side (plan time, one host sync allowed): :func:`page_metadata` checks FlashInfer-style
  ``(indptr, indices, last_page_len)`` and builds ``(block_table, seq_lens)``;
* device-side (no host sync, CUDA-graph capturable): :func:`csr_table` gathers a table of a
  host-known width from ``(indptr, indices)``, for SGLang's per-call token lists.
"""
from typing import NamedTuple, Optional

import torch

LOG2E = 1.4426950408889634  # log2(e): natural-log LSE -> base-2 LSE


def refuse(option: str, value, instead: str):
    """Raise ``NotImplementedError`` naming ``option``, its value and what to do instead."""
    raise NotImplementedError(f"{option}={value!r} is not supported by pagedattn.compat: "
                              f"{instead}")


def canonical_dtype(name: str, value) -> torch.dtype:
    """A torch dtype from a dtype or its name (``"float16"``, ``"float8_e4m3fn"``, ...)."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype):
        return getattr(torch, value)
    raise TypeError(f"{name}: expected a torch.dtype or its name, got {value!r}")


def is_unit(x) -> bool:
    """True for None and for the number 1.0 (a scale that changes nothing)."""
    return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool) and x == 1.0)


def number(name: str, x) -> float:
    """A host number: an int/float, or a 1-element CPU tensor (never a device read)."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1 or x.device.type != "cpu":
            refuse(name, "<device tensor>", "folding it into the softmax scale would read it "
                   "back to the host; pass a float (or use an fp8 cache, whose scales may be "
                   "device tensors)")
        return float(x.reshape(()))
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{name}: expected a number, got {type(x).__name__}")
    return float(x)


def out_factor(name: str, x):
    """An output multiplier: None for 1, a float, or a 1-element tensor used on the device."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise ValueError(f"{name}: expected one element, got shape {tuple(x.shape)}")
        return x.reshape(())
    return None if is_unit(x) else number(name, x)


def fp8(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


# ----------------------------------------------------------------------------------------------
# device-side: CSR lists -> block table of a known width (no host sync)
# ----------------------------------------------------------------------------------------------

def csr_table(indptr: torch.Tensor, indices: Optional[torch.Tensor], width: int, *,
              page_size: int = 1) -> torch.Tensor:
    """int32 ``[B, width]`` block table from CSR token/page lists, on indptr's device.

    Row b lists ``indices[indptr[b] + j * page_size] // page_size`` for ``j < ceil(len_b /
    page_size)``: with page_size 1 the entries are the indices themselves (pages or token
    slots); with page_size > 1 the indices are token slots whose pages hold consecutive slots
    (SGLang's paged pool), and each page is named once. ``indices=None`` means the identity list
    (entry k is k). Entries past a row's length are 0 and are never read.
    """
    dev = indptr.device
    b = indptr.numel() - 1
    starts = indptr[:-1].to(torch.int64).view(-1, 1)  # [B, 1]
    lens = (indptr[1:] - indptr[:-1]).to(torch.int64).view(-1, 1)  # [B, 1]
    col = torch.arange(max(width, 1), device=dev, dtype=torch.int64).view(1, -1) * page_size
    pos = starts + col  # [B, W] position in indices of each page's first token
    valid = col < lens
    if indices is None:
        vals = pos
    elif indices.numel() == 0:
        vals = torch.zeros_like(pos)
    else:
        vals = indices.to(torch.int64)[pos.clamp(0, indices.numel() - 1)]
    table = torch.where(valid, vals // page_size, torch.zeros_like(vals))
    return table.to(torch.int32).reshape(b, max(width, 1))


def csr_lengths(indptr: torch.Tensor) -> torch.Tensor:
    """int32 ``[B]`` list lengths ``indptr[1:] - indptr[:-1]`` (device op)."""
    return (indptr[1:] - indptr[:-1]).to(torch.int32)


# ----------------------------------------------------------------------------------------------
# host-side: FlashInfer page metadata -> (block_table, seq_lens), checked
# ----------------------------------------------------------------------------------------------

class PageMetadata(NamedTuple):
    block_table: torch.Tensor  # int32 [B, W] on the target device
    seq_lens: torch.Tensor  # int32 [B]: KV length of each request
    max_page: int  # largest page id a request reads (-1: none); checked against the cache
    host_lens: torch.Tensor  # int64 [B] on the CPU: seq_lens, for further plan-time checks


def _host_int(name: str, t, *, dim: int = 1) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dim or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise ValueError(f"{name}: expected a {dim}-D integer tensor, got shape "
                         f"{tuple(t.shape)}, dtype {t.dtype}")
    return t.to(torch.int64).cpu()


def page_metadata(indptr, indices, last_page_len, page_size: int, device, *,
                  block_tables=None, seq_lens=None) -> PageMetadata:
    """Check FlashInfer's page lists on the host and build pagedattn's table and lengths.

    ``indptr`` int ``[B+1]`` (0, non-decreasing, last entry <= len(indices)); ``indices`` the page
    ids; ``last_page_len`` int ``[B]`` in [1, page_size] for a request with pages, 0 without.
    ``block_tables`` / ``seq_lens`` (FlashInfer's caller-owned forms) are used instead when
    given. One host read of each tensor (plan time).
    """
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
        raise ValueError(f"page_size: expected a positive int, got {page_size!r}")
    ip = _host_int("indptr", indptr)
    lp = _host_int("last_page_len", last_page_len)
    b = lp.numel()
    if ip.numel() != b + 1:
        raise ValueError(f"indptr: expected batch_size + 1 = {b + 1} entries (last_page_len has "
                         f"{b}), got {ip.numel()}")
    idx = _host_int("indices", indices)
    if int(ip[0]) != 0 or bool((ip[1:] < ip[:-1]).any()) or int(ip[-1]) > idx.numel():
        raise ValueError(f"indptr: must start at 0, be non-decreasing and end at most at "
                         f"len(indices) = {idx.numel()}, got {ip.tolist()[:8]}...")
    npages = ip[1:] - ip[:-1]
    has = npages > 0
    bad = (has & ((lp < 1) | (lp > page_size))) | (~has & (lp != 0))
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        raise ValueError(f"last_page_len: request {i} has {int(npages[i])} pages and "
                         f"last_page_len {int(lp[i])}; expected 1..{page_size} with pages, "
                         "0 without")
    lens = torch.where(has, (npages - 1) * page_size + lp, torch.zeros_like(lp))
    if seq_lens is not None:
        lens = _host_int("seq_lens", seq_lens)
        if lens.numel() != b or bool((lens < 0).any()):
            raise ValueError(f"seq_lens: expected {b} non-negative lengths, got {lens.tolist()}")
    if block_tables is not None:
        bt = _host_int("block_tables", block_tables, dim=2)
        if bt.shape[0] < b:
            raise ValueError(f"block_tables: expected at least {b} rows, got {bt.shape[0]}")
        need = (lens + page_size - 1) // page_size
        if b and int(need.max()) > bt.shape[1]:
            raise ValueError(f"block_tables: {bt.shape[1]} columns hold fewer pages than "
                             f"request {int(torch.argmax(need))} needs ({int(need.max())})")
        used = torch.arange(bt.shape[1]).view(1, -1) < need.view(-1, 1)
        ids = bt[:b][used]
        table = block_tables[:b] if block_tables.dtype == torch.int32 else \
            block_tables[:b].to(torch.int32)
        table = table.to(device)
    else:
        ids = idx[: int(ip[-1])]
        width = int(npages.max()) if b else 1
        table = csr_table(ip.to(device), idx.to(device), max(width, 1))
    if ids.numel() and int(ids.min()) < 0:
        raise ValueError(f"indices: negative page id {int(ids.min())}")
    max_page = int(ids.max()) if ids.numel() else -1
    return PageMetadata(table, lens.to(device=device, dtype=torch.int32), max_page, lens)


def unpack_kv(paged_kv_cache, name: str = "paged_kv_cache"):
    """(k_cache, v_cache) from a ``(k, v)`` pair or one tensor with K/V on dim 1."""
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(f"{name}: expected a (k_cache, v_cache) pair, got "
                             f"{len(paged_kv_cache)} items")
        return paged_kv_cache[0], paged_kv_cache[1]
    if not isinstance(paged_kv_cache, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor or a (k, v) tuple, got "
                        f"{type(paged_kv_cache).__name__}")
    if paged_kv_cache.dim() != 5 or paged_kv_cache.shape[1] != 2:
        raise ValueError(f"{name}: a single tensor must be 5-D [num_pages, 2, ...], got shape "
                         f"{tuple(paged_kv_cache.shape)}")
    return paged_kv_cache[:, 0], paged_kv_cache[:, 1]
