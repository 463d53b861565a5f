"""Paged block manager: per-sequence block tables, fork, copy-on-write, optional prefix caching.

The vLLM scheme (docs/block_manager.md): a sequence of ``L`` tokens owns ``ceil(L / B)`` physical
blocks; ``fork`` copies the parent's table and adds one reference per block (zero new blocks);
appending to a partially filled tail that another sequence shares (``ref > 1``) first moves the
writer to a fresh block and returns the ``(src, dst)`` copy the caller runs with
``pagedattn.copy_blocks`` before writing the new token's KV::

    parent  [ b7 | b3 (2 of 4) ]              fork -> child [ b7 | b3 ]   ref(b3) = 2
    child.append_slot  -> [(3, 12)]            child [ b7 | b12 (3 of 4) ] ref(b3) = 1

With ``enable_prefix_caching=True`` every full block is published under a chained hash of its
tokens; a later ``allocate`` with the same token prefix shares those blocks instead of computing
them again (re-verifying the tokens on every hit), and blocks freed while hashed stay reusable
until the allocator needs them (least recently freed first).

Every operation is all-or-nothing: a typed error (``OutOfBlocks``, ``ForeignId``, ``DoubleFree``,
``DuplicateSeq``) leaves the manager deep-equal (``snapshot()``) to its state before the call.
"""
from __future__ import annotations

import enum
from collections import Counter
from typing import Dict, Hashable, List, NamedTuple, Optional, Sequence, Tuple

import torch

from pagedattn.cache_mgmt import block_allocator as _ba
from pagedattn.cache_mgmt.block_allocator import (NULL_BLOCK, BlockAllocator, BlockMeta,
                                                  IntegrityError, _check_int, _expect)
from pagedattn.cache_mgmt.errors import CacheError, ForeignId

__all__ = ["AllocStatus", "AllocResult", "BlockTables", "BlockManager", "BlockAllocator",
           "DuplicateSeq", "IntegrityError", "NULL_BLOCK"]

SeqId = Hashable
Copy = Tuple[int, int]


class DuplicateSeq(CacheError, ValueError):
    """``allocate``/``fork`` with a sequence id that is already live."""


class AllocStatus(enum.Enum):
    """Answer of ``can_allocate``."""
    OK = "ok"          # enough free blocks now, watermark kept
    LATER = "later"    # fits the pool, not the blocks free now
    NEVER = "never"    # larger than the pool minus the watermark: will never fit


class AllocResult(NamedTuple):
    """Result of ``allocate``: the new table and how many leading tokens were cache hits.

    The first ``num_cached_tokens`` tokens' KV is already in the cache (shared blocks): the caller
    computes and writes only tokens ``num_cached_tokens ..`` (always at least the last one).
    """
    block_ids: Tuple[int, ...]
    num_cached_tokens: int


class BlockTables(NamedTuple):
    """Kernel inputs for a batch: ``block_table`` int32 ``[num_seqs, width]`` and ``seq_lens``
    int32 ``[num_seqs]``. Padding entries are the null block, never read (``seq_lens`` bounds)."""
    block_table: torch.Tensor
    seq_lens: torch.Tensor


