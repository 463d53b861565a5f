"""Host checks that write targets do not alias: within one tensor (a stride-0 dimension) and
between two (views whose elements share bytes).

Two views of one storage are fine when the elements each can address are disjoint: vLLM and
FlashInfer allocate ``kv = [num_blocks, 2, ...]`` and pass ``kv[:, 0]`` and ``kv[:, 1]``, whose
byte extents interleave but whose elements never meet. So the test is on elements, not on
storages or extents:

    k elements:  |K0|  |K1|  |K2|      kv[:, 0]: offsets 0, 2X, 4X, ... (X = one half block)
    v elements:     |V0|  |V1|  |V2|   kv[:, 1]: offsets X, 3X, 5X, ...
    extents      [---------------)     overlap; elements do not

NOTE only ops that write need this: attention ops only read the caches, and an MLA cache may pass
V as a view of K's first columns there.
"""
import torch

# Nodes of the search below before it gives up and reports an overlap (never reached by views
# whose strides nest, as every cache layout's do: there each dimension leaves <= 2 candidates).
_SEARCH_BUDGET = 100_000
# (address, shape, strides, element size) of both views -> the answer, which is a function of
# these alone: store_kv sees the same cache pair every layer and step (the search: ~25 us).
_MEMO = {}


def check_no_self_overlap(**targets) -> None:
    """``ValueError`` naming the target when a dimension of size > 1 has stride 0 (an expanded
    tensor): several writes would land on one element."""
    for name, t in targets.items():
        if any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride())):
            raise ValueError(f"{name}: a write target with a stride-0 (expanded) dimension, "
                             f"shape {tuple(t.shape)} strides {t.stride()}: the writes would alias")


def check_disjoint(name: str, t, other_name: str, other) -> None:
    """``ValueError`` naming ``name`` when an element of ``t`` shares a byte with an element of
    ``other`` (both written by one op, so one would overwrite the other). Either may be None (no
    such target, e.g. an MLA cache without V): nothing to check."""
    if t is None or other is None or not shares_bytes(t, other):
        return
    raise ValueError(f"{name}: shares memory with {other_name} ({name} shape {tuple(t.shape)} "
                     f"strides {t.stride()} at {t.data_ptr():#x}, {other_name} shape "
                     f"{tuple(other.shape)} strides {other.stride()} at {other.data_ptr():#x}): "
                     f"writes to one would overwrite the other; pass separate tensors or disjoint "
                     f"views such as kv[:, 0] and kv[:, 1]")


def shares_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether some element of ``a`` and some element of ``b`` share a byte of memory.

    Exact for any strides. With p = byte offset of an element from a's first, element sizes sa
    and sb and d = b.data_ptr() - a.data_ptr(), the two meet iff some
    ``sum_i i * stride_a_i - sum_j j * stride_b_j`` (index ranges of both) lies in
    ``[d - sa + 1, d + sb - 1]``: a bounded search over the dimensions, largest stride first.
    """
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    if _extent(a)[1] <= _extent(b)[0] or _extent(b)[1] <= _extent(a)[0]:
        return False
    key = tuple((t.data_ptr(), t.shape, t.stride(), t.element_size()) for t in (a, b))
    hit = _MEMO.get(key)
    if hit is None:
        if len(_MEMO) >= 256:
            _MEMO.clear()
        hit = _MEMO[key] = _elements_meet(a, b)
    return hit


def _elements_meet(a: torch.Tensor, b: torch.Tensor) -> bool:
    coeff = {}  # byte stride -> (lo, hi) of its summed index coefficient
    for x, sign in ((a, 1), (b, -1)):
        for n, st in zip(x.shape, x.stride()):
            if n > 1 and st:
                lo, hi = coeff.get(st * x.element_size(), (0, 0))
                coeff[st * x.element_size()] = (lo + min(0, sign * (n - 1)),
                                                hi + max(0, sign * (n - 1)))
    dims = sorted(coeff.items(), reverse=True)
    rest = [(0, 0)] * (len(dims) + 1)  # rest[i]: the sums dims[i:] reach
    for i in range(len(dims) - 1, -1, -1):
        st, (lo, hi) = dims[i]
        rest[i] = (rest[i + 1][0] + lo * st, rest[i + 1][1] + hi * st)
    d = b.data_ptr() - a.data_ptr()
    budget = [_SEARCH_BUDGET]

    def reach(i, lo_t, hi_t):  # can dims[i:] sum into [lo_t, hi_t]?
        if hi_t < rest[i][0] or lo_t > rest[i][1]:
            return False
        if i == len(dims):
            return True
        budget[0] -= 1
        if budget[0] < 0:
            return True  # undecided: report an overlap rather than risk a silent one
        st, (lo, hi) = dims[i]
        nlo, nhi = rest[i + 1]
        first = max(lo, -((nhi - lo_t) // st))  # ceil((lo_t - nhi) / st)
        last = min(hi, (hi_t - nlo) // st)
        return any(reach(i + 1, lo_t - j * st, hi_t - j * st) for j in range(first, last + 1))

    return reach(0, d - a.element_size() + 1, d + b.element_size() - 1)


def _extent(t: torch.Tensor):
    """[first byte, one past the last byte) that t's elements span (strides are >= 0)."""
    span = sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1
    return t.data_ptr(), t.data_ptr() + span * t.element_size()
