"""copy_blocks in Triton: cache[dst] = cache[src] for (src, dst) pairs, over a list of caches.

The block id is dim 0 of every layout. A cache whose block is contiguous (``cache[0]`` is a
contiguous tensor) is copied as a flat run of ``cache[0].numel()`` elements from
``id * stride(0)``; any other cache falls back to a strided copy that decomposes the linear index
over the (up to 4) inner dims. Elements are moved as same-width integers, so every dtype
(fp8 included) copies bit-exactly. One launch per cache.

Guards (no host sync): a pair is skipped when its src or dst is outside [0, num_blocks), when its
dst is some other pair's dst too, or when its dst is some pair's src (a read that would race with
the write). The rest are copied exactly: no block that a kept pair reads is written. Each skipped
pair adds 1 to the optional ``errors`` counter (counted by the first cache's launch only). The
clashes are found in the kernel by comparing each pair with all others when the mapping is small
(copy-on-write copies: a few per step), and from device-side sorted copies of the ids otherwise.
``PAGEDATTN_DEV_GUARDS=0`` compiles the kernel without the guards (to measure their cost).
"""
import torch
import triton
import triton.language as tl

from pagedattn import config

_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# Mappings up to this many pairs are checked for clashes in the kernel (all pairs); larger ones
# get a clash mask from device-side sorts first.
PAIRWISE_MAX_PAIRS = 512
BLOCK_P = 128  # pairs compared per step of the in-kernel clash scan


@triton.jit
def _copy_blocks_kernel(
        cache_ptr,  # [num_blocks, n1, n2, n3, n4] (inner dims padded with 1), integer view
        block_mapping_ptr,  # int64 [num_copies, 2]: (src, dst)
        clash_ptr,  # uint8 [num_copies]: the pair's dst is another's dst or a src (CLASH_MASK)
        errors_ptr,  # int32 [1]: += skipped pairs (HAS_ERR) or dummy
        num_blocks,  # ids in [0, num_blocks) are valid
        numel,  # elements per block
        stride_b: tl.int64, stride_1: tl.int64, stride_2: tl.int64, stride_3: tl.int64,
        stride_4: tl.int64,
        N2: tl.constexpr, N3: tl.constexpr, N4: tl.constexpr,
        FLAT: tl.constexpr, BLOCK: tl.constexpr, GUARD: tl.constexpr, CLASH_MASK: tl.constexpr,
        HAS_ERR: tl.constexpr, BLOCK_P: tl.constexpr):
    # grid: (num_copies, cdiv(numel, BLOCK)): one program moves BLOCK elements of one pair.
    i = tl.program_id(0)
    src = tl.load(block_mapping_ptr + 2 * i).to(tl.int64)
    dst = tl.load(block_mapping_ptr + 2 * i + 1).to(tl.int64)
    e = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] linear index
    mask = e < numel
    if GUARD:
        if CLASH_MASK:
            clash = tl.load(clash_ptr + i) != 0
        else:
            # pairs writing this dst (itself included) and pairs reading it: all pairs,
            # BLOCK_P at a time
            num_p = tl.num_programs(0)
            writers = 0
            readers = 0
            for j0 in range(0, num_p, BLOCK_P):
                j = j0 + tl.arange(0, BLOCK_P)  # [BLOCK_P]
                jm = j < num_p
                src_j = tl.load(block_mapping_ptr + 2 * j, mask=jm, other=-1).to(tl.int64)
                dst_j = tl.load(block_mapping_ptr + 2 * j + 1, mask=jm, other=-1).to(tl.int64)
                writers += tl.sum((dst_j == dst).to(tl.int32), axis=0)
                readers += tl.sum((src_j == dst).to(tl.int32), axis=0)
            clash = (writers > 1) | (readers > 0)
        keep = (src >= 0) & (src < num_blocks) & (dst >= 0) & (dst < num_blocks) & ~clash
        if HAS_ERR:
            tl.atomic_add(errors_ptr, 1, mask=~keep & (tl.program_id(1) == 0))
    else:
        keep = True
    if keep:  # a skipped pair's programs end here
        if FLAT:
            inner = e
        else:
            i4 = e % N4
            i3 = (e // N4) % N3
            i2 = (e // (N4 * N3)) % N2
            i1 = e // (N4 * N3 * N2)
            inner = i1 * stride_1 + i2 * stride_2 + i3 * stride_3 + i4 * stride_4
        x = tl.load(cache_ptr + src * stride_b + inner, mask=mask)
        tl.store(cache_ptr + dst * stride_b + inner, x, mask=mask)


def unsupported(**_):
    """Reasons this kernel cannot serve the call ([] = it can): any layout, any dtype."""
    return []


def clash_mask(pairs: torch.Tensor) -> torch.Tensor:
    """uint8 [num_copies]: 1 where the pair's dst is another pair's dst or any pair's src, on the
    pairs' device without a host sync (sorts and binary searches)."""
    src, dst = pairs[:, 0].contiguous(), pairs[:, 1].contiguous()

    def count(values, keys):  # occurrences of each key in values
        ordered = torch.sort(values).values
        return torch.searchsorted(ordered, keys, right=True) - torch.searchsorted(ordered, keys)
    return ((count(dst, dst) > 1) | (count(src, dst) > 0)).view(torch.uint8)


def run(caches, block_mapping, errors=None):
    """Copy blocks for every cache in ``caches``; block_mapping int64 [num_copies, 2]; errors:
    optional int32 [1], += the number of skipped pairs."""
    pairs = block_mapping.to(torch.int64).reshape(-1, 2).contiguous()
    n = pairs.shape[0]
    if n == 0:
        return
    guard = config.get("PAGEDATTN_DEV_GUARDS")
    use_mask = guard and n > PAIRWISE_MAX_PAIRS
    clash = clash_mask(pairs) if use_mask else pairs  # pairs: an unread placeholder
    count = guard and errors is not None
    for c in caches:
        if c.dim() > 5:
            raise ValueError(f"cache: at most 4 dims after the block dim, got {tuple(c.shape)}")
        ci = c.view(_INT_OF_SIZE[c.element_size()])  # same shape and strides, bit copy
        inner_shape = list(ci.shape[1:]) + [1] * (5 - ci.dim())
        inner_strides = list(ci.stride()[1:]) + [0] * (5 - ci.dim())
        numel = ci[0].numel() if ci.shape[0] else 0
        if numel == 0:
            continue
        flat = ci[0].is_contiguous()
        block = min(4096, triton.next_power_of_2(numel))
        # grid: (pair, chunk of the block)
        _copy_blocks_kernel[(n, triton.cdiv(numel, block))](
            cache_ptr=ci, block_mapping_ptr=pairs, clash_ptr=clash,
            errors_ptr=errors if count else pairs, num_blocks=ci.shape[0], numel=numel,
            stride_b=ci.stride(0), stride_1=inner_strides[0], stride_2=inner_strides[1],
            stride_3=inner_strides[2], stride_4=inner_strides[3], N2=inner_shape[1],
            N3=inner_shape[2], N4=inner_shape[3], FLAT=flat, BLOCK=block, GUARD=guard,
            CLASH_MASK=use_mask, HAS_ERR=count, BLOCK_P=BLOCK_P, num_warps=4)
        count = False  # each skipped pair is counted once, by the first cache's launch
