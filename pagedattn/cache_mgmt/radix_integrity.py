"""Full-walk integrity check and rendering of a RadixCache (TESTING.md §D6, R2-R5, R7-R10).

`check_radix_integrity` visits every node; it is O(tree) and meant for tests and debugging.
"""
from __future__ import annotations

import numpy as np

from .errors import CacheError
from .radix_evict import FRESH, PROMOTED

__all__ = ["IntegrityError", "check_radix_integrity", "render_tree", "iter_nodes"]


class IntegrityError(CacheError):
    """A cache invariant does not hold (a bug in the cache or a caller that broke a contract)."""


def iter_nodes(cache):
    """Yield every non-root node of every namespace, parents before children."""
    nodes = cache._nodes
    for root in cache._roots.values():
        stack = cache.child_nodes(root)
        while stack:
            node = stack.pop()
            yield node
            if node.children:
                stack.extend(nodes[c] for c in node.children.values())


def _fail(msg: str):
    raise IntegrityError(msg)


def check_radix_integrity(cache) -> None:
    pb, uid, nodes = cache._pb, cache._uid, cache._nodes
    evictable = protected = n_nodes = 0
    leaves, slots = set(), []
    for ns, root in cache._roots.items():
        if root.key != b"" or root.parent is not None or root.lock_ref != 1 or root.ns != ns:
            _fail(f"R2/R3: bad root of namespace {ns!r}")
        if not isinstance(root.children, dict) or root.where:
            _fail(f"R2: root of {ns!r} has no children dict or is in the eviction index")
        stack = [root]
        while stack:
            node = stack.pop()
            kids = node.children
            if kids is not None and not kids and node.parent is not None:
                _fail(f"R2: node {node.nid} has an empty children dict (must be None)")
            child_locks = 0
            for first, cid in (kids or {}).items():
                c = nodes.get(cid)
                if c is None or c.nid != cid:
                    _fail(f"R2: child id {cid} of {node.nid} is not in the node table")
                if c.parent is not node:
                    _fail(f"R2: child {c.nid} of {node.nid} has a different parent")
                if first != c.key[:pb]:
                    _fail(f"R2: child {c.nid} keyed by a page that is not its first")
                if c.time > node.time and node.parent is not None:
                    _fail(f"R8: child {c.nid} touched after its parent {node.nid}")
                child_locks += c.lock_ref
                stack.append(c)
            if node.parent is None:
                continue
            n_nodes += 1
            if node.owner != uid or node.ns != ns:
                _fail(f"R2: node {node.nid} of another cache or namespace")
            n = len(node.key)
            if n == 0 or n % pb:
                _fail(f"R2: node {node.nid} key length {n // 8} not a positive page multiple")
            v = node.value
            if not isinstance(v, np.ndarray) or v.dtype != np.int64 or v.ndim != 1:
                _fail(f"R2: node {node.nid} value is not a 1-D int64 array")
            if len(v) * 8 != n:
                _fail(f"R2: node {node.nid} key/value lengths {n // 8} != {len(v)}")
            if v.base is not None or not v.flags.owndata:
                _fail(f"R7: node {node.nid} value is a view, not a copy")
            if node.lock_ref < 0:
                _fail(f"R9: node {node.nid} lock_ref {node.lock_ref} < 0")
            if node.lock_ref < child_locks:
                _fail(f"R3: node {node.nid} lock_ref {node.lock_ref} < children's {child_locks}")
            if node.lock_ref:
                protected += len(v)
            else:
                evictable += len(v)
                if not kids:
                    leaves.add(node)
            if (node.where != 0) != (node in leaves):
                _fail(f"R5: node {node.nid} eviction-index flag {node.where} is wrong")
            slots.append(v)
    if n_nodes != len(nodes):
        _fail(f"R2: node table holds {len(nodes)} nodes, the tree {n_nodes}")
    if (evictable, protected) != (cache._evictable, cache._protected):
        _fail(f"R4: counted evictable/protected {evictable}/{protected} != kept "
              f"{cache._evictable}/{cache._protected}")
    members = cache._index.members()
    if len(members) != len(leaves) or set(members) != leaves or len(cache._index) != len(leaves):
        _fail(f"R5: eviction index holds {len(members)} nodes, {len(leaves)} evictable leaves")
    for m in members:
        if m.where not in (FRESH, PROMOTED):
            _fail(f"R5: index member {m.nid} flagged {m.where}")
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
    cache.pool.check_integrity()


def render_tree(cache, max_tokens: int = 8) -> str:
    lines = []
    for ns, root in cache._roots.items():
        lines.append(f"[root ns={ns!r}] evictable={cache._evictable} "
                     f"protected={cache._protected}")
        stack = [(c, 1) for c in cache.child_nodes(root)[::-1]]
        while stack:
            node, depth = stack.pop()
            toks = np.frombuffer(node.key, np.int64)
            more = "..." if len(toks) > max_tokens else ""
            lines.append(f"{'  ' * depth}{toks[:max_tokens].tolist()}{more} len={len(toks)} "
                         f"lock={node.lock_ref} t={node.time} hits={node.hits} nid={node.nid}")
            stack.extend((c, depth + 1) for c in cache.child_nodes(node)[::-1])
    return "\n".join(lines)
