"""Radix prefix cache (SGLang RadixAttention, reference §2.2-2.4), built for low CPU overhead.

A compressed radix tree over token ids. Each edge (node) holds a key (its token run) and a value
(the pool slots holding those tokens' KV). Sharing a prefix = sharing the path from the root.

Performance design (see docs/radix_cache.md):
* keys are `bytes` of int64 tokens: the per-node comparison `query[a:b] == node.key` is one
  memcmp in C, and children are keyed by the first page's bytes;
* values are int64 numpy arrays, copied on store; a match concatenates them in one call;
* `insert(..., start=match)` continues from a match handle instead of re-walking the prefix;
* eviction order is kept incrementally (radix_evict.py): `evict` never scans all leaves, and
  frees all its victims with one pool call;
* no reference cycles and one GC-tracked object per node: the cache owns its nodes in one
  `nid -> node` dict, a node points up to its parent object but down only by id (`children`
  maps first-page bytes to child nids: a dict of bytes and ints, which the collector does not
  track). A dropped tree is freed by reference counting, never by a collector pass.
  TreeNode, MatchResult and encode_tokens live in radix_node.py.

Namespaces: `extra_key` (LoRA id, tenant salt...) selects a separate root; namespaces never share
nodes. Lock counts are per node and cover the path to the root (§2.3): `lock_ref(node)` is the
number of live handles whose path contains the node; each root holds a permanent lock of 1.
"""
from __future__ import annotations

import itertools

import numpy as np
import torch

from .errors import ForeignId, LockError, OutOfBlocks
from .radix_evict import EvictionIndex, evict_leaves
from .radix_node import _TB, MatchResult, TreeNode, encode_tokens
from .token_pool import PagedTokenPool, TokenPool, as_slot_array, out_of_range

__all__ = ["RadixCache", "TreeNode", "MatchResult", "encode_tokens"]

_UIDS = itertools.count(1)


