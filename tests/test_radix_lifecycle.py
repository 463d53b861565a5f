"""Model-based test of the request lifecycle over RadixCache, with fault injection: "nothing lost"
after every step.

admit / extend / cache_unfinished_req / cache_finished_req with injected free failures, against
the "nothing lost" partition: free + tree + owned-by-requests == capacity, every slot once,
after every step; lock counts equal the live requests' paths. The eviction order itself is
checked against a model in test_radix_cache.py.
"""
import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedattn.cache_mgmt.errors import CacheError, OutOfBlocks
from pagedattn.cache_mgmt.radix_cache import RadixCache
from pagedattn.cache_mgmt.radix_lifecycle import (Req, admit_req, cache_finished_req,
                                                  cache_unfinished_req, extend_req, owned_slots,
                                                  release_pending)
from radix_paths import radix_path
from test_radix_cache import (NAMESPACES, PAGE_SIZES, FlakyFree, check_lock_refs,
                              check_partition, evict_and_check, node_path, path_slots)


class LifecycleMachine(RuleBasedStateMachine):
    @initialize(ps=st.sampled_from(PAGE_SIZES), pages=st.sampled_from([2, 7, 64]),
                vocab=st.sampled_from([2, 4]), c_helpers=st.booleans())
    def setup(self, ps, pages, vocab, c_helpers):
        with radix_path(c_helpers):
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
        check_lock_refs(c, [node_path(c, r.last_node) for r in live])
        check_partition(c, [owned_slots(r) for r in self.reqs])
        for r in live:
            ns, path = node_path(c, r.last_node)
            assert ns == r.extra_key and path == tuple(r.tokens[:r.prefix_len].tolist())
            assert np.array_equal(path_slots(c, r.last_node), r.indices[:r.prefix_len].numpy())
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
