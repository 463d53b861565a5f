"""Physical block allocator: free list, reference counts, prefix-hash registry, undo journal.

A block is in exactly one of three states (docs/block_manager.md, "Block states")::

    free        ref == 0, no hash      -> handed out first, FIFO
    evictable   ref == 0, hashed       -> freed but its KV is still valid (prefix cache);
                                          reused least-recently-freed first (LRU), dropping its hash
    in use      ref  > 0               -> referenced by ``ref`` block-table entries

Reserved ids (block 0, the *null block*, by default) are in none of them: never handed out, never
freed, never counted. Padding in ``block_table`` points at the null block.

Every mutation made inside ``transaction()`` is journaled; an exception inside the ``with`` block
(``OutOfBlocks`` from the k-th grab, say) replays the journal backwards, so the allocator is
deep-equal (``snapshot()``) to its state before the transaction.
"""
from __future__ import annotations

import heapq
from collections import deque
from contextlib import contextmanager
from typing import Deque, Dict, Iterable, Iterator, List, NamedTuple, Optional, Tuple

from pagedattn.cache_mgmt.errors import CacheError, DoubleFree, ForeignId, OutOfBlocks

NULL_BLOCK = 0
Tokens = Tuple[int, ...]


class IntegrityError(CacheError):
    """``check_integrity()`` found a broken invariant (a bug in the manager, never user error)."""


def hash_block(parent_hash: Optional[int], tokens: Tokens) -> int:
    """Chained hash of one full block: depends on every earlier token through ``parent_hash``.

    Looked up through the module at call time, so tests can monkeypatch it to a constant to
    prove that a hash hit is always re-verified against the tokens (collision defence).
    """
    return hash((parent_hash, tokens))


class BlockMeta(NamedTuple):
    """Registry entry of a hashed (full) block.

    ``key`` is the nested tuple ``(parent_key, tokens)`` (``parent_key`` is None for the first
    block): it spells out the whole token prefix while sharing structure with the parent's key, so
    storing it costs O(block_size) and comparing keys of one chain hits the identity fast path.
    """
    hash: int
    parent_hash: Optional[int]
    key: tuple


