"""Model-based tests of RadixCache (TESTING.md §D6): every invariant after every step.

Two hypothesis state machines, each against a brute-force model:
* RadixMachine: the raw API (match / insert / lock / unlock / evict) vs a dict that maps every
  cached token prefix to its slot; checks R1-R10 and the exact slot partition.
* LifecycleMachine: admit / extend / cache_unfinished_req / cache_finished_req with injected
  free failures, vs the "nothing lost" partition free + tree + owned-by-requests == capacity.
Page sizes 1, 2, 4, 16 throughout (mini-sglang dae78f6: pages vs tokens).
"""
import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from pagedattn.cache_mgmt.errors import CacheError, LockError, OutOfBlocks
from pagedattn.cache_mgmt.radix_cache import RadixCache
from pagedattn.cache_mgmt.radix_integrity import iter_nodes
from pagedattn.cache_mgmt.radix_lifecycle import (Req, admit_req, cache_finished_req,
                                                  cache_unfinished_req, extend_req, owned_slots,
                                                  release_pending)



PAGE_SIZES = [1, 2, 4, 16]       # 1: token-granular; 2, 4: short prompts below a page; 16: vLLM
NUM_PAGES = [1, 2, 7, 64]        # 1 and 2: constant eviction pressure; 64: deep sharing
NAMESPACES = [None, "a"]


# ---------------------------------------------------------------- helpers shared by both machines

def node_path(node):
    """(namespace, token tuple from the root to the end of node)."""
    parts = []
    n = node
    while n.parent is not None:
        parts.append(np.frombuffer(n.key, np.int64))
        n = n.parent
    toks = np.concatenate(parts[::-1]) if parts else np.empty(0, np.int64)
    return n.ns, tuple(toks.tolist())


def path_slots(node):
    parts = []
    while node.parent is not None:
        parts.append(node.value)
        node = node.parent
    return np.concatenate(parts[::-1]) if parts else np.empty(0, np.int64)


def tree_slots(cache, locked=None):
    vals = [n.value for n in iter_nodes(cache)
            if locked is None or (n.lock_ref > 0) == locked]
    return np.concatenate(vals) if vals else np.empty(0, np.int64)


def check_lock_refs(cache, handle_paths):
    """R3: lock_ref(node) == number of live handles whose path contains the node."""
    for node in iter_nodes(cache):
        ns, path = node_path(node)
        want = sum(1 for hns, hp in handle_paths if hns == ns and hp[:len(path)] == path)
        assert node.lock_ref == want, (node, want)


def expected_victims(cache, n):
    """Brute-force eviction order on a snapshot: min (hits|0, time, nid) among unlocked leaves,
    a childless unlocked parent joining the candidates (§2.4)."""
    lfu = cache.eviction == "lfu"
    kids = {id(x): len(x.children or {}) for x in iter_nodes(cache)}
    cand = [x for x in iter_nodes(cache) if x.lock_ref == 0 and not x.children]
    order, freed = [], 0
    while freed < n:
        v = min(cand, key=lambda x: (x.hits if lfu else 0, x.time, x.nid))
        cand.remove(v)
        order.append(v.nid)
        freed += len(v)
        p = v.parent
        if p.parent is not None:
            kids[id(p)] -= 1
            if kids[id(p)] == 0 and p.lock_ref == 0:
                cand.append(p)
    return order


