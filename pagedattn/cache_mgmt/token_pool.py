"""Token-slot pools for the radix prefix cache (SGLang's TokenToKVPool allocator, CPU side).

A pool hands out KV-cache *slots* (one slot = one token's K/V in every layer) as int64 tensors.
`TokenPool` is token-granular (page_size 1); `PagedTokenPool` hands out whole pages, so a slot
list it returns or takes back always covers complete pages `[p*P, p*P + P)`.

NOTE: `alloc` raises `OutOfBlocks` instead of returning None (SGLang returns None): a None is
easy to index by mistake, a typed error is not. Use `can_alloc(n)` to ask first, or catch the
error, evict from the cache and retry. Every failed call leaves the pool unchanged.

Conservation: `available_size() + (slots handed out and not yet freed) == size`, exactly.

Each slot has one state (`_state`, uint8, a view of the bytearray `_state_buf`): FREE, HELD
(handed out to a caller) or CACHED (given to a radix cache by `insert`; for a page, its first
slot carries the mark). `free` refuses CACHED slots: those go back only through the cache's
eviction (`_release_cached`). A pool serves at most one cache.
"""
from __future__ import annotations

from array import array

import numpy as np
import torch

from . import native
from .errors import CacheError, DoubleFree, ForeignId, OutOfBlocks
from .int64_ids import int64_array, int64_bytes

__all__ = ["TokenPool", "PagedTokenPool", "as_slot_array", "out_of_range"]

HELD, FREE, CACHED = 0, 1, 2     # slot states; nonzero = not the caller's to give away


def as_slot_array(slots, name: str = "slots") -> np.ndarray:
    """A 1-D int64 numpy array of `slots` (CPU tensor, numpy array, array.array or sequence of
    ints; a view when it already is one, not writable then). Every kind takes and refuses the
    same ids (int64_ids.py): ValueError for an id outside int64 or an array that is not 1-D,
    TypeError for non-integers; a tensor on another device is a ValueError."""
    if isinstance(slots, torch.Tensor):
        if slots.dtype == torch.int64 and slots.dim() == 1 and slots.is_cpu:
            return slots.numpy()          # fast path (integer tensors never require grad)
        if slots.device.type != "cpu":
            raise ValueError(f"{name}: expected a CPU tensor, got device {slots.device}")
        return int64_array(slots, name, "slot")
    if isinstance(slots, (np.ndarray, array)):
        return int64_array(slots, name, "slot")
    return np.frombuffer(int64_bytes(slots, name, "slot"), np.int64)


def out_of_range(arr: np.ndarray, size: int) -> bool:
    """Any value of the int64 array `arr` outside [0, size)? (one pass: negatives viewed as
    uint64 are >= 2**63)."""
    return bool(np.count_nonzero(arr.view(np.uint64) >= size))


def _check_distinct(arr: np.ndarray, what: str) -> None:
    if arr.size > 1:
        srt = np.sort(arr)                # NOTE: np.unique costs ~10 us even on short arrays
        if (srt[1:] == srt[:-1]).any():
            raise DoubleFree(f"slots: {what} is listed twice")