def _check_int(name: str, value, lo: int, hi: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected int, got {type(value).__name__}")
    if value < lo or (hi is not None and value >= hi):
        bound = f"[{lo}, {hi})" if hi is not None else f">= {lo}"
        raise ValueError(f"{name}: expected {bound}, got {value}")
    return value


class BlockAllocator:
    """Fixed pool of ``num_blocks`` physical blocks of ``block_size`` tokens.

    Parameters
    ----------
    num_blocks : int
        pool size, ``>= 1``; ids are ``0 .. num_blocks - 1``.
    block_size : int
        tokens per block, ``>= 1``.
    reserved : iterable of int
        ids never handed out. Default ``(0,)``: block 0 is the null block that padded block-table
        entries point at (kernels never read it, ``seq_lens`` bounds every read).

    Examples
    --------
    >>> a = BlockAllocator(4, 16)
    >>> b = a.allocate(); a.incref(b); a.free(b); a.free(b); a.num_free_blocks
    3
    """

    def __init__(self, num_blocks: int, block_size: int, *,
                 reserved: Iterable[int] = (NULL_BLOCK,)):
        self.num_blocks = _check_int("num_blocks", num_blocks, 1)
        self.block_size = _check_int("block_size", block_size, 1)
        res = [_check_int("reserved", r, 0, num_blocks) for r in reserved]
        self.reserved = frozenset(res)
        self.num_usable = num_blocks - len(self.reserved)
        self._ref: List[int] = [0] * num_blocks
        self._free: Deque[int] = deque(b for b in range(num_blocks) if b not in self.reserved)
        self._evictable: Dict[int, int] = {}          # block -> tick at which it was freed
        self._heap: List[Tuple[int, int]] = []        # (tick, block), lazily deleted
        self._clock = 0
        self._by_hash: Dict[int, int] = {}            # hash -> block
        self._meta: Dict[int, BlockMeta] = {}         # block -> registry entry
        self._journal: Optional[list] = None

    # ##################################### Public API #####################################

    @property
    def num_free_blocks(self) -> int:
        """Blocks a caller can get now: free plus evictable."""
        return len(self._free) + len(self._evictable)

    def ref_count(self, block: int) -> int:
        return self._ref[self._check_id(block)]

    def meta(self, block: int) -> Optional[BlockMeta]:
        """The registry entry of a hashed block, None if unhashed."""
        return self._meta.get(block)

    def allocate(self) -> int:
        """Take one block, ref 0 -> 1, and return its id.

        Mutates: pops the oldest free block; if none, evicts the least-recently-freed evictable
        block (ties by id) and drops its hash. Raises ``OutOfBlocks`` (nothing changed) if neither.
        """
        if self._free:
            b = self._free.popleft()
            self._log(("pop_free", b))
        else:
            b = self._pop_lru()
            m = self._meta.pop(b)
            del self._by_hash[m.hash]
            self._log(("evict", b, self._evictable.pop(b), m))
        self._ref[b] = 1
        return b

    def incref(self, block: int) -> None:
        """Add one reference to an in-use or evictable block (a fork or a prefix-cache hit).

        Mutates: ``ref[block] += 1``; an evictable block leaves the LRU set.
        Raises ``ForeignId`` for a reserved, out-of-range or free (unowned) block.
        """
        b = self._check_id(block)
        if self._ref[b] == 0 and b not in self._evictable:
            raise ForeignId(f"block: {b} is free; only in-use or cached blocks can be shared")
        tick = self._evictable.pop(b, None)
        self._ref[b] += 1
        self._log(("incref", b, tick))
        if tick is not None and self._journal is None:
            self._compact_heap()

    def free(self, block: int) -> None:
        """Drop one reference; at ref 0 the block becomes evictable (hashed) or free.

        Mutates: ``ref[block] -= 1``; at 0 appends to the free list or the LRU set.
        Raises ``DoubleFree`` if ``ref`` is already 0, ``ForeignId`` for a reserved or
        out-of-range id; either way nothing changes.
        """
        b = self._check_id(block)
        if self._ref[b] == 0:
            raise DoubleFree(f"block: {b} is already free (ref_count 0)")
        self._ref[b] -= 1
        if self._ref[b]:
            self._log(("decref", b, None))
        elif b in self._meta:
            self._clock += 1
            self._evictable[b] = self._clock
            heapq.heappush(self._heap, (self._clock, b))
            self._log(("decref", b, "evictable"))
        else:
            self._free.append(b)
            self._log(("decref", b, "free"))

    def register(self, block: int, meta: BlockMeta) -> bool:
        """Publish an in-use full block under ``meta.hash``; False if that hash is taken.

        NOTE: a taken hash is left alone (the older block keeps it): either the same prefix is
        already cached (a duplicate, harmless) or a true collision (``lookup`` re-verifies).
        """
        b = self._check_id(block)
        if self._ref[b] == 0 or b in self._meta:
            raise ValueError(f"block: {b} must be in use and unhashed to register")
        if len(meta.key[1]) != self.block_size:
            raise ValueError(f"meta: only full blocks are hashed, got {len(meta.key[1])} tokens")
        if meta.hash in self._by_hash:
            return False
        self._by_hash[meta.hash] = b
        self._meta[b] = meta
        self._log(("register", b))
        return True

    def lookup(self, h: int, key: tuple) -> Optional[int]:
        """The block cached under hash ``h`` whose token prefix equals ``key``, else None.

        Read-only. The key comparison is the re-verification that makes hash collisions harmless.
        """
        b = self._by_hash.get(h)
        if b is None or self._meta[b].key != key:
            return None
        return b

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """All-or-nothing: an exception inside the block undoes every mutation made in it."""
        if self._journal is not None:               # nested: the outer transaction owns undo
            yield
            return
        self._journal = []
        try:
            yield
        except BaseException:
            self._rollback()
            raise
        finally:
            self._journal = None

    def snapshot(self) -> tuple:
        """Canonical deep copy of the logical state (for deep-equality checks in tests)."""
        lru = tuple(sorted(((t, b) for b, t in self._evictable.items())))
        return (tuple(self._ref), tuple(self._free), lru, self._clock,
                tuple(sorted(self._by_hash.items())), tuple(sorted(self._meta.items())))

    def check_integrity(self) -> None:
        """Walk every structure; raise ``IntegrityError`` on the first broken invariant.

        Checks I1 (partition free / evictable / in use), the allocator half of I2-I4, and I8.
        """
        free = set(self._free)
        _expect(len(free) == len(self._free), "I8: free list has duplicates")
        ev = set(self._evictable)
        _expect(not (free & ev), "I1: a block is both free and evictable")
        for b in range(self.num_blocks):
            r = self._ref[b]
            _expect(r >= 0, f"I2: block {b} has ref {r}")
            if b in self.reserved:
                _expect(r == 0 and b not in free and b not in ev and b not in self._meta,
                        f"I3: reserved block {b} is in use, free, evictable or hashed")
                continue
            _expect((r == 0) == (b in free or b in ev), f"I2: block {b} ref {r} vs free lists")
            _expect(b not in free or b not in self._meta, f"I1: free block {b} is hashed")
            _expect(b not in ev or b in self._meta, f"I1: evictable block {b} is unhashed")
        _expect(len(free) + len(ev) + sum(1 for r in self._ref if r > 0) == self.num_usable,
                "I1: free + evictable + in_use != num_blocks - reserved")
        _expect(len(set(self._evictable.values())) == len(ev), "I9: duplicate LRU ticks")
        live = set(self._heap)
        _expect(all((t, b) in live for b, t in self._evictable.items()),
                "I9: LRU heap lost a block")
        _expect(len(self._by_hash) == len(self._meta), "I4: hash table and block metadata differ")
        for h, b in self._by_hash.items():
            m = self._meta.get(b)
            _expect(m is not None and m.hash == h, f"I4: hash {h} -> block {b} not mirrored")
            _expect(len(m.key[1]) == self.block_size, f"I4: block {b} hashed while not full")
            _expect(m.hash == hash_block(m.parent_hash, m.key[1]), f"I4: block {b} hash stale")

    # ################################### Internal helpers ###################################

    def _check_id(self, block) -> int:
        if isinstance(block, bool) or not isinstance(block, int):
            raise TypeError(f"block: expected int, got {type(block).__name__}")
        b = block
        if not 0 <= b < self.num_blocks:
            raise ForeignId(f"block: {b} out of range [0, {self.num_blocks})")
        if b in self.reserved:
            raise ForeignId(f"block: {b} is reserved (null block); it is never allocated or freed")
        return b

    def _pop_lru(self) -> int:
        while self._heap:
            t, b = heapq.heappop(self._heap)
            if self._evictable.get(b) == t:
                self._log(("heap_pop", t, b))
                return b
        raise OutOfBlocks(f"no free block: all {self.num_usable} usable blocks are in use")

    def _log(self, rec: tuple) -> None:
        if self._journal is not None:
            self._journal.append(rec)

    def _rollback(self) -> None:
        """Undo the journal newest-first (each record is the exact inverse of one mutation)."""
        j, self._journal = self._journal, None
        for rec in reversed(j):
            op, b = rec[0], rec[1]
            if op == "pop_free":
                self._ref[b] = 0
                self._free.appendleft(b)
            elif op == "heap_pop":
                heapq.heappush(self._heap, (rec[1], rec[2]))
            elif op == "evict":
                _, _, tick, m = rec
                self._ref[b] = 0
                self._evictable[b] = tick
                self._by_hash[m.hash] = b
                self._meta[b] = m
            elif op == "incref":
                self._ref[b] -= 1
                if rec[2] is not None:             # back into the LRU set, same tick
                    self._evictable[b] = rec[2]
                    heapq.heappush(self._heap, (rec[2], b))
            elif op == "decref":
                self._ref[b] += 1
                if rec[2] == "free":
                    assert self._free.pop() == b
                elif rec[2] == "evictable":
                    del self._evictable[b]         # its heap entry goes stale
                    self._clock -= 1
            elif op == "register":
                del self._by_hash[self._meta.pop(b).hash]
        self._compact_heap()

    def _compact_heap(self) -> None:
        """Drop stale heap entries once they outnumber the live ones (keeps pops O(log n))."""
        if len(self._heap) > 2 * len(self._evictable) + 64:
            self._heap = [(t, b) for b, t in self._evictable.items()]
            heapq.heapify(self._heap)


def _expect(cond: bool, msg: str) -> None:
    if not cond:
        raise IntegrityError(msg)