class _Chain(NamedTuple):
    """Prefix identity of one full block of a sequence: its chained hash and nested key."""
    hash: int
    key: tuple


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    """Block tables of live sequences over one ``BlockAllocator``.

    Parameters
    ----------
    num_blocks, block_size : int
        pool geometry (``num_blocks`` includes the reserved null block 0).
    watermark : float
        fraction of usable blocks ``can_allocate`` keeps free for decode growth, in ``[0, 1)``.
    enable_prefix_caching : bool
        share full blocks across sequences by token prefix; then ``token_ids`` are required.
    reserved : iterable of int
        reserved block ids (default ``(0,)``, the null block); see ``BlockAllocator``.

    Examples
    --------
    >>> bm = BlockManager(8, 4)
    >>> bm.allocate("a", 6).block_ids
    (1, 2)
    >>> bm.fork("a", "b"); bm.append_slot("b")
    [(2, 3)]
    >>> bt, lens = bm.get_block_table(["a", "b"]); bt.tolist(), lens.tolist()
    ([[1, 2], [1, 3]], [6, 7])
    """

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.01, *,
                 enable_prefix_caching: bool = False, reserved=(NULL_BLOCK,)):
        if not isinstance(watermark, (int, float)) or not 0 <= watermark < 1:
            raise ValueError(f"watermark: expected a float in [0, 1), got {watermark!r}")
        self.allocator = BlockAllocator(num_blocks, block_size, reserved=reserved)
        self.block_size = block_size
        self.watermark = float(watermark)
        self.watermark_blocks = int(watermark * self.allocator.num_usable)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.pad_id = min(self.allocator.reserved, default=NULL_BLOCK)
        self._tables: Dict[SeqId, List[int]] = {}
        self._lens: Dict[SeqId, int] = {}
        self._tokens: Dict[SeqId, List[int]] = {}      # prefix caching only
        self._chains: Dict[SeqId, List[_Chain]] = {}   # prefix caching only: one per full block

    # ##################################### Public API #####################################

    @property
    def num_free_blocks(self) -> int:
        """Blocks obtainable now (free + evictable cached)."""
        return self.allocator.num_free_blocks

    def __contains__(self, seq_id) -> bool:
        return seq_id in self._tables

    def seq_ids(self) -> List[SeqId]:
        return list(self._tables)

    def seq_len(self, seq_id: SeqId) -> int:
        return self._lens[self._check_seq(seq_id)]

    def block_ids(self, seq_id: SeqId) -> Tuple[int, ...]:
        """A copy of ``seq_id``'s block table (read-only view of the state)."""
        return tuple(self._tables[self._check_seq(seq_id)])

    def slot_of(self, seq_id: SeqId, position: int = -1) -> int:
        """Cache slot ``block * block_size + offset`` of token ``position`` (-1: the last one),
        the ``slot_mapping`` entry ``pagedattn.store_kv`` takes."""
        n = self._lens[self._check_seq(seq_id)]
        pos = position + n if position < 0 else position
        if not 0 <= pos < n:
            raise ValueError(f"position: {position} out of range for a sequence of {n} tokens")
        B = self.block_size
        return self._tables[seq_id][pos // B] * B + pos % B

    def can_allocate(self, num_tokens: int) -> AllocStatus:
        """Whether a new sequence of ``num_tokens`` fits (ignores prefix hits: conservative).

        Read-only. ``OK`` leaves ``watermark_blocks`` free afterwards; ``NEVER`` means the
        request exceeds the usable pool minus the watermark.
        """
        need = _cdiv(_check_int("num_tokens", num_tokens, 0), self.block_size)
        if self.allocator.num_usable - need < self.watermark_blocks:
            return AllocStatus.NEVER
        if self.allocator.num_free_blocks - need >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def allocate(self, seq_id: SeqId, num_tokens: Optional[int] = None, *,
                 token_ids: Optional[Sequence[int]] = None) -> AllocResult:
        """Create ``seq_id`` with ``num_tokens`` tokens (or ``len(token_ids)``).

        Mutates: a new table of ``ceil(n / block_size)`` blocks; prefix-cache hits (whole blocks,
        at most ``n - 1`` tokens) get one more reference, the rest are fresh blocks; fresh full
        blocks are published in the prefix cache. Raises ``OutOfBlocks`` (state rolled back),
        ``DuplicateSeq``, ``ValueError`` / ``TypeError`` for bad arguments.

        NOTE: blocks are published when allocated, before their KV is written: the caller writes
        the KV in the same step, before any later ``allocate`` can read it.
        """
        if seq_id in self._tables:
            raise DuplicateSeq(f"seq_id: {seq_id!r} is already allocated")
        toks = self._check_tokens(num_tokens, token_ids)
        n = len(toks) if toks is not None else num_tokens
        B, A = self.block_size, self.allocator
        blocks: List[int] = []
        chain: List[_Chain] = []
        with A.transaction():
            if self.enable_prefix_caching:           # region: hits, at most n - 1 tokens
                for i in range(max(n - 1, 0) // B):
                    link = self._link(chain, toks[i * B:(i + 1) * B])
                    b = A.lookup(link.hash, link.key)
                    if b is None:
                        break
                    A.incref(b)
                    blocks.append(b)
                    chain.append(_Chain(link.hash, A.meta(b).key))
            n_hit = len(blocks)
            for _ in range(n_hit, _cdiv(n, B)):       # region: fresh blocks (may raise)
                blocks.append(A.allocate())
            if self.enable_prefix_caching:           # region: publish fresh full blocks
                for i in range(n_hit, n // B):
                    chain.append(self._publish(chain, blocks[i], toks[i * B:(i + 1) * B]))
        self._tables[seq_id] = blocks
        self._lens[seq_id] = n
        if self.enable_prefix_caching:
            self._tokens[seq_id] = list(toks)
            self._chains[seq_id] = chain
        return AllocResult(tuple(blocks), n_hit * B)

    def append_slot(self, seq_id: SeqId, token_id: Optional[int] = None) -> List[Copy]:
        """Reserve the slot of one more token and return the copies to run first.

        Mutates: at a block boundary, one fresh block is appended (no copy). On a partially
        filled tail shared with another sequence (``ref > 1``), the tail is replaced by a fresh
        block and ``[(old_tail, new_tail)]`` returned: run it (``pagedattn.copy_blocks``) before
        writing the new token's KV; the siblings keep the old block. A tail that becomes full
        is published in the prefix cache. Raises ``OutOfBlocks`` (state unchanged), ``ForeignId``.
        """
        tbl = self._tables[self._check_seq(seq_id)]
        if self.enable_prefix_caching:
            if token_id is None:
                raise ValueError("token_id: required when enable_prefix_caching=True")
            _check_int("token_id", token_id, 0)
        n, B, A = self._lens[seq_id], self.block_size, self.allocator
        copies: List[Copy] = []
        if n % B == 0:
            tbl.append(A.allocate())
        elif A.ref_count(tbl[-1]) > 1:               # copy-on-write of the shared tail
            with A.transaction():
                new = A.allocate()
                A.free(tbl[-1])
            copies.append((tbl[-1], new))
            tbl[-1] = new
        self._lens[seq_id] = n + 1
        if self.enable_prefix_caching:
            toks = self._tokens[seq_id]
            toks.append(token_id)
            if (n + 1) % B == 0:
                chain = self._chains[seq_id]
                chain.append(self._publish(chain, tbl[-1], toks[n + 1 - B:]))
        return copies

    def fork(self, parent_id: SeqId, child_id: SeqId) -> None:
        """Make ``child_id`` share every block of ``parent_id`` (no new block, refs + 1).

        Mutates: a copy of the parent's table under ``child_id``; ``ref += 1`` per entry.
        Raises ``ForeignId`` (unknown parent), ``DuplicateSeq`` (live child id).
        """
        tbl = self._tables[self._check_seq(parent_id, "parent_id")]
        if child_id in self._tables:
            raise DuplicateSeq(f"child_id: {child_id!r} is already allocated")
        for b in tbl:
            self.allocator.incref(b)
        self._tables[child_id] = list(tbl)
        self._lens[child_id] = self._lens[parent_id]
        if self.enable_prefix_caching:
            self._tokens[child_id] = list(self._tokens[parent_id])
            self._chains[child_id] = list(self._chains[parent_id])

    def free(self, seq_id: SeqId) -> None:
        """Drop ``seq_id``: one reference off each of its blocks, tail first.

        Mutates: forgets the sequence; blocks reaching ref 0 become free or (hashed) evictable,
        tail first so that the tail is evicted before the prefix. Raises ``ForeignId`` for an
        unknown or already freed id (nothing changes).
        """
        tbl = self._tables.pop(self._check_seq(seq_id))
        for b in reversed(tbl):
            self.allocator.free(b)
        del self._lens[seq_id]
        self._tokens.pop(seq_id, None)
        self._chains.pop(seq_id, None)

    def get_block_table(self, seq_ids: Sequence[SeqId], *, device="cpu",
                        width: Optional[int] = None) -> BlockTables:
        """Padded ``block_table`` and ``seq_lens`` (both int32 on ``device``) for a batch.

        Read-only. ``width`` fixes the number of columns (e.g. for CUDA graphs); default: the
        longest table (at least 1). Padding is the null block (``pad_id``, 0 by default).
        """
        tbls = [self._tables[self._check_seq(s, "seq_ids")] for s in seq_ids]
        need = max((len(t) for t in tbls), default=0)
        if width is None:
            width = max(need, 1)
        elif _check_int("width", width, 0) < need:
            raise ValueError(f"width: {width} columns cannot hold a table of {need} blocks")
        pad = self.pad_id
        rows = [t + [pad] * (width - len(t)) for t in tbls]
        bt = torch.tensor(rows, dtype=torch.int32).reshape(len(rows), width)
        lens = torch.tensor([self._lens[s] for s in seq_ids], dtype=torch.int32)
        return BlockTables(bt.to(device), lens.to(device))

    def snapshot(self) -> tuple:
        """Canonical deep copy of the whole state: equal snapshots == equal managers."""
        seqs = sorted(self._tables, key=repr)
        return (self.allocator.snapshot(),
                tuple((repr(s), tuple(self._tables[s]), self._lens[s],
                       tuple(self._tokens.get(s, ())), tuple(self._chains.get(s, ())))
                      for s in seqs))

    def check_integrity(self) -> None:
        """Walk every table and the allocator; raise ``IntegrityError`` on a broken invariant.

        I1/I8 and the registry half of I4 in the allocator; here: I2 (refs == table entries),
        I3 (tables hold only in-use, non-reserved ids), I4/I6 (hashed blocks hold their
        sequences' tokens), I5 (a shared block is a partial tail only if it is the same-length
        tail of every sharer), table lengths == ceil(len / block_size).
        """
        A, B = self.allocator, self.block_size
        A.check_integrity()
        _expect(set(self._tables) == set(self._lens), "table and length maps differ")
        owners: Dict[int, List[Tuple[SeqId, int]]] = {}
        for s, tbl in self._tables.items():
            n = self._lens[s]
            _expect(len(tbl) == _cdiv(n, B), f"seq {s!r}: {len(tbl)} blocks for {n} tokens")
            for i, b in enumerate(tbl):
                _expect(0 <= b < A.num_blocks and b not in A.reserved,
                        f"I3: seq {s!r} holds reserved/foreign block {b}")
                owners.setdefault(b, []).append((s, i))
            if self.enable_prefix_caching:
                self._check_chain(s)
        refs = Counter({b: len(o) for b, o in owners.items()})
        for b in range(A.num_blocks):
            _expect(A._ref[b] == refs[b], f"I2: block {b} ref {A._ref[b]} != {refs[b]} entries")
        for b, own in owners.items():
            fills = {self._lens[s] - i * B for s, i in own}
            partial = [f for f in fills if f < B]
            _expect(not partial or len(fills) == 1,
                    f"I5: shared block {b} is a partial tail of some sharers but not all: {own}")

    # ################################### Internal helpers ###################################

    def _check_seq(self, seq_id, name: str = "seq_id"):
        if seq_id not in self._tables:
            raise ForeignId(f"{name}: unknown sequence {seq_id!r} (never allocated or freed)")
        return seq_id

    def _check_tokens(self, num_tokens, token_ids):
        if token_ids is None:
            if self.enable_prefix_caching:
                raise ValueError("token_ids: required when enable_prefix_caching=True")
            if num_tokens is None:
                raise ValueError("num_tokens: give num_tokens or token_ids")
            _check_int("num_tokens", num_tokens, 0)
            return None
        toks = tuple(map(int, token_ids))
        if num_tokens is not None and _check_int("num_tokens", num_tokens, 0) != len(toks):
            raise ValueError(f"num_tokens: {num_tokens} != len(token_ids) {len(toks)}")
        return toks

    def _link(self, chain: List[_Chain], toks: Sequence[int]) -> _Chain:
        """Hash and nested key of the block after ``chain`` holding ``toks``."""
        toks = tuple(toks)
        ph, pk = (chain[-1].hash, chain[-1].key) if chain else (None, None)
        return _Chain(_ba.hash_block(ph, toks), (pk, toks))

    def _publish(self, chain: List[_Chain], block: int, toks: Sequence[int]) -> _Chain:
        """Register a full block after ``chain``; return its link (kept even if not registered:
        the hash was taken by a duplicate or a collision, and the content is still this one)."""
        link = self._link(chain, toks)
        ph = chain[-1].hash if chain else None
        self.allocator.register(block, BlockMeta(link.hash, ph, link.key))
        return link

    def _check_chain(self, s: SeqId) -> None:
        toks, chain, tbl, B = self._tokens[s], self._chains[s], self._tables[s], self.block_size
        _expect(len(toks) == self._lens[s], f"seq {s!r}: token count != length")
        _expect(len(chain) == len(toks) // B, f"I4: seq {s!r}: {len(chain)} hashed blocks")
        ph = None
        for i, link in enumerate(chain):
            blk = tuple(toks[i * B:(i + 1) * B])
            _expect(link.key[1] == blk and link.hash == _ba.hash_block(ph, blk),
                    f"I4: seq {s!r} block {i}: hash/key do not match its tokens")
            m = self.allocator.meta(tbl[i])
            _expect(m is None or (m.hash == link.hash and m.key[1] == blk),
                    f"I6: seq {s!r} block {i} (id {tbl[i]}) is cached with other tokens")
            ph = link.hash
        for i in range(len(chain), len(tbl)):
            _expect(self.allocator.meta(tbl[i]) is None, f"I4: seq {s!r}: partial block hashed")
