"""Radix prefix cache (SGLang RadixAttention; docs/radix_cache.md), built for low CPU overhead.

A compressed radix tree over token ids. Each edge (node) holds a key (its token run) and a value
(the pool slots holding those tokens' KV). Sharing a prefix = sharing the path from the root.

Performance design (see docs/radix_cache.md):
* keys and values are `bytes` of int64 tokens and slots: the per-node comparison
  `query[a:b] == key` is one memcmp in C; children are keyed by the first page's bytes. A
  request is encoded once: the match result carries its key, and `insert(tokens, ...,
  start=match)` reuses it and resumes the walk at the matched node instead of the root;
* no object per node: a node is an int id, and its fields live in per-field dicts (`_key`,
  `_val`, `_par`, ...) whose keys and values (ints, bytes, dicts of those) the garbage
  collector does not track. The tree adds nothing to any collection, young or full;
* values are immutable copies; a match joins them and makes one tensor (`slots_tensor`);
* eviction order is kept incrementally (radix_evict.py): `evict` never scans all leaves, and
  frees all its victims with one pool call;
* C helpers (native.py: encoding, the walk, insert's slot check) when they build; otherwise
  the same steps in Python, with the same results.

Namespaces: `extra_key` (LoRA id, tenant salt...) selects a separate root; namespaces never share
nodes. Locks: `lock_ref(node)` is the number of live handles whose path contains the
node; each root holds a permanent lock of 1. `own(node)` counts the handles that end at the
node, so an unlock must name a node that was locked itself, not one locked only through a
descendant.
"""
from __future__ import annotations


import functools

import numpy as np

from . import native
from .errors import LockError, OutOfBlocks
from .radix_evict import EvictionIndex, evict_leaves
from .radix_insert import insert_tokens
from .radix_node import _NIDS, _TB, MatchResult, NodeInfo, encode_tokens, encoder, slots_tensor
from .token_pool import PagedTokenPool, TokenPool

__all__ = ["RadixCache", "MatchResult", "NodeInfo", "encode_tokens"]

_new_tuple = tuple.__new__   # builds a MatchResult without NamedTuple.__new__'s argument parsing