class RadixCache:
    """Radix prefix cache over a token pool (`TokenPool`, or `PagedTokenPool` for page_size > 1).

    Example:
        >>> cache = RadixCache.create_simulated(64)
        >>> slots = cache.pool.alloc(5)
        >>> cache.insert([1, 2, 3, 4, 5], slots)
        0
        >>> cache.match_prefix([1, 2, 3, 9]).indices.tolist() == slots[:3].tolist()
        True
    """

    def __init__(self, pool: TokenPool, page_size: int = 1, eviction: str = "lru"):
        if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
            raise ValueError(f"page_size: expected a positive int, got {page_size!r}")
        if not isinstance(pool, TokenPool):
            raise TypeError(f"pool: expected a TokenPool, got {type(pool).__name__}")
        if page_size > 1 and getattr(pool, "page_size", 1) != page_size:
            raise ValueError(f"pool: page_size {pool.page_size} != cache page_size {page_size}")
        self.pool = pool
        self.page_size = page_size
        self._pb = page_size * _TB
        self._uid = next(_UIDS)
        self._index = EvictionIndex(eviction)
        self.eviction = eviction
        self._clock = 0
        self._nids = itertools.count()
        self._evictable = 0
        self._protected = 0
        self._roots: dict = {}
        self._nodes: dict[int, TreeNode] = {}   # every non-root node in the tree, by nid
        self._root(None)

    @classmethod
    def create_simulated(cls, size: int = 4096, page_size: int = 1,
                         eviction: str = "lru") -> "RadixCache":
        """A cache over a fresh pool of `size` slots (no device memory), for tests and benches."""
        pool = TokenPool(size) if page_size == 1 else PagedTokenPool(size, page_size)
        return cls(pool, page_size=page_size, eviction=eviction)

    ##### Public API #####

    def match_prefix(self, tokens, *, extra_key=None) -> MatchResult:
        """Longest cached page-aligned prefix of `tokens` in namespace `extra_key`.

        Mutates: may split the node where the match ends (at a page boundary) so that
        `last_node` ends exactly at the prefix; touches the path (LRU time, LFU hits). Does not
        lock: call `inc_lock_ref(result.last_node)` before using `indices`.
        """
        key = encode_tokens(tokens)
        n = len(key) - len(key) % self._pb
        node = self._root(extra_key)
        vals = []
        if n:
            self._clock += 1
            node = self._walk(node, key, 0, n, vals, True)[0]
        if not vals:
            return MatchResult(torch.empty(0, dtype=torch.int64), node)
        out = vals[0].copy() if len(vals) == 1 else np.concatenate(vals)
        return MatchResult(torch.from_numpy(out), node)

    def insert(self, tokens, indices, *, extra_key=None, start=None) -> int:
        """Cache `tokens[:L]` with slots `indices[:L]`, L = len(tokens) rounded down to a page.

        Returns the number of leading tokens that were already cached: the caller still owns
        `indices[:returned]` that differ from the cached ones and must free its duplicates
        (`indices[locked_prefix:returned]`). The new part is copied, so later writes to
        `indices` do not reach the cache. `start`: a MatchResult of `match_prefix` on a prefix
        of the same tokens and extra_key (or a `(node, prefix_len)` pair), still in the tree
        (e.g. locked); the walk resumes there instead of at the root.
        """
        if isinstance(start, MatchResult):
            start = (start.last_node, start.indices.shape[0])
        return self._insert(tokens, indices, extra_key, start)[0]

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Lock the path root..node; returns the tokens that moved from evictable to protected.

        Raises LockError for a node deleted from or foreign to this cache (nothing changed).
        """
        self._check_node(node)
        delta = 0
        index = self._index
        while node.parent is not None:
            if node.lock_ref == 0:
                delta += len(node.key)
                if node.where:
                    index.remove(node)
            node.lock_ref += 1
            node = node.parent
        delta //= _TB
        self._evictable -= delta
        self._protected += delta
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Unlock the path root..node (and touch it); returns the tokens that became evictable.

        Raises LockError if `node` is not locked (a lock count never goes negative), deleted,
        or foreign (nothing changed). A root is always locked: unlocking it is a no-op.
        """
        self._check_node(node)
        if node.parent is not None and node.lock_ref <= 0:
            raise LockError(f"node: dec_lock_ref on an unlocked node (nid {node.nid})")
        self._clock += 1
        clock, index, delta = self._clock, self._index, 0
        while node.parent is not None:
            node.lock_ref -= 1
            node.time = clock
            if node.lock_ref == 0:
                delta += len(node.key)
                if not node.children:
                    index.add(node)
            node = node.parent
        delta //= _TB
        self._evictable += delta
        self._protected -= delta
        return delta

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots from unlocked leaves, lowest priority first
        (LRU: oldest touch; LFU: fewest hits, then oldest). A parent left childless and unlocked
        becomes a leaf and competes with its old time (§2.4). Returns the tokens freed.

        All victims' slots go back in one `pool.free` call; if it raises, the victims are put
        back (tree, sizes and eviction order as before the call) and the error propagates.
        Raises ValueError for negative `num_tokens`, OutOfBlocks if it exceeds
        `evictable_size()` (nothing evicted). Locked paths are never touched.
        """
        if not isinstance(num_tokens, (int, np.integer)) or num_tokens < 0:
            raise ValueError(f"num_tokens: expected a non-negative int, got {num_tokens!r}")
        if num_tokens > self._evictable:
            raise OutOfBlocks(f"num_tokens={num_tokens} > evictable_size={self._evictable}")
        return evict_leaves(self, num_tokens)

    def evictable_size(self) -> int:
        """Tokens in unlocked nodes (all of them reachable by repeated leaf eviction)."""
        return self._evictable

    def protected_size(self) -> int:
        """Tokens in locked nodes."""
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    def peek_prefix_len(self, tokens, *, extra_key=None) -> int:
        """Length of the cached page-aligned prefix of `tokens`. Read-only: no split, no touch."""
        key = encode_tokens(tokens)
        n = len(key) - len(key) % self._pb
        node = self._roots.get(extra_key)
        pos, pb = 0, self._pb
        while node is not None and pos < n:
            cid = node.children.get(key[pos:pos + pb]) if node.children else None
            if cid is None:
                break
            child = self._nodes[cid]
            ck = child.key
            if key[pos:pos + len(ck)] == ck and pos + len(ck) <= n:
                pos += len(ck)
                node = child
                continue
            pos += self._common(ck, key, pos, n)
            break
        return pos // _TB

    def child_nodes(self, node: TreeNode) -> list:
        """The children of `node` (TreeNode objects; `node.children` holds their nids)."""
        nodes = self._nodes
        return [nodes[c] for c in node.children.values()] if node.children else []

    def namespaces(self) -> list:
        return list(self._roots)

    def root(self, extra_key=None) -> TreeNode:
        return self._root(extra_key)

    def pretty_print(self, max_tokens: int = 8, file=None) -> str:
        """Render the tree (one node per line); printed to `file` if given, always returned."""
        from .radix_integrity import render_tree
        text = render_tree(self, max_tokens)
        if file is not None:
            print(text, file=file)
        return text

    def check_integrity(self) -> None:
        """Walk the whole tree and check R1-R10 structure/accounting; raises IntegrityError."""
        from .radix_integrity import check_radix_integrity
        check_radix_integrity(self)

    ##### Internal #####

    def _root(self, extra_key) -> TreeNode:
        root = self._roots.get(extra_key)
        if root is None:
            try:
                hash(extra_key)
            except TypeError:
                raise TypeError(f"extra_key: must be hashable, got {type(extra_key).__name__}")
            root = TreeNode(b"", np.empty(0, np.int64), None, 0, -1, self._uid, extra_key)
            root.children = {}
            root.lock_ref = 1
            self._roots[extra_key] = root
        return root

    def _check_node(self, node) -> None:
        if not isinstance(node, TreeNode) or node.owner != self._uid:
            raise LockError(f"node: not a node of this cache ({node!r})")
        if node.parent is None and self._roots.get(node.ns) is not node:
            raise LockError(f"node: nid {node.nid} was evicted from the tree")

    def _common(self, ck: bytes, key: bytes, pos: int, n: int) -> int:
        """Bytes of the page-aligned common prefix of `ck` and `key[pos:n]`."""
        m = min(len(ck), n - pos) // _TB
        a = np.frombuffer(ck, np.int64, count=m)
        b = np.frombuffer(key, np.int64, count=m, offset=pos)
        neq = a != b
        i = int(neq.argmax())             # 0 when all equal: checked below
        if not neq[i]:
            i = m
        return (i - i % self.page_size) * _TB

    def _split(self, child: TreeNode, m: int) -> TreeNode:
        """Cut `child` after `m` key bytes (page-aligned, 0 < m < len(key)); returns the upper
        half, a new node that takes child's place under the parent. Keeps lock_ref, time, hits
        on both halves, so every size counter is unchanged; child keeps its identity (handles
        to it stay valid and its path length is unchanged)::

            parent --[k0 .. k_m)--> new --[k_m .. k_end)--> child
        """
        t, pb = m // _TB, self._pb
        parent = child.parent
        new = TreeNode(child.key[:m], child.value[:t].copy(), parent, child.time,
                       next(self._nids), self._uid, child.ns)
        new.lock_ref, new.hits = child.lock_ref, child.hits
        child.key = child.key[m:]
        child.value = child.value[t:].copy()
        child.parent = new
        new.children = {child.key[:pb]: child.nid}
        parent.children[new.key[:pb]] = new.nid
        self._nodes[new.nid] = new
        return new

    def _walk(self, node: TreeNode, key: bytes, pos: int, n: int, vals: list, count_hit: bool):
        """Descend from `node` along `key[pos:n]` (page-aligned bounds), splitting where the
        match ends inside a node; touches and collects the values of the matched nodes.
        Returns (last node, end of the match in key bytes).

        NOTE: `key` may run past `n` by less than a page. A node key, a multiple of pages, that
        would reach past `n` makes `key[pos:pos + kl]` shorter than itself, so it never matches.
        """
        pb, clock, index, lfu = self._pb, self._clock, self._index, self._index._lfu
        nodes = self._nodes
        while pos < n:
            children = node.children
            cid = children.get(key[pos:pos + pb]) if children else None
            if cid is None:
                break
            child = nodes[cid]
            ck = child.key
            kl = len(ck)
            if key[pos:pos + kl] != ck:
                child = self._split(child, self._common(ck, key, pos, n))
                kl = len(child.key)
            child.time = clock
            if count_hit and lfu:
                child.hits += 1
            if child.where:
                index.touch(child)
            vals.append(child.value)
            pos += kl
            node = child
        return node, pos

    def _insert(self, tokens, indices, extra_key, start):
        """insert(); returns (already_cached_len, last_node, cached_values_after_start)."""
        key = encode_tokens(tokens)
        n = len(key) - len(key) % self._pb
        idx = as_slot_array(indices, "indices")
        if idx.size * _TB < n:
            raise ValueError(f"indices: {idx.size} slots for {n // _TB} tokens to cache")
        node, pos = self._root(extra_key), 0
        if start is not None:
            sn, slen = start
            if not isinstance(sn, TreeNode) or sn.owner != self._uid or sn.ns != extra_key:
                raise ForeignId("start: match handle of another cache or namespace")
            if sn.parent is not None and slen * _TB <= n:
                node, pos = sn, slen * _TB
        self._clock += 1
        if pos:  # resuming below the root: touch the path above, as a full walk would
            up = node
            if up.where:
                up.time = self._clock
                self._index.touch(up)
            while up.parent is not None:
                up.time = self._clock
                up = up.parent
        vals = []
        if pos < n:
            node, pos = self._walk(node, key, pos, n, vals, False)
        if pos < n:
            new = idx[pos // _TB:n // _TB]
            self._check_new_slots(new)
            leaf = TreeNode(key[pos:n], new.copy(), node, self._clock, next(self._nids),
                            self._uid, extra_key)
            if node.children is None:
                node.children = {}
                if node.where:
                    self._index.remove(node)
            node.children[key[pos:pos + self._pb]] = leaf.nid
            self._nodes[leaf.nid] = leaf
            self._evictable += len(new)
            self._index.add(leaf)
            return pos // _TB, leaf, vals
        return n // _TB, node, vals

    def _check_new_slots(self, new: np.ndarray) -> None:
        if out_of_range(new, self.pool.size):
            raise ForeignId(f"indices: slot out of range [0, {self.pool.size})")
        if self.page_size > 1 and isinstance(self.pool, PagedTokenPool):
            self.pool.pages_of(new, "indices")