def evict_and_check(cache, n):
    """R6: evict(n) frees >= n, only unlocked leaves, in exactly the brute-force order, all of
    them in one pool.free call (victims' slots concatenated in eviction order)."""
    owner = {int(s): x.nid for x in iter_nodes(cache) for s in x.value}
    sizes = {x.nid: len(x) for x in iter_nodes(cache)}
    locked_before = set(tree_slots(cache, locked=True).tolist())
    want = expected_victims(cache, n)
    calls, real_free = [], cache.pool.free

    def spy(slots):
        calls.append(np.asarray(slots).tolist())
        real_free(slots)
    cache.pool.free = spy
    try:
        freed = cache.evict(n)
    finally:
        del cache.pool.free
    assert len(calls) == (1 if want else 0)
    slots = calls[0] if calls else []
    got, pos = [], 0
    while pos < len(slots):                 # split the one call back into whole victims
        nid = owner[slots[pos]]
        assert [owner[s] for s in slots[pos:pos + sizes[nid]]] == [nid] * sizes[nid]
        got.append(nid)
        pos += sizes[nid]
    assert freed >= n and got == want and freed == len(slots)
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
                vocab=st.sampled_from([2, 4]), policy=st.sampled_from(["lru", "lfu"]))
    def setup(self, ps, pages, vocab, policy):
        self.cache = RadixCache.create_simulated(ps * pages, page_size=ps, eviction=policy)
        self.ps, self.vocab = ps, vocab
        self.model = {}          # (ns, page-aligned prefix tuple) -> slots of its last page
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

    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES), lock=st.booleans())
    def match(self, data, ns, lock):
        toks = self.draw_tokens(data)
        m = self.cache.match_prefix(list(toks), extra_key=ns)
        n = self.model_match(ns, toks)
        assert len(m.indices) == n                                             # R1
        assert m.indices.tolist() == self.model_slots(ns, toks, n)
        if lock:
            self.cache.inc_lock_ref(m.last_node)
            self.handles.append((m.last_node, ns, toks[:n]))

    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES), mutate=st.booleans())
    def insert(self, data, ns, mutate):
        toks = self.draw_tokens(data)
        pool = self.cache.pool
        need = -(-len(toks) // self.ps) * self.ps
        if need > pool.available_size() + self.cache.evictable_size():
            return
        if need > pool.available_size():
            evict_and_check(self.cache, need - pool.available_size())
            self.sync_model()
        slots = pool.alloc(need)
        before = self.model_match(ns, toks)
        got = self.cache.insert(list(toks), slots, extra_key=ns)
        assert got == before
        a = len(toks) - len(toks) % self.ps
        for k in range(got, a, self.ps):
            self.model[(ns, toks[:k + self.ps])] = tuple(slots[k:k + self.ps].tolist())
        pool.free(np.concatenate([slots[:got].numpy(), slots[a:].numpy()]))
        if mutate:                                                             # R7
            slots.fill_(-1)
        self.seen.append(toks)

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def unlock(self, data):
        i = data.draw(st.integers(0, len(self.handles) - 1))
        node = self.handles.pop(i)[0]
        self.cache.dec_lock_ref(node)

    @rule(data=st.data())
    def unlock_unlocked(self, data):                                           # R9
        toks = self.draw_tokens(data)
        m = self.cache.match_prefix(list(toks))
        if m.last_node.parent is None or m.last_node.lock_ref > 0:
            return
        sizes = (self.cache.evictable_size(), self.cache.protected_size())
        with pytest.raises(LockError):
            self.cache.dec_lock_ref(m.last_node)
        assert (self.cache.evictable_size(), self.cache.protected_size()) == sizes

    @rule(frac=st.floats(0, 1), over=st.booleans())
    def evict(self, frac, over):
        ev = self.cache.evictable_size()
        if over:
            with pytest.raises(OutOfBlocks):
                self.cache.evict(ev + 1)
            return
        evict_and_check(self.cache, int(ev * frac))
        self.sync_model()

    @rule(frac=st.floats(0, 1))
    def evict_free_fails(self, frac):                                          # D8
        """The batched free raises: every victim goes back (state as before), then the same
        evict succeeds in the brute-force order."""
        c = self.cache
        n = int(c.evictable_size() * frac)
        before = (sorted((x.nid, x.key, x.value.tolist(), x.lock_ref, x.time, x.hits,
                          x.parent.nid) for x in iter_nodes(c)),
                  c.evictable_size(), c.protected_size(), c.pool.free_slots().tolist())

        def boom(slots):
            raise FlakyFree()
        c.pool.free = boom
        try:
            if expected_victims(c, n):
                with pytest.raises(FlakyFree):
                    c.evict(n)
            else:
                assert c.evict(n) == 0
        finally:
            del c.pool.free
        after = (sorted((x.nid, x.key, x.value.tolist(), x.lock_ref, x.time, x.hits,
                         x.parent.nid) for x in iter_nodes(c)),
                 c.evictable_size(), c.protected_size(), c.pool.free_slots().tolist())
        assert after == before
        c.check_integrity()
        evict_and_check(c, n)
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
        for node in iter_nodes(c):                                             # R1 slot-wise
            ns, path = node_path(node)
            start = len(path) - len(node)
            assert node.value.tolist() == self.model_slots(ns, path, len(path))[start:]

    def teardown(self):                                                        # D6 drain
        if not hasattr(self, "cache"):
            return
        for node, _, _ in self.handles:
            self.cache.dec_lock_ref(node)
        assert self.cache.protected_size() == 0
        self.cache.evict(self.cache.evictable_size())
        assert self.cache.pool.available_size() == self.cache.pool.size
        assert all(not r.children for r in self.cache._roots.values())


TestRadixMachine = RadixMachine.TestCase


# ---------------------------------------------------------------- machine 2: request lifecycle

class LifecycleMachine(RuleBasedStateMachine):
    @initialize(ps=st.sampled_from(PAGE_SIZES), pages=st.sampled_from([2, 7, 64]),
                vocab=st.sampled_from([2, 4]))
    def setup(self, ps, pages, vocab):
        self.cache = RadixCache.create_simulated(ps * pages, page_size=ps)
        self.ps, self.vocab = ps, vocab
        self.reqs: list[Req] = []
        self.seen = [()]

    def tokens(self, data, lo=1):
        base = data.draw(st.sampled_from(self.seen))
        cut = data.draw(st.integers(0, len(base)))
        extra = data.draw(st.lists(st.integers(0, self.vocab - 1), min_size=lo,
                                   max_size=3 * self.ps))
        return list(base[:cut]) + extra

    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES))
    def admit(self, data, ns):
        toks = self.tokens(data)
        try:
            req = admit_req(self.cache, toks, extra_key=ns)
        except OutOfBlocks:
            return
        self.reqs.append(req)
        self.seen.append(tuple(toks))

    def live(self):
        return [r for r in self.reqs if not r.finished]

    @precondition(lambda self: any(r.finished for r in self.reqs))
    @rule()
    def retry_pending(self):
        for r in [r for r in self.reqs if r.finished]:
            release_pending(self.cache, r)
            self.reqs.remove(r)

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def extend(self, data):
        req = data.draw(st.sampled_from(self.live()))
        add = data.draw(st.lists(st.integers(0, self.vocab - 1), min_size=1, max_size=self.ps))
        try:
            extend_req(self.cache, req, add)
        except OutOfBlocks:
            pass

    @precondition(lambda self: self.live())
    @rule(data=st.data(), fail=st.booleans())
    def unfinished(self, data, fail):
        req = data.draw(st.sampled_from(self.live()))
        with self.flaky_free(fail):
            cache_unfinished_req(self.cache, req)
        self.seen.append(tuple(req.tokens.tolist()))

    @precondition(lambda self: self.live())
    @rule(data=st.data(), fail=st.booleans())
    def finished(self, data, fail):
        req = data.draw(st.sampled_from(self.live()))
        with self.flaky_free(fail):
            cache_finished_req(self.cache, req)
        self.seen.append(tuple(req.tokens.tolist()))
        if req.pending_free.size == 0:
            self.reqs.remove(req)
        with pytest.raises(CacheError):
            cache_finished_req(self.cache, req)

    @rule(frac=st.floats(0, 1))
    def evict(self, frac):
        evict_and_check(self.cache, int(self.cache.evictable_size() * frac))

    def flaky_free(self, fail):
        """D8: the pool's free raises once (before changing anything) when `fail`."""
        machine = self

        class Ctx:
            def __enter__(self):
                if fail:
                    def boom(slots):
                        del machine.cache.pool.free
                        raise FlakyFree()
                    machine.cache.pool.free = boom

            def __exit__(self, et, ev, tb):
                if "free" in vars(machine.cache.pool):
                    del machine.cache.pool.free
                return et is FlakyFree
        return Ctx()

    @invariant()
    def invariants(self):
        c = self.cache
        c.check_integrity()
        live = self.live()
        check_lock_refs(c, [node_path(r.last_node) for r in live])
        check_partition(c, [owned_slots(r) for r in self.reqs])
        for r in live:
            ns, path = node_path(r.last_node)
            assert ns == r.extra_key and path == tuple(r.tokens[:r.prefix_len].tolist())
            assert np.array_equal(path_slots(r.last_node), r.indices[:r.prefix_len].numpy())
            assert len(r.indices) == -(-len(r.tokens) // self.ps) * self.ps

    def teardown(self):
        if not hasattr(self, "cache"):
            return
        for r in self.reqs:
            if r.finished:
                release_pending(self.cache, r)
            else:
                cache_finished_req(self.cache, r)
        assert self.cache.protected_size() == 0                                # quiescence
        self.cache.evict(self.cache.evictable_size())
        assert self.cache.pool.available_size() == self.cache.pool.size


TestLifecycleMachine = LifecycleMachine.TestCase
