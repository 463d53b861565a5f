"""copy_blocks in Triton: cache[dst] = cache[src] for (src, dst) pairs, over a list of caches.

The block id is dim 0 of every layout. A cache whose block is contiguous (``cache[0]`` is a
contiguous tensor) is copied as a flat run of ``cache[0].numel()`` elements from
``id * stride(0)``; any other cache falls back to a strided copy that decomposes the linear index
over the (up to 4) inner dims. Elements are moved as same-width integers, so every dtype
(fp8 included) copies bit-exactly. One launch per cache.
"""
import torch
import triton
import triton.language as tl

_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@triton.jit
def _copy_blocks_kernel(
        cache_ptr,  # [num_blocks, n1, n2, n3, n4] (inner dims padded with 1), integer view
        block_mapping_ptr,  # int64 [num_copies, 2]: (src, dst)
        numel,  # elements per block
        stride_b: tl.int64, stride_1: tl.int64, stride_2: tl.int64, stride_3: tl.int64,
        stride_4: tl.int64,
        N2: tl.constexpr, N3: tl.constexpr, N4: tl.constexpr,
        FLAT: tl.constexpr, BLOCK: tl.constexpr):
    # grid: (num_copies, cdiv(numel, BLOCK)): one program moves BLOCK elements of one pair.
    i = tl.program_id(0).to(tl.int64)
    src = tl.load(block_mapping_ptr + 2 * i).to(tl.int64)
    dst = tl.load(block_mapping_ptr + 2 * i + 1).to(tl.int64)
    e = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] linear index
    mask = e < numel
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


def run(caches, block_mapping):
    """Copy blocks for every cache in ``caches``; block_mapping int64 [num_copies, 2]."""
    pairs = block_mapping.to(torch.int64).reshape(-1, 2).contiguous()
    n = pairs.shape[0]
    if n == 0:
        return
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
            cache_ptr=ci, block_mapping_ptr=pairs, numel=numel, stride_b=ci.stride(0),
            stride_1=inner_strides[0], stride_2=inner_strides[1], stride_3=inner_strides[2],
            stride_4=inner_strides[3], N2=inner_shape[1], N3=inner_shape[2], N4=inner_shape[3],
            FLAT=flat, BLOCK=block, num_warps=4)