class TokenPool:
    """A fixed pool of `size` token slots `0 .. size-1`, handed out LIFO.

    Mutates: `alloc` and `free` only. Slots returned by `alloc` are fresh tensors owned by the
    caller; the pool keeps no reference to them.
    """

    page_size = 1

    def __init__(self, size: int):
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"size: expected a non-negative int, got {size!r}")
        self._init_slots(size)
        self._stack = np.arange(size - 1, -1, -1, dtype=np.int64)  # top = end, slot 0 first
        self._top = size
        self._fs, self._pstate = None, None     # the free stack is this pool's own (_free_stack)

    def _init_slots(self, size: int) -> None:
        """The per-slot state and the C helpers, shared by both pool kinds."""
        self.size = size
        # one byte a slot; the C helpers (_radix_native.c: alloc and free here, insert's slot
        # check) read and write the bytearray
        self._state_buf = bytearray([FREE]) * size
        self._state = np.frombuffer(self._state_buf, dtype=np.uint8)
        nat = native.load()
        self._nat_release = nat.release if nat is not None else None
        self._nat_release_cached = nat.release_cached if nat is not None else None
        self._nat_hold = nat.hold if nat is not None else None

    ##### Public API #####

    def available_size(self) -> int:
        """Number of free slots."""
        return self._top

    def can_alloc(self, n: int) -> bool:
        return 0 <= n <= self._top

    def alloc(self, n: int) -> torch.Tensor:
        """Take `n` free slots; returns an int64 tensor of shape [n] (a fresh copy).

        Raises ValueError for a negative `n`, OutOfBlocks when fewer than `n` slots are free
        (nothing taken).
        """
        if not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n: expected a non-negative int, got {n!r}")
        if n > self._top:
            raise OutOfBlocks(f"n={n} slots requested, only {self._top} of {self.size} free")
        if self._nat_hold is None or n == 0:
            return torch.from_numpy(self._take(n))
        return self._hold_pages(n)

    def free(self, slots) -> None:
        """Return `slots` (tensor / array / ints) to the pool; all-or-nothing.

        Raises ForeignId for a slot out of range or held by a radix cache, DoubleFree for a
        slot already free or listed twice; in every case nothing is freed.
        """
        arr = as_slot_array(slots)
        if arr.size == 0:
            return
        if self._free_pages(self._nat_release, arr.tobytes(), arr.size):
            return
        self._check_owned(arr)
        self._push(arr)

    def is_free(self, slots) -> np.ndarray:
        """Boolean array: which of `slots` are free now (for checks and tests)."""
        return self._state[as_slot_array(slots)] == FREE

    def free_slots(self) -> np.ndarray:
        """A copy of the free slots (for checks and tests)."""
        return self._stack[:self._top].copy()

    def check_integrity(self) -> None:
        """Free stack and slot states agree exactly; raises CacheError-derived errors otherwise."""
        fs = self._stack[:self._top]
        if len(np.unique(fs)) != fs.size:
            raise DoubleFree("free stack holds a slot twice")
        if int((self._state == FREE).sum()) != self._top or (self._state[fs] != FREE).any():
            raise DoubleFree("the FREE states and the free stack disagree")

    ##### Internal #####

    def _free_stack(self) -> "TokenPool":
        """The pool whose free stack and top hold this pool's free pages: itself, or for a
        paged pool its page pool."""
        return self if self._fs is None else self._fs

    def _hold_pages(self, k: int) -> torch.Tensor:
        """Hand out the `k` <= available pages on top of the free stack in one C call (`hold`:
        their slots, marked HELD with their pages)."""
        fs = self._free_stack()
        slots = self._nat_hold(self._state_buf, self.page_size, fs._stack, fs._top, k,
                               self._pstate)
        fs._top -= k
        return torch.frombuffer(slots, dtype=torch.int64)

    def _free_pages(self, fn, buf, n: int) -> bool:
        """Free the `n` slots in the int64 buffer `buf` with the C helper `fn` (`release`, or
        `release_cached` for evict): True when done (checked, slots and pages marked FREE,
        pages pushed), False when `fn` is None or found a problem, for the numpy path to
        name."""
        fs = self._free_stack()
        if fn is None or fn(self._state_buf, buf, self.page_size, fs._stack, fs._top,
                            self._pstate):
            return False
        fs._top += n // self.page_size
        return True

    def _take(self, n: int) -> np.ndarray:
        """Hand out `n` <= available slots (checked by the caller), marked HELD: the top `n`
        entries of the free stack, last pushed first (the C helper `hold` takes the same)."""
        top = self._top - n
        self._top = top
        out = self._stack[top:top + n][::-1].copy()
        self._state[out] = HELD
        return out

    def _push(self, arr: np.ndarray) -> None:
        """Put checked, owned, distinct slots back on the free stack, marked FREE (the C helper
        `release` pushes and marks the same)."""
        self._stack[self._top:self._top + arr.size] = arr
        self._top += arr.size
        self._state[arr] = FREE

    def _check_owned(self, arr: np.ndarray, distinct: bool = True) -> None:
        """ForeignId / DoubleFree unless every slot is in range, held by the caller and (if
        `distinct`) listed once."""
        if out_of_range(arr, self.size):
            raise ForeignId(f"slots: value out of range [0, {self.size}): min {arr.min()}, "
                            f"max {arr.max()}")
        st = self._state.take(arr)
        if st.any():
            if (st == FREE).any():
                raise DoubleFree(f"slots: already free: {arr[st == FREE][:8].tolist()}")
            raise ForeignId(f"slots: {arr[st == CACHED][:8].tolist()} are held by a radix "
                            f"cache (they return through its evict)")
        if distinct:
            _check_distinct(arr, "a slot")

    ##### Radix cache side (radix_insert.py, radix_evict.py) #####

    def _release_cached(self, slots: np.ndarray) -> None:
        """Slots the cache evicts (the values of its victims: distinct whole pages, as insert
        checked; a contiguous int64 array) become free. Raises CacheError, freeing nothing, if
        their first slots are not all CACHED."""
        if self._free_pages(self._nat_release_cached, slots, slots.size):
            return
        if np.count_nonzero(self._state.take(slots) != CACHED):
            raise CacheError("evict: the pool does not list the victims' slots as cached")
        self._push(slots)


