"""KV-cache layouts: shapes, the address function, gathers and index converters.

Every cache tensor has the physical block id as dim 0. Within a block the four layouts are
(docs/layout.md):

=======  ===========================================  ======================================
name     K                                            V
=======  ===========================================  ======================================
bhsd     [num_blocks, kv_heads, block_size, D]        same as K            (Hygon layout=0)
bshd     [num_blocks, block_size, kv_heads, D]        same as K            (Hygon layout=1, SGLang)
vllm     [num_blocks, kv_heads, D//x, block_size, x]  [num_blocks, kv_heads, D, block_size]
hcu      [num_blocks, kv_heads, block_size, D]        [num_blocks, kv_heads, D, block_size]
=======  ===========================================  ======================================

with ``x = 16 // element_size`` for the vllm K cache. Each layout reduces to five element strides
(:class:`KVStrides`), and :func:`element_offset` is the one address function::

    offset(block, t, h, d) = block*s.block + t*s.token + h*s.head + (d // s.x)*s.dim_hi + (d % s.x)*s.dim_lo

Kernels receive the same five strides (as int64) and evaluate the same formula; the reference
gathers through it too. Offsets are int64 throughout.
"""
from typing import NamedTuple, Optional, Tuple

import torch

LAYOUTS = ("bhsd", "bshd", "vllm", "hcu")


class KVStrides(NamedTuple):
    """Element strides of one cache tensor, in the terms of :func:`element_offset`."""

    block: int
    token: int
    head: int
    dim_hi: int  # stride of d // x (0 when the head dim is not split)
    dim_lo: int  # stride of d % x
    x: int  # split factor of the head dim (head_dim when not split)


class CacheGeometry(NamedTuple):
    """A cache pair's sizes. ``head_dim`` is K's width (q's), ``head_dim_v`` V's (the output's);
    they differ for MLA (K 576 / V 512, V being the first 512 columns of one latent cache) and
    MLA-style prefill (K 192 / V 128)."""

    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    return layout


def vllm_x(dtype: torch.dtype) -> int:
    """The vllm K-cache split factor: 16 bytes of elements."""
    return 16 // torch.empty((), dtype=dtype).element_size()


