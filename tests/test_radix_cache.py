"""Model-based test of RadixCache: every invariant after every step.

RadixMachine drives the raw API (match / insert / lock / unlock / evict) against a dict that
maps every cached page-aligned token prefix to its slots, with the model's own clock and hit
counts per prefix: the eviction order it expects never reads the cache's times or hits. Checks
R1-R10 and the exact slot partition. The request lifecycle machine and its "nothing lost"
partition: test_radix_lifecycle.py (it shares the helpers here). Page sizes 1, 2, 4, 16
throughout (mini-sglang dae78f6: pages vs tokens).
"""
import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from pagedattn.cache_mgmt.errors import LockError, OutOfBlocks
from pagedattn.cache_mgmt.radix_cache import RadixCache
from pagedattn.cache_mgmt.radix_integrity import iter_nodes
from radix_paths import radix_path

PAGE_SIZES = [1, 2, 4, 16]       # 1: token-granular; 2, 4: short prompts below a page; 16: vLLM
NUM_PAGES = [1, 2, 7, 64]        # 1 and 2: constant eviction pressure; 64: deep sharing
NAMESPACES = [None, "a"]


# ---------------------------------------------------------------- helpers shared by both machines

def node_path(cache, nid):
    """(namespace, token tuple from the root to the end of node `nid`)."""
    info = cache.node(nid)
    parts = []
    while info.parent >= 0:
        parts.append(info.tokens)
        info = cache.node(info.parent)
    return info.namespace, tuple(t for p in reversed(parts) for t in p)


def path_slots(cache, nid):
    parts = []
    while cache.node(nid).parent >= 0:
        parts.append(cache.node(nid).slots)
        nid = cache.node(nid).parent
    return np.array([s for p in reversed(parts) for s in p], np.int64)


def tree_slots(cache, locked=None):
    vals = [cache.node(x).slots for x in iter_nodes(cache)
            if locked is None or (cache.node(x).lock_ref > 0) == locked]
    return np.array([s for v in vals for s in v], np.int64)


def check_lock_refs(cache, handle_paths):
    """R3: lock_ref(node) == number of live handles whose path contains the node; own locks ==
    the handles ending exactly at it."""
    for x in iter_nodes(cache):
        ns, path = node_path(cache, x)
        info = cache.node(x)
        assert info.lock_ref == sum(1 for hns, hp in handle_paths
                                    if hns == ns and hp[:len(path)] == path), (x, info)
        assert info.own_locks == sum(1 for hns, hp in handle_paths if (hns, hp) == (ns, path))


def expected_victims(cache, n, prio):
    """Brute-force eviction order on a snapshot: min prio(node) then nid among unlocked leaves,
    a childless unlocked parent joining the candidates (docs/radix_cache.md, "Eviction order")."""
    nodes = {x: cache.node(x) for x in iter_nodes(cache)}
    kids = {x: len(info.children) for x, info in nodes.items()}
    cand = [x for x, info in nodes.items() if info.lock_ref == 0 and not info.children]
    order, freed = [], 0
    while freed < n:
        v = min(cand, key=lambda x: (*prio(x), x))
        cand.remove(v)
        order.append(v)
        freed += len(nodes[v].tokens)
        p = nodes[v].parent
        if p in nodes:
            kids[p] -= 1
            if kids[p] == 0 and nodes[p].lock_ref == 0:
                cand.append(p)
    return order


def evict_and_check(cache, n, prio=None):
    """R6: evict(n) frees >= n, only unlocked leaves, all of them in one pool call
    (victims' slots concatenated in eviction order); with `prio` (node -> sort key from a
    model), in exactly the brute-force order."""
    owner = {s: x for x in iter_nodes(cache) for s in cache.node(x).slots}
    sizes = {x: len(cache.node(x).tokens) for x in iter_nodes(cache)}
    unlocked_leaf_ok = {x for x in iter_nodes(cache) if cache.node(x).lock_ref == 0}
    locked_before = set(tree_slots(cache, locked=True).tolist())
    want = expected_victims(cache, n, prio) if prio else None
    calls, real_free = [], cache.pool._release_cached

    def spy(slots):
        calls.append(np.asarray(slots).tolist())
        real_free(slots)
    cache.pool._release_cached = spy
    try:
        freed = cache.evict(n)
    finally:
        del cache.pool._release_cached
    assert len(calls) == (1 if n else 0)
    slots = calls[0] if calls else []
    got, pos = [], 0
    while pos < len(slots):                 # split the one call back into whole victims
        x = owner[slots[pos]]
        assert [owner[s] for s in slots[pos:pos + sizes[x]]] == [x] * sizes[x]
        got.append(x)
        pos += sizes[x]
    assert freed >= n and freed == len(slots) and set(got) <= unlocked_leaf_ok
    if want is not None:
        assert got == want
    assert locked_before <= set(tree_slots(cache).tolist())
    return freed