class PagedTokenPool(TokenPool):
    """A pool of `size // page_size` pages; `alloc(n)` and `free(slots)` work in whole pages.

    `alloc(n)` needs `n % page_size == 0` and returns the slots of `n // page_size` pages, each
    page as `p*P .. p*P+P-1` in order. `free` accepts only complete pages (any page order).
    """

    def __init__(self, size: int, page_size: int):
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size: expected a positive int, got {page_size!r}")
        if not isinstance(size, int) or size < 0 or size % page_size:
            raise ValueError(f"size: expected a non-negative multiple of page_size={page_size}, "
                             f"got {size!r}")
        self._init_slots(size)                # no slot-level free stack: pages are handed out
        self.page_size = page_size
        self._pages = TokenPool(size // page_size)
        self._fs, self._pstate = self._pages, self._pages._state_buf
        self._offs = np.arange(page_size, dtype=np.int64)

    def available_size(self) -> int:
        return self._pages.available_size() * self.page_size

    def can_alloc(self, n: int) -> bool:
        return n % self.page_size == 0 and 0 <= n <= self.available_size()

    def alloc(self, n: int) -> torch.Tensor:
        """Take `n // page_size` pages; `n` must be a multiple of page_size. See TokenPool.alloc."""
        if not isinstance(n, (int, np.integer)) or n < 0 or n % self.page_size:
            raise ValueError(f"n: expected a non-negative multiple of page_size="
                             f"{self.page_size}, got {n!r}")
        if n > self.available_size():
            raise OutOfBlocks(f"n={n} slots requested, only {self.available_size()} of "
                              f"{self.size} free")
        if self._nat_hold is not None and n:
            return self._hold_pages(n // self.page_size)
        pages = self._pages._take(n // self.page_size)
        out = (pages[:, None] * self.page_size + self._offs).reshape(-1)
        self._state[out] = HELD
        return torch.from_numpy(out)

    def free(self, slots) -> None:
        arr = as_slot_array(slots)
        if arr.size == 0:
            return
        if self._free_pages(self._nat_release, arr.tobytes(), arr.size):
            return
        self._check_owned(arr, distinct=False)
        pages = self._whole_pages(arr) if arr.size % self.page_size == 0 else None
        if pages is None:                 # errors in TokenPool's order: DoubleFree first
            _check_distinct(arr, "a slot")
            pages = self.pages_of(arr)
        _check_distinct(pages, "a page")  # whole pages: distinct pages <=> distinct slots
        self._pages._push(pages)
        self._state[arr] = FREE

    def _release_cached(self, slots: np.ndarray) -> None:
        if self._free_pages(self._nat_release_cached, slots, slots.size):
            return
        heads = slots[::self.page_size]
        if np.count_nonzero(self._state.take(heads) != CACHED):
            raise CacheError("evict: the pool does not list the victims' pages as cached")
        self._pages._push(heads // self.page_size)
        self._state[slots] = FREE

    def pages_of(self, arr: np.ndarray, name: str = "slots") -> np.ndarray:
        """Page ids of a complete-pages slot array; ValueError if `arr` is not whole pages."""
        ps = self.page_size
        if arr.size % ps:
            raise ValueError(f"{name}: length {arr.size} is not a multiple of page_size={ps}")
        pages = self._whole_pages(arr)                 # fast path: each page's slots in order
        if pages is None:
            pages = self._whole_pages(np.sort(arr))
        if pages is None:
            raise ValueError(f"{name}: slots do not form complete pages of size {ps}")
        return pages

    def _whole_pages(self, arr: np.ndarray):
        """Page ids if each run of page_size slots in `arr` is one page `p*P .. p*P+P-1` in
        order, else None. One byte comparison against the pages rebuilt from each run's first
        slot (rounded down to its page start) checks alignment and contiguity together."""
        ps = self.page_size
        pages = arr[::ps] // ps
        if ((pages * ps)[:, None] + self._offs).tobytes() != arr.tobytes():
            return None
        return pages

    def free_slots(self) -> np.ndarray:
        return np.flatnonzero(self._state == FREE).astype(np.int64)

    def check_integrity(self) -> None:
        self._pages.check_integrity()
        pmask = self._pages._state == FREE
        if not ((self._state == FREE).reshape(-1, self.page_size) == pmask[:, None]).all():
            raise DoubleFree("slot mask and page mask disagree")