def kv_cache_shapes(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                    layout: str, dtype: torch.dtype, head_dim_v: Optional[int] = None
                    ) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """Shapes of (k_cache, v_cache) for a layout (V's width ``head_dim_v``, default K's)."""
    n, b, h, d = num_blocks, block_size, num_kv_heads, head_dim
    dv = d if head_dim_v is None else head_dim_v
    check_layout(layout)
    if layout == "bhsd":
        return (n, h, b, d), (n, h, b, dv)
    if layout == "bshd":
        return (n, b, h, d), (n, b, h, dv)
    if layout == "hcu":
        return (n, h, b, d), (n, h, dv, b)
    x = vllm_x(dtype)
    if d % x:
        raise ValueError(f"head_dim: the vllm layout needs a multiple of x={x}, got {d}")
    return (n, h, d // x, b, x), (n, h, dv, b)


def make_kv_cache(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, *,
                  layout: str = "bhsd", dtype: torch.dtype = torch.float16,
                  device="cpu", head_dim_v: Optional[int] = None
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Allocate an uninitialised (k_cache, v_cache) pair in ``layout``; V is ``head_dim_v``
    wide (default: ``head_dim``)."""
    ks, vs = kv_cache_shapes(num_blocks, block_size, num_kv_heads, head_dim, layout, dtype,
                             head_dim_v)
    return torch.empty(ks, dtype=dtype, device=device), torch.empty(vs, dtype=dtype, device=device)


MLA_LAYOUTS = ("bhsd", "bshd")  # layouts where V can be the leading columns of the K cache


def make_mla_cache(num_blocks: int, block_size: int, head_dim: int = 576, *,
                   layout: str = "bshd", dtype: torch.dtype = torch.bfloat16,
                   device="cpu") -> torch.Tensor:
    """Allocate an uninitialised MLA latent cache: one KV head of ``head_dim`` columns
    (DeepSeek: 512 latent + 64 rope) in ``layout`` (bshd or bhsd). Pass it as ``k_cache`` with
    ``v_cache=None`` and ``head_dim_v=`` (512): V is its first head_dim_v columns
    (:func:`mla_v_view`)."""
    if layout not in MLA_LAYOUTS:
        raise ValueError(f"layout: an MLA cache is {' or '.join(MLA_LAYOUTS)}, got {layout!r}")
    return make_kv_cache(num_blocks, block_size, 1, head_dim, layout=layout, dtype=dtype,
                         device=device)[0]


def mla_v_view(k_cache: torch.Tensor, layout: str, head_dim_v: int) -> torch.Tensor:
    """V of a latent cache: the view of its first ``head_dim_v`` columns (no copy). Only
    bhsd/bshd keep the head dim innermost for K and V alike."""
    if layout not in MLA_LAYOUTS:
        raise ValueError(f"v_cache: None (V inside the K cache) needs layout "
                         f"{' or '.join(MLA_LAYOUTS)}, got {layout!r}")
    return k_cache[..., :head_dim_v]


def cache_geometry(k_cache: torch.Tensor, layout: str) -> CacheGeometry:
    """(num_blocks, block_size, num_kv_heads, head_dim) read off a K cache."""
    check_layout(layout)
    want = 5 if layout == "vllm" else 4
    if k_cache.dim() != want:
        raise ValueError(f"k_cache: layout {layout!r} is {want}-D, got shape {tuple(k_cache.shape)}")
    s = k_cache.shape
    if layout == "bshd":
        return CacheGeometry(s[0], s[1], s[2], s[3], s[3])
    if layout == "vllm":
        return CacheGeometry(s[0], s[3], s[1], s[2] * s[4], s[2] * s[4])
    return CacheGeometry(s[0], s[2], s[1], s[3], s[3])


def k_strides(k_cache: torch.Tensor, layout: str) -> KVStrides:
    """Element strides of a K cache (any memory strides; views are fine)."""
    st = k_cache.stride()
    g = cache_geometry(k_cache, layout)
    if layout == "bshd":
        return KVStrides(st[0], st[1], st[2], 0, st[3], g.head_dim)
    if layout == "vllm":
        return KVStrides(st[0], st[3], st[1], st[2], st[4], k_cache.shape[4])
    return KVStrides(st[0], st[2], st[1], 0, st[3], g.head_dim)  # bhsd, hcu


def v_strides(v_cache: torch.Tensor, layout: str) -> KVStrides:
    """Element strides of a V cache."""
    st = v_cache.stride()
    check_layout(layout)
    if v_cache.dim() != 4:
        raise ValueError(f"v_cache: layout {layout!r} is 4-D, got shape {tuple(v_cache.shape)}")
    if layout == "bshd":
        return KVStrides(st[0], st[1], st[2], 0, st[3], v_cache.shape[3])
    if layout in ("vllm", "hcu"):  # [n, h, D, b]
        return KVStrides(st[0], st[3], st[1], 0, st[2], v_cache.shape[2])
    return KVStrides(st[0], st[2], st[1], 0, st[3], v_cache.shape[3])


def v_geometry(v_cache: torch.Tensor, layout: str) -> CacheGeometry:
    """(num_blocks, block_size, num_kv_heads, V width, V width) read off a V cache."""
    s = v_cache.shape
    if layout == "bshd":
        return CacheGeometry(s[0], s[1], s[2], s[3], s[3])
    if layout in ("vllm", "hcu"):
        return CacheGeometry(s[0], s[3], s[1], s[2], s[2])
    return CacheGeometry(s[0], s[2], s[1], s[3], s[3])


def element_offset(s: KVStrides, block, token, head, d):
    """The address function: int64 element offset of (block, token-in-block, head, d).

    Arguments broadcast (ints or int tensors); tensors are widened to int64 before any multiply.
    """
    def w(t):
        return t.to(torch.int64) if isinstance(t, torch.Tensor) else t
    block, token, head, d = w(block), w(token), w(head), w(d)
    return (block * s.block + token * s.token + head * s.head
            + (d // s.x) * s.dim_hi + (d % s.x) * s.dim_lo)


def _flat_storage(cache: torch.Tensor) -> torch.Tensor:
    """A 1-D view over the storage the strides index into (offset 0 = cache[0,...,0])."""
    extent = 1 + sum((n - 1) * st for n, st in zip(cache.shape, cache.stride()) if n > 0)
    return cache.as_strided((extent,), (1,))


def token_offsets(s: KVStrides, blocks: torch.Tensor, tokens: torch.Tensor, num_heads: int,
                  head_dim: int) -> torch.Tensor:
    """Offsets [L, H, D] of L tokens given their physical blocks and in-block positions."""
    dev = blocks.device
    h = torch.arange(num_heads, device=dev).view(1, -1, 1)
    d = torch.arange(head_dim, device=dev).view(1, 1, -1)
    return element_offset(s, blocks.view(-1, 1, 1), tokens.view(-1, 1, 1), h, d)


def slots_of(block_table_row: torch.Tensor, positions: torch.Tensor, block_size: int):
    """(physical block, in-block offset) of logical token positions of one sequence."""
    positions = positions.to(torch.int64)
    blocks = block_table_row.to(torch.int64)[positions // block_size]
    return blocks, positions % block_size


def gather_tokens(cache: torch.Tensor, s: KVStrides, blocks: torch.Tensor, tokens: torch.Tensor,
                  num_heads: int, head_dim: int) -> torch.Tensor:
    """Read tokens out of a cache through the address function: [L, H, D] in the cache dtype."""
    flat = _flat_storage(cache)
    return flat[token_offsets(s, blocks, tokens, num_heads, head_dim)]


def gather_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table_row: torch.Tensor,
              seq_len: int, layout: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """K and V of one sequence, positions [0, seq_len): [seq_len, kv_heads, D] and
    [seq_len, kv_heads, Dv] tensors."""
    g = cache_geometry(k_cache, layout)
    dv = v_geometry(v_cache, layout).head_dim
    pos = torch.arange(seq_len, device=k_cache.device)
    blocks, toks = slots_of(block_table_row, pos, g.block_size)
    k = gather_tokens(k_cache, k_strides(k_cache, layout), blocks, toks, g.num_kv_heads, g.head_dim)
    v = gather_tokens(v_cache, v_strides(v_cache, layout), blocks, toks, g.num_kv_heads, dv)
    return k, v


def scatter_tokens(cache: torch.Tensor, s: KVStrides, blocks: torch.Tensor, tokens: torch.Tensor,
                   values: torch.Tensor) -> None:
    """Write values [L, H, D] (already in the cache dtype) to the given token slots, in place."""
    flat = _flat_storage(cache)
    offs = token_offsets(s, blocks, tokens, values.shape[1], values.shape[2])
    flat[offs.reshape(-1)] = values.reshape(-1)


# ----------------------------------------------------------------------------------------------
# SGLang token indices <-> block tables
# ----------------------------------------------------------------------------------------------

def kv_indices_to_block_table(kv_indptr: torch.Tensor, kv_indices: torch.Tensor):
    """SGLang's (kv_indptr [B+1], kv_indices [nnz]) -> (block_table [B, max_len], seq_lens [B]).

    Token slots are blocks of size 1, so the result indexes a ``block_size == 1`` cache.
    Padding entries of the table are 0 and are never read (seq_lens bounds every read).
    """
    lens = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int32)
    b = lens.numel()
    width = int(lens.max().item()) if b else 0
    table = torch.zeros((b, max(width, 1)), dtype=torch.int32, device=kv_indices.device)
    if b and width:
        col = torch.arange(width, device=kv_indices.device).view(1, -1)
        valid = col < lens.view(-1, 1).to(col.dtype)
        src = (kv_indptr[:-1].view(-1, 1).to(torch.int64) + col)[valid]
        table[valid] = kv_indices.to(torch.int32)[src]
    return table, lens


def block_table_to_kv_indices(block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int):
    """(block_table, seq_lens) -> SGLang's (kv_indptr, kv_indices) of token slots.

    Slot of token t = block_table[b, t // block_size] * block_size + t % block_size (int32).
    """
    lens = seq_lens.to(torch.int64)
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=seq_lens.device)
    indptr[1:] = torch.cumsum(lens, 0).to(torch.int32)
    parts = []
    for b in range(lens.numel()):
        t = torch.arange(int(lens[b]), device=seq_lens.device)
        blk, off = slots_of(block_table[b], t, block_size)
        parts.append(blk * block_size + off)
    idx = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=seq_lens.device)
    return indptr, idx.to(torch.int32)