def check_partition(cache, owned=()):
    """Nothing lost: free + tree + owned == every slot exactly once; counters agree."""
    pool = cache.pool
    parts = [pool.free_slots(), tree_slots(cache)] + list(owned)
    every = np.sort(np.concatenate(parts))
    assert np.array_equal(every, np.arange(pool.size)), "slot leaked, doubly owned or foreign"
    assert (pool.available_size() + cache.evictable_size() + cache.protected_size()
            + sum(len(o) for o in owned)) == pool.size


class FlakyFree(Exception):
    pass


# ---------------------------------------------------------------- machine 1: the raw API

class RadixMachine(RuleBasedStateMachine):
    @initialize(ps=st.sampled_from(PAGE_SIZES), pages=st.sampled_from(NUM_PAGES),
                vocab=st.sampled_from([2, 4]), policy=st.sampled_from(["lru", "lfu"]),
                c_helpers=st.booleans())
    def setup(self, ps, pages, vocab, policy, c_helpers):
        with radix_path(c_helpers):
            self.cache = RadixCache.create_simulated(ps * pages, page_size=ps, eviction=policy)
        self.ps, self.vocab, self.lfu = ps, vocab, policy == "lfu"
        self.model = {}          # (ns, page-aligned prefix tuple) -> slots of its last page
        self.mtime = {}          # (ns, prefix) -> model clock at the last touch of that page
        self.mhits = {}          # (ns, prefix) -> matches through that page
        self.clock = 0
        self.handles = []        # (node, ns, path)
        self.seen = [()]

    def draw_tokens(self, data):
        base = data.draw(st.sampled_from(self.seen))
        cut = data.draw(st.integers(0, len(base)))
        extra = data.draw(st.lists(st.integers(0, self.vocab - 1), min_size=0,
                                   max_size=8 * self.ps))
        toks = tuple(base[:cut]) + tuple(extra)
        return toks if toks else (0,)

    def model_match(self, ns, toks):
        a, ps, n = len(toks) - len(toks) % self.ps, self.ps, 0
        while n < a and (ns, toks[:n + ps]) in self.model:
            n += ps
        return n

    def model_slots(self, ns, toks, n):
        return [s for k in range(self.ps, n + 1, self.ps) for s in self.model[(ns, toks[:k])]]

    def touch(self, ns, toks, n, hit):
        """Model of a match/insert walk that covers toks[:n]: stamp its pages (and count a hit);
        when it ends inside a node, the node's lower half is stamped too (SGLang's split)."""
        self.clock += 1
        for k in range(self.ps, n + 1, self.ps):
            self.mtime[(ns, toks[:k])] = self.clock
            if hit:
                self.mhits[(ns, toks[:k])] += 1
        if n:
            for x in iter_nodes(self.cache):          # node boundaries before the call
                xns, path = node_path(self.cache, x)
                start = len(path) - len(self.cache.node(x).tokens)
                if xns == ns and start < n < len(path) and path[:n] == toks[:n]:
                    for k in range(n + self.ps, len(path) + 1, self.ps):
                        self.mtime[(ns, path[:k])] = self.clock

    def prio(self, x):
        """Model priority of node x: (hits if LFU, time) of its pages, which agree."""
        ns, path = node_path(self.cache, x)
        pages = [(ns, path[:k]) for k in range(len(path) - len(self.cache.node(x).tokens)
                                               + self.ps, len(path) + 1, self.ps)]
        times = {self.mtime[p] for p in pages}
        hits = {self.mhits[p] for p in pages}
        assert len(times) == 1 and len(hits) == 1, f"node {x} pages touched apart"
        return (hits.pop() if self.lfu else 0, times.pop())

    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES), lock=st.booleans())
    def match(self, data, ns, lock):
        toks = self.draw_tokens(data)
        n = self.model_match(ns, toks)
        self.touch(ns, toks, n, hit=True)
        m = self.cache.match_prefix(list(toks), extra_key=ns)
        assert len(m.indices) == n                                             # R1
        assert m.indices.tolist() == self.model_slots(ns, toks, n)
        if lock:
            self.cache.inc_lock_ref(m.last_node)
            self.handles.append((m.last_node, ns, toks[:n]))

    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES), mutate=st.booleans(),
          resume=st.booleans())
    def insert(self, data, ns, mutate, resume):
        toks = self.draw_tokens(data)
        pool = self.cache.pool
        need = -(-len(toks) // self.ps) * self.ps
        if need > pool.available_size() + self.cache.evictable_size():
            return
        if need > pool.available_size():
            evict_and_check(self.cache, need - pool.available_size(), self.prio)
            self.sync_model()
        slots = pool.alloc(need)
        before = self.model_match(ns, toks)
        start = None
        if resume:                            # resume at a match of a prefix of toks
            cut = data.draw(st.integers(0, len(toks)))
            k = self.model_match(ns, toks[:cut])
            self.touch(ns, toks, k, hit=True)
            start = self.cache.match_prefix(list(toks[:cut]), extra_key=ns)
        self.touch(ns, toks, before, hit=False)
        got = self.cache.insert(list(toks), slots, extra_key=ns, start=start)
        assert got == before
        a = len(toks) - len(toks) % self.ps
        for k in range(got, a, self.ps):
            key = (ns, toks[:k + self.ps])
            self.model[key] = tuple(slots[k:k + self.ps].tolist())
            self.mtime[key], self.mhits[key] = self.clock, 0
        pool.free(np.concatenate([slots[:got].numpy(), slots[a:].numpy()]))
        if mutate:                                                             # R7
            slots.fill_(-1)
        self.seen.append(toks)

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def unlock(self, data):
        i = data.draw(st.integers(0, len(self.handles) - 1))
        node, ns, path = self.handles.pop(i)
        self.clock += 1
        for k in range(self.ps, len(path) + 1, self.ps):
            self.mtime[(ns, path[:k])] = self.clock
        self.cache.dec_lock_ref(node)

    @rule(data=st.data())
    def unlock_unlocked(self, data):                                           # R9
        toks = self.draw_tokens(data)
        self.touch(None, toks, self.model_match(None, toks), hit=True)
        m = self.cache.match_prefix(list(toks))
        if m.last_node == self.cache.root() or self.cache.node(m.last_node).own_locks:
            return
        sizes = (self.cache.evictable_size(), self.cache.protected_size())
        with pytest.raises(LockError):
            self.cache.dec_lock_ref(m.last_node)
        assert (self.cache.evictable_size(), self.cache.protected_size()) == sizes

    @precondition(lambda self: any(len(p) > self.ps for _, _, p in self.handles))
    @rule(data=st.data())
    def unlock_ancestor(self, data):                                           # R9, (b)
        """A node locked only through a descendant's handle is not unlockable."""
        _, ns, path = data.draw(st.sampled_from([h for h in self.handles
                                                 if len(h[2]) > self.ps]))
        cut = data.draw(st.integers(1, len(path) // self.ps - 1)) * self.ps
        self.touch(ns, path, cut, hit=True)
        m = self.cache.match_prefix(list(path[:cut]), extra_key=ns)
        info = self.cache.node(m.last_node)
        assert len(m.indices) == cut and info.lock_ref > 0
        if info.own_locks:
            return
        before = sorted(self.cache.node(x) for x in iter_nodes(self.cache))
        with pytest.raises(LockError, match="no lock of its own"):
            self.cache.dec_lock_ref(m.last_node)
        assert sorted(self.cache.node(x) for x in iter_nodes(self.cache)) == before

    @rule(frac=st.floats(0, 1), over=st.booleans())
    def evict(self, frac, over):
        ev = self.cache.evictable_size()
        if over:
            with pytest.raises(OutOfBlocks):
                self.cache.evict(ev + 1)
            return
        evict_and_check(self.cache, int(ev * frac), self.prio)
        self.sync_model()

    @rule(frac=st.floats(0, 1))
    def evict_free_fails(self, frac):                                          # D8
        """The batched free raises: every victim goes back (state as before), then the same
        evict succeeds in the model's order."""
        c = self.cache
        n = int(c.evictable_size() * frac)
        before = (sorted(c.node(x) for x in iter_nodes(c)), c.evictable_size(),
                  c.protected_size(), c.pool.free_slots().tolist())

        def boom(slots):
            raise FlakyFree()
        c.pool._release_cached = boom
        try:
            if n:
                with pytest.raises(FlakyFree):
                    c.evict(n)
            else:
                assert c.evict(n) == 0
        finally:
            del c.pool._release_cached
        after = (sorted(c.node(x) for x in iter_nodes(c)), c.evictable_size(),
                 c.protected_size(), c.pool.free_slots().tolist())
        assert after == before
        c.check_integrity()
        evict_and_check(c, n, self.prio)
        self.sync_model()

    def sync_model(self):
        free = set(self.cache.pool.free_slots().tolist())
        self.model = {k: s for k, s in self.model.items() if s[0] not in free}

    @invariant()
    def invariants(self):
        c = self.cache
        c.check_integrity()                                                    # R2-R5, R10
        check_lock_refs(c, [(ns, p) for _, ns, p in self.handles])             # R3
        check_partition(c)
        assert len(tree_slots(c)) == len(self.model) * self.ps
        for x in iter_nodes(c):                                                # R1 slot-wise
            ns, path = node_path(c, x)
            start = len(path) - len(c.node(x).tokens)
            assert list(c.node(x).slots) == self.model_slots(ns, path, len(path))[start:]

    def teardown(self):                                                        # D6 drain
        if not hasattr(self, "cache"):
            return
        for node, _, _ in self.handles:
            self.cache.dec_lock_ref(node)
        assert self.cache.protected_size() == 0
        self.cache.evict(self.cache.evictable_size())
        assert self.cache.pool.available_size() == self.cache.pool.size
        assert all(not self.cache.child_nodes(r) for r in self.cache._roots.values())


TestRadixMachine = RadixMachine.TestCase
