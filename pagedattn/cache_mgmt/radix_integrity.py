"""Full-walk integrity check and rendering of a RadixCache: the invariants the
model-based tests check after every step (docs/radix_cache.md, "Contracts").

`check_radix_integrity` visits every node from the roots through the children tables (the real
structure, not a cached summary); it is O(tree) and meant for tests and debugging.
"""
from __future__ import annotations

import numpy as np

from .errors import CacheError
from .radix_node import NodeInfo
from .token_pool import CACHED

__all__ = ["IntegrityError", "check_radix_integrity", "render_tree", "iter_nodes", "node_info"]


class IntegrityError(CacheError):
    """A cache invariant does not hold (a bug in the cache or a caller that broke a contract)."""


def iter_nodes(cache):
    """Yield the id of every non-root node of every namespace, parents before children."""
    kids = cache._kids
    for root in cache._roots.values():
        stack = list(kids[root].values())
        while stack:
            x = stack.pop()
            yield x
            if x in kids:
                stack.extend(kids[x].values())


def node_info(cache, nid: int) -> NodeInfo:
    """RadixCache.node: a snapshot of node `nid` (KeyError if it is not in the tree)."""
    par, r = cache._par, nid
    while par[r] >= 0:
        r = par[r]
    return NodeInfo(nid, par[nid], tuple(np.frombuffer(cache._key[nid], np.int64).tolist()),
                    tuple(np.frombuffer(cache._val[nid], np.int64).tolist()),
                    tuple(sorted(cache.child_nodes(nid))),
                    cache._lock[nid], cache._own.get(nid, 0), cache._time[nid],
                    cache._hits.get(nid, 0), cache._ns[r])


def _fail(msg: str):
    raise IntegrityError(msg)