class RadixCache:
    """Radix prefix cache over a token pool (`TokenPool`, or `PagedTokenPool` for page_size > 1).

    Example:
        >>> cache = RadixCache.create_simulated(64)
        >>> slots = cache.pool.alloc(5)
        >>> m = cache.match_prefix([1, 2, 3, 4, 5])
        >>> cache.insert([1, 2, 3, 4, 5], slots, start=m)
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
        self.eviction = eviction
        self._pb = page_size * _TB
        # Node tables, by node id. Dense: every node has an entry. Sparse: absent means
        # None (a leaf) or 0. Roots: key b"", parent -1, a children dict, lock 1.
        self._key: dict[int, bytes] = {}        # edge tokens, int64 bytes
        self._val: dict[int, bytes] = {}        # edge slots, int64 bytes
        self._par: dict[int, int] = {}          # parent id
        self._lock: dict[int, int] = {}         # lock_ref
        self._time: dict[int, int] = {}         # cache clock at the last touch
        self._kids: dict[int, dict] = {}        # sparse: {first-page bytes: child id}
        self._first: dict[int, bytes] = {}      # the key object of a node in its parent's
                                                # _kids (evict deletes by it: no slice, no
                                                # hash, no byte compare)
        self._own: dict[int, int] = {}          # sparse: locks ending at the node
        self._hits: dict[int, int] = {}         # sparse: matches through the node (LFU)
        self._index = EvictionIndex(eviction, self._time, self._hits)
        self._roots: dict = {}                  # extra_key -> root id
        self._ns: dict = {}                     # root id -> extra_key
        # The tree holds whole pages; the pool marks each one's first slot CACHED.
        self._offs = np.arange(page_size, dtype=np.int64)
        # insert's page check: 0 .. page_size-1 repeated, and 0-d operands (radix_insert.py)
        self._tiled = np.tile(self._offs, 64)
        self._pmask = np.array(-page_size & (1 << 62) - 1, np.int64)
        self._ps0 = np.array(page_size, np.int64)
        self._clock = 0
        self._evictable = 0
        self._protected = 0
        self._root(None)
        # The C helpers (native.py) when built: encoding, the walk, insert's slot check.
        nat = native.load()
        self._encode = encoder(nat)
        self._claim = nat.claim if nat is not None else None
        if nat is not None:
            self._find = functools.partial(nat.find, self._kids, self._key, self._pb, page_size)

    @classmethod
    def create_simulated(cls, size: int = 4096, page_size: int = 1,
                         eviction: str = "lru") -> "RadixCache":
        """A cache over a fresh pool of `size` slots (no device memory), for tests and benches."""
        pool = TokenPool(size) if page_size == 1 else PagedTokenPool(size, page_size)
        return cls(pool, page_size=page_size, eviction=eviction)

    ##### Public API #####

    def match_prefix(self, tokens, *, extra_key=None) -> MatchResult:
        """Longest cached page-aligned prefix of `tokens` in namespace `extra_key`.

        `tokens`: list/tuple of ints, array.array, integer numpy array or tensor, or
        `encode_tokens` bytes; all give the same result. Mutates: may split the node where the
        match ends (at a page boundary) so that `last_node` ends exactly at the prefix; touches
        the path (LRU time, LFU hits; the lower half of a split counts as touched, as in
        SGLang). Does not lock: call `inc_lock_ref(result.last_node)` before using `indices`.
        """
        key = self._encode(tokens)
        root = self._roots.get(extra_key)
        if root is None:
            root = self._root(extra_key)
        pb, n = self._pb, len(key)
        if pb != _TB:
            n -= n % pb
        node, vals = root, []
        if n:
            path, node, _, cut, m = self._find(root, key, 0, n)
            self._clock = clock = self._clock + 1
            if cut:                                  # the match ends inside cut: split it there
                node = self._split(cut, m)           # stamps both halves
                path.append(node)
            valt, time, loc, lfu = self._val, self._time, self._index.loc, self._index.lfu
            for c in path:
                time[c] = clock
                if lfu:
                    self._hits[c] = self._hits.get(c, 0) + 1
                if c in loc:
                    self._index.touch(c)
                vals.append(valt[c])
        return _new_tuple(MatchResult, (slots_tensor(vals), node, key, tokens, root))

    def insert(self, tokens, indices, *, extra_key=None, start=None) -> int:
        """Cache `tokens[:L]` with slots `indices[:L]`, L = len(tokens) rounded down to a page.

        Returns the number of leading tokens that were already cached: the caller still owns
        `indices[:returned]` that differ from the cached ones and must free its duplicates
        (`indices[locked_prefix:returned]`). The new part is copied, so later writes to
        `indices` do not reach the cache.

        `start`: the MatchResult of `match_prefix` on a prefix of the same tokens and extra_key,
        or a `(node, prefix_len)` pair; the walk resumes at its node while that is in the tree
        (e.g. locked), else at the root. Given the very list, tuple or array.array that was
        matched (changed only by appending since), the match's encoding is reused.

        Raises, changing nothing: ValueError for fewer slots than tokens or for a `start` whose
        prefix is not a prefix of `tokens` in `extra_key`; ForeignId for a new slot that is out
        of range, free in the pool, already cached or given twice; ValueError (PagedTokenPool)
        for new slots that are not whole pages.
        """
        return insert_tokens(self, tokens, indices, extra_key, start)[0]

    def inc_lock_ref(self, node) -> int:
        """Lock the path root..node (a node id, or a MatchResult); returns the tokens that moved
        from evictable to protected. Raises LockError for a node not in this cache (evicted, or
        another cache's); nothing changes then."""
        par = self._par
        if type(node) is not int or node not in par:
            node = self._handle(node)
        p = par[node]
        if p < 0:
            return 0
        own = self._own
        own[node] = own.get(node, 0) + 1
        lock, keys, loc, delta = self._lock, self._key, self._index.loc, 0
        while p >= 0:
            ref = lock[node]
            if not ref:
                delta += len(keys[node])
                if node in loc:
                    self._index.remove(node)
            lock[node] = ref + 1
            node, p = p, par[p]
        delta >>= 3
        self._evictable -= delta
        self._protected += delta
        return delta

    def dec_lock_ref(self, node) -> int:
        """Unlock the path root..node (and touch it); returns the tokens that became evictable.

        Raises LockError, changing nothing, unless `node` holds a lock of its own (an
        `inc_lock_ref` on this very node not yet undone): a node locked only through a
        descendant, an unlocked, evicted or foreign node is refused. A root is always locked:
        unlocking it is a no-op.
        """
        par = self._par
        if type(node) is not int or node not in par:
            node = self._handle(node)
        p = par[node]
        if p < 0:
            return 0
        own = self._own.get(node, 0)
        if not own:
            raise LockError(f"node: dec_lock_ref on node {node}, which holds no lock of its own "
                            f"(lock_ref {self._lock[node]} comes from its descendants)")
        if own == 1:
            del self._own[node]
        else:
            self._own[node] = own - 1
        self._clock = clock = self._clock + 1
        lock, keys, time, kids, delta = self._lock, self._key, self._time, self._kids, 0
        while p >= 0:
            ref = lock[node] - 1
            lock[node] = ref
            time[node] = clock
            if not ref:
                delta += len(keys[node])
                if node not in kids:
                    self._index.add(node)
            node, p = p, par[p]
        delta >>= 3
        self._evictable += delta
        self._protected -= delta
        return delta

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots from unlocked leaves, lowest priority first
        (LRU: oldest touch; LFU: fewest hits, then oldest). A parent left childless and unlocked
        becomes a leaf and competes with its old time (docs/radix_cache.md, "Eviction order").
        Returns the tokens freed.

        All victims' slots go back in one pool call (`_release_cached`); if it raises, the
        victims are put back (tree, sizes and eviction order as before the call) and the error
        propagates.
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
        key = self._encode(tokens)
        root = self._roots.get(extra_key)
        if root is None:
            return 0
        _, _, pos, _, m = self._find(root, key, 0, len(key) - len(key) % self._pb)
        return (pos + m) // _TB

    def root(self, extra_key=None) -> int:
        """The root id of namespace `extra_key` (created on first use)."""
        return self._root(extra_key)

    def namespaces(self) -> list:
        return list(self._roots)

    def child_nodes(self, node: int) -> list:
        """Child ids of `node`, in insertion order."""
        return list(self._kids.get(node, {}).values())

    def node(self, nid: int) -> NodeInfo:
        """A snapshot of node `nid` (KeyError if it is not in the tree)."""
        from .radix_integrity import node_info
        return node_info(self, nid)

    def pretty_print(self, max_tokens: int = 8, file=None) -> str:
        """Render the tree (one node per line); printed to `file` if given, always returned."""
        from .radix_integrity import render_tree
        text = render_tree(self, max_tokens)
        if file is not None:
            print(text, file=file)
        return text

    def check_integrity(self) -> None:
        """Walk the whole tree and check R2-R10 structure/accounting; raises IntegrityError."""
        from .radix_integrity import check_radix_integrity
        check_radix_integrity(self)

    ##### Internal #####

    def _root(self, extra_key) -> int:
        root = self._roots.get(extra_key)
        if root is None:
            try:
                hash(extra_key)
            except TypeError:
                raise TypeError(f"extra_key: must be hashable, got {type(extra_key).__name__}")
            root = next(_NIDS)
            self._key[root], self._val[root], self._par[root] = b"", b"", -1
            self._lock[root], self._time[root], self._kids[root] = 1, self._clock, {}
            self._roots[extra_key] = root
            self._ns[root] = extra_key
        return root

    def _handle(self, node) -> int:
        """The node id of a handle (an int or a MatchResult) in this cache, else LockError."""
        if type(node) is MatchResult:
            node = node.last_node
        try:
            if int(node) == node and int(node) in self._par:
                return int(node)
        except (TypeError, ValueError):
            pass
        raise LockError(f"node: {node!r} is not in this cache (evicted, or another cache's)")

    def _find(self, node: int, key: bytes, pos: int, n: int):
        """Read-only descent from `node` along `key[pos:n]` (page-aligned bounds). Returns
        (ids of the nodes matched whole, last of them or `node`, end of that match in key
        bytes, node the match ends inside or 0, page-aligned bytes matched inside it). A node
        matches whole only if it ends by `n`, so the match never reaches the partial page.
        The C helper `find` (bound in __init__) does the same.

        Raises ValueError for bounds that are not page-aligned or not inside `key`, as `find`
        does. NOTE: without the check an unaligned `n` would give the same result here (the
        child lookup takes whole pages and `_common` rounds down), so a caller that forgot to
        round would pass every test of results on this path and fail only on the C one.
        """
        kids, keys, pb, path = self._kids, self._key, self._pb, []
        if pos < 0 or n > len(key) or pos % pb or n % pb:
            raise ValueError("find: inconsistent page or key bounds")
        while pos < n:
            ch = kids.get(node)
            c = ch.get(key[pos:pos + pb]) if ch else None
            if c is None:
                break
            ck = keys[c]
            if key.startswith(ck, pos, n):
                path.append(c)
                pos += len(ck)
                node = c
                continue
            return path, node, pos, c, self._common(ck, key, pos, n)
        return path, node, pos, 0, 0

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

    def _split(self, child: int, m: int) -> int:
        """Cut `child` after `m` key bytes (page-aligned, 0 < m < len(key)); returns the upper
        half, a new node that takes child's place under the parent. Both halves keep lock_ref
        and hits and are stamped with the clock (SGLang marks the lower half as used too);
        child keeps its identity, own locks and path length, so handles stay valid::

            parent --[k0 .. k_m)--> new --[k_m .. k_end)--> child
        """
        pb, keys, vals, clock = self._pb, self._key, self._val, self._clock
        parent, ck, cv = self._par[child], keys[child], vals[child]
        new = next(_NIDS)
        keys[new], vals[new], self._par[new] = ck[:m], cv[:m], parent
        self._lock[new], self._time[new] = self._lock[child], clock
        first = self._first
        first[new], first[child] = first[child], ck[m:m + pb]
        self._kids[new] = {first[child]: child}
        if child in self._hits:
            self._hits[new] = self._hits[child]
        keys[child], vals[child], self._par[child] = ck[m:], cv[m:], new
        self._time[child] = clock
        if child in self._index.loc:
            self._index.touch(child)
        self._kids[parent][first[new]] = new
        return new

    def _insert(self, tokens, indices, extra_key, start):
        """insert(); returns (already_cached_len, last_node, cached_values_after_start)."""
        return insert_tokens(self, tokens, indices, extra_key, start)