def check_radix_integrity(cache) -> None:
    pb = cache._pb
    keys, vals, par, kids = cache._key, cache._val, cache._par, cache._kids
    lock, time = cache._lock, cache._time
    own, hits = cache._own.get, cache._hits.get      # sparse tables: absent means 0
    evictable = protected = 0
    leaves, seen, slots = set(), set(), []
    for ns, root in cache._roots.items():
        if cache._ns.get(root, object()) != ns or keys.get(root) != b"" or par.get(root) != -1:
            _fail(f"R2: bad root {root} of namespace {ns!r}")
        if lock[root] != 1 or own(root, 0) or not isinstance(kids.get(root), dict):
            _fail(f"R2/R3: root of {ns!r} has lock {lock[root]}/{own(root, 0)} or no children "
                  f"dict")
        if root in cache._index.loc or len(vals[root]):
            _fail(f"R2: root of {ns!r} is in the eviction index or holds slots")
        seen.add(root)
        order = [root]                # parents before children; locks summed bottom-up below
        i = 0
        while i < len(order):
            x = order[i]
            i += 1
            for first, c in kids.get(x, {}).items():
                if c in seen:
                    _fail(f"R2: node {c} reached twice (a cycle or a shared child)")
                seen.add(c)
                if par.get(c) != x:
                    _fail(f"R2: child {c} of {x} has parent {par.get(c)}")
                if first != keys[c][:pb]:
                    _fail(f"R2: child {c} keyed by a page that is not its first")
                if first is not cache._first.get(c):
                    _fail(f"R2: child {c}'s key object in its parent is not its _first entry")
                if x != root and time[c] > time[x]:
                    _fail(f"R8: child {c} touched after its parent {x}")
                order.append(c)
        child_locks = {}
        for x in reversed(order[1:]):
            k, v = keys[x], vals[x]
            if x in kids and not kids[x]:
                _fail(f"R2: node {x} has an empty children dict (a leaf has none)")
            if not len(k) or len(k) % pb:
                _fail(f"R2: node {x} key length {len(k) // 8} not a positive page multiple")
            if type(v) is not bytes:
                _fail(f"R7: node {x} value is a {type(v).__name__}, not an immutable copy "
                      f"(bytes)")
            if len(v) != len(k):
                _fail(f"R2: node {x} key/value lengths {len(k) // 8} != {len(v) // 8}")
            v = np.frombuffer(v, np.int64)
            if own(x, 0) < 0 or lock[x] < 0 or (x in cache._own and not own(x)):
                _fail(f"R9: node {x} lock_ref {lock[x]} / own locks {own(x)} negative or a "
                      f"stored 0")
            below = child_locks.pop(x, 0)
            if lock[x] != own(x, 0) + below:
                _fail(f"R3: node {x} lock_ref {lock[x]} != own {own(x, 0)} + children's {below}")
            child_locks[par[x]] = child_locks.get(par[x], 0) + lock[x]
            if hits(x, 0) < 0 or (hits(x, 0) and cache._index.policy != "lfu"):
                _fail(f"R2: node {x} hit count {hits(x)} < 0, or counted under LRU")
            if lock[x]:
                protected += len(v)
            else:
                evictable += len(v)
                if x not in kids:
                    leaves.add(x)
            if (x in cache._index.loc) != (x in leaves):
                _fail(f"R5: node {x} eviction-index membership is wrong")
            slots.append(v)
    for name, table in {"key": keys, "val": vals, "par": par, "lock": lock,
                        "time": time}.items():
        if len(table) != len(seen) or table.keys() != seen:
            _fail(f"R2: table {name} holds {len(table)} nodes, the tree {len(seen)}")
    if cache._first.keys() != seen - set(cache._roots.values()):
        _fail(f"R2: table first holds {len(cache._first)} nodes, the tree "
              f"{len(seen) - len(cache._roots)} besides its roots")
    for name, table in {"kids": kids, "own": cache._own, "hits": cache._hits}.items():
        if not table.keys() <= seen:
            _fail(f"R2: table {name} holds nodes that are not in the tree")
    if len(cache._ns) != len(cache._roots):
        _fail("R2: namespace tables disagree")
    if (evictable, protected) != (cache._evictable, cache._protected):
        _fail(f"R4: counted evictable/protected {evictable}/{protected} != kept "
              f"{cache._evictable}/{cache._protected}")
    if set(cache._index.members()) != leaves or len(cache._index) != len(leaves):
        _fail(f"R5: eviction index holds {len(cache._index)} nodes, {len(leaves)} evictable "
              f"leaves")
    try:
        cache._index.check_order()
    except AssertionError as e:
        _fail(f"R6: {e}")
    allslots = np.concatenate(slots) if slots else np.empty(0, np.int64)
    if allslots.size:
        if allslots.min() < 0 or allslots.max() >= cache.pool.size:
            _fail("R10: tree holds a slot outside the pool")
        if np.unique(allslots).size != allslots.size:
            _fail("R10: a slot is held by two tree nodes")
        if cache.pool.is_free(allslots).any():
            _fail("R10: the tree holds a slot that the pool lists as free")
    heads = np.concatenate([v[::cache.page_size] for v in slots]) if slots else allslots
    if not np.array_equal(np.flatnonzero(cache.pool._state == CACHED), np.sort(heads)):
        _fail("R10: the pool's CACHED slots differ from the first slots of the pages in the tree")
    cache.pool.check_integrity()


def render_tree(cache, max_tokens: int = 8) -> str:
    lines = []
    for ns, root in cache._roots.items():
        lines.append(f"[root ns={ns!r}] evictable={cache._evictable} "
                     f"protected={cache._protected}")
        stack = [(c, 1) for c in cache.child_nodes(root)[::-1]]
        while stack:
            x, depth = stack.pop()
            toks = np.frombuffer(cache._key[x], np.int64)
            more = "..." if len(toks) > max_tokens else ""
            lines.append(f"{'  ' * depth}{toks[:max_tokens].tolist()}{more} len={len(toks)} "
                         f"lock={cache._lock[x]}/{cache._own.get(x, 0)} t={cache._time[x]} "
                         f"hits={cache._hits.get(x, 0)} nid={x}")
            stack.extend((c, depth + 1) for c in cache.child_nodes(x)[::-1])
    return "\n".join(lines)
