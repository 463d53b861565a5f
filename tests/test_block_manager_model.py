"""BlockManager / BlockAllocator: model-based state machine (every invariant after every step) with
fault injection as one of its rules. CPU only. Unit, copy-on-write, fault-injection and regression
tests are in test_block_manager.py.

The state machine keeps a plain-dict model that predicts every block id, and a fake KV memory
(``mem[block] = tokens``) written exactly like a serving loop writes KV: copies first, then the new
tokens. A write to a shared block (I5) or a sequence reading other tokens than its own (I6) fails.
"""
import random

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedattn.cache_mgmt.block_manager import AllocStatus, BlockManager, NULL_BLOCK
from pagedattn.cache_mgmt.errors import DoubleFree, ForeignId, OutOfBlocks
from block_manager_utils import flat_prefix


def cdiv(a, b):
    return -(-a // b)


# region: plain-dict model ------------------------------------------------------------------------
class Model:
    """What the manager must do, written the obvious way (full-prefix dict instead of hashes)."""

    def __init__(self, num_blocks, B, caching):
        self.B, self.caching = B, caching
        self.free = list(range(1, num_blocks))     # block 0 reserved
        self.ref = [0] * num_blocks
        self.cached, self.prefix_of = {}, {}       # prefix tuple <-> block
        self.freed_at, self.clock = {}, 0          # evictable block -> tick
        self.table, self.tokens = {}, {}

    def avail(self):
        return len(self.free) + len(self.freed_at)

    def grab(self):
        if self.free:
            b = self.free.pop(0)
        else:                                      # I9: least recently freed, ties by id
            b = min(self.freed_at, key=lambda x: (self.freed_at[x], x))
            del self.freed_at[b], self.cached[self.prefix_of.pop(b)]
        self.ref[b] = 1
        return b

    def drop(self, b):
        self.ref[b] -= 1
        if self.ref[b] == 0 and b in self.prefix_of:
            self.clock += 1
            self.freed_at[b] = self.clock
        elif self.ref[b] == 0:
            self.free.append(b)

    def publish(self, b, prefix):
        if self.caching and prefix not in self.cached:
            self.cached[prefix], self.prefix_of[b] = b, prefix

    def allocate(self, seq, toks):
        """-> (blocks, num_cached_tokens), or None for OutOfBlocks."""
        B, hits = self.B, []
        while self.caching and len(hits) < max(len(toks) - 1, 0) // B:
            b = self.cached.get(tuple(toks[:(len(hits) + 1) * B]))
            if b is None:
                break
            hits.append(b)
        need = cdiv(len(toks), B) - len(hits)
        if need > self.avail() - sum(b in self.freed_at for b in hits):
            return None
        for b in hits:
            self.freed_at.pop(b, None)
            self.ref[b] += 1
        blocks = hits + [self.grab() for _ in range(need)]
        for i in range(len(hits), len(toks) // B):
            self.publish(blocks[i], tuple(toks[:(i + 1) * B]))
        self.table[seq], self.tokens[seq] = blocks, list(toks)
        return blocks, len(hits) * B

    def append_need(self, seq):
        n, tbl = len(self.tokens[seq]), self.table[seq]
        return int(n % self.B == 0 or self.ref[tbl[-1]] > 1)

    def append(self, seq, tok):
        """-> copies, or None for OutOfBlocks."""
        n, tbl, copies = len(self.tokens[seq]), self.table[seq], []
        if self.append_need(seq) > self.avail():
            return None
        if n % self.B == 0:
            tbl.append(self.grab())
        elif self.ref[tbl[-1]] > 1:
            new = self.grab()
            self.drop(tbl[-1])
            copies, tbl[-1] = [(tbl[-1], new)], new
        self.tokens[seq].append(tok)
        if (n + 1) % self.B == 0:
            self.publish(tbl[-1], tuple(self.tokens[seq]))
        return copies

    def free_seq(self, seq):
        for b in reversed(self.table.pop(seq)):
            self.drop(b)
        del self.tokens[seq]


# region: state machine ---------------------------------------------------------------------------
class BlockManagerMachine(RuleBasedStateMachine):
    # num_blocks 1 (no usable block) and 2 are edges; 7 and 64 are where sharing happens.
    @initialize(num_blocks=st.sampled_from([1, 2, 7, 7, 64, 64]), B=st.sampled_from([1, 2, 4, 16]),
                vocab=st.sampled_from([2, 4]), caching=st.booleans(),
                watermark=st.sampled_from([0.0, 0.01, 0.2]))
    def setup(self, num_blocks, B, vocab, caching, watermark):
        self.bm = BlockManager(num_blocks, B, watermark, enable_prefix_caching=caching)
        self.m, self.B, self.vocab, self.mem = Model(num_blocks, B, caching), B, vocab, {}
        self.next_id, self.dead, self.prompts = 0, [], []

    def toks(self, data, max_len):
        """A prompt: often a cut of an earlier one plus random tokens (tiny vocab: heavy sharing).
        Drawn as (prefix pick, cut, seed, length) to keep hypothesis' choice buffer short."""
        base = data.draw(st.sampled_from(self.prompts)) if self.prompts else []
        base = base[:data.draw(st.integers(0, len(base)))]
        rng = random.Random(data.draw(st.integers(0, 2**16)))
        cap = data.draw(st.sampled_from([2, max_len // 8, max_len // 4, max_len]))
        n = data.draw(st.integers(0, cap))
        toks = (base + [rng.randrange(self.vocab) for _ in range(n)])[:max_len]
        self.prompts = (self.prompts + [toks])[-16:]
        return toks

    def write(self, seq, start):
        """Write tokens ``start..`` of ``seq`` into the fake KV memory (I5: never shared)."""
        tbl, B = self.bm.block_ids(seq), self.B
        for pos in range(start, len(self.m.tokens[seq])):
            b = tbl[pos // B]
            assert self.bm.allocator.ref_count(b) == 1, f"I5: write to shared block {b}"
            self.mem.setdefault(b, [None] * B)[pos % B] = self.m.tokens[seq][pos]

    def expect_unchanged(self, exc, fn, *args, **kw):
        before = self.bm.snapshot()
        with pytest.raises(exc):
            fn(*args, **kw)
        assert self.bm.snapshot() == before, "I10: failed op changed the state"

    def new_id(self):
        self.next_id += 1
        return self.next_id

    def do_allocate(self, toks):
        seq, usable = self.new_id(), self.bm.allocator.num_usable
        need, wm = cdiv(len(toks), self.B), self.bm.watermark_blocks
        status = (AllocStatus.NEVER if usable - need < wm else AllocStatus.OK
                  if self.m.avail() - need >= wm else AllocStatus.LATER)
        assert self.bm.can_allocate(len(toks)) == status
        want = self.m.allocate(seq, toks)
        if want is None:
            return self.expect_unchanged(OutOfBlocks, self.bm.allocate, seq, token_ids=toks)
        got = self.bm.allocate(seq, token_ids=toks)
        assert (list(got.block_ids), got.num_cached_tokens) == want
        hit = got.num_cached_tokens
        assert hit % self.B == 0 and hit <= max(len(toks) - 1, 0)      # I7
        self.write(seq, got.num_cached_tokens)

    @rule(data=st.data())
    def new_seq(self, data):
        self.do_allocate(self.toks(data, 8 * self.B))

    @precondition(lambda self: self.m.table)
    @rule(data=st.data(), count=st.integers(1, 3))
    def append(self, data, count):
        seq = data.draw(st.sampled_from(sorted(self.m.table)))
        for tok in random.Random(count).choices(range(self.vocab), k=count):
            self.append_one(seq, tok)

    def append_one(self, seq, tok):
        want = self.m.append(seq, tok)
        if want is None:
            return self.expect_unchanged(OutOfBlocks, self.bm.append_slot, seq, tok)
        copies = self.bm.append_slot(seq, tok)
        assert copies == want
        for src, dst in copies:
            self.mem[dst] = list(self.mem[src])
        self.write(seq, len(self.m.tokens[seq]) - 1)

    @precondition(lambda self: self.m.table)
    @rule(data=st.data())
    def fork(self, data):
        parent, child = data.draw(st.sampled_from(sorted(self.m.table))), self.new_id()
        free_before = self.bm.num_free_blocks
        self.bm.fork(parent, child)
        assert self.bm.num_free_blocks == free_before        # zero new blocks
        for b in self.m.table[parent]:
            self.m.ref[b] += 1
        self.m.table[child] = list(self.m.table[parent])
        self.m.tokens[child] = list(self.m.tokens[parent])
        if data.draw(st.booleans()):                # write right away: the copy-on-write path
            self.append_one(data.draw(st.sampled_from([parent, child])), 0)

    @precondition(lambda self: self.m.table)
    @rule(data=st.data(), resume=st.booleans())
    def free_or_preempt(self, data, resume):
        seq = data.draw(st.sampled_from(sorted(self.m.table)))
        toks = self.m.tokens[seq]
        self.bm.free(seq)
        self.m.free_seq(seq)
        self.dead.append(seq)
        if resume:                                  # recompute preemption: may hit the cache
            self.do_allocate(toks)

    @precondition(lambda self: self.dead)
    @rule()
    def double_free(self):
        self.expect_unchanged(ForeignId, self.bm.free, self.dead[-1])
        self.expect_unchanged(ForeignId, self.bm.append_slot, self.dead[-1], 0)

    @rule(block=st.integers(0, 63))
    def free_block_directly(self, block):
        if block >= self.bm.allocator.num_blocks or block == NULL_BLOCK:
            return self.expect_unchanged(ForeignId, self.bm.allocator.free, block)
        if self.m.ref[block] == 0:
            self.expect_unchanged(DoubleFree, self.bm.allocator.free, block)

    @rule(data=st.data(), k=st.integers(0, 7))
    def oom_after_k_grabs(self, data, k):
        """Fault injection: the allocator fails after k successful grabs mid-allocate / mid-CoW."""
        A, grabs, real = self.bm.allocator, [0], self.bm.allocator.allocate

        def flaky():
            if grabs[0] >= k:
                raise OutOfBlocks("injected")
            grabs[0] += 1
            return real()
        A.allocate = flaky
        try:
            if self.m.table and data.draw(st.booleans()):
                seq = data.draw(st.sampled_from(sorted(self.m.table)))
                if self.m.append_need(seq) > k:
                    self.expect_unchanged(OutOfBlocks, self.bm.append_slot, seq, 0)
            else:
                toks = self.toks(data, 8 * self.B)
                if cdiv(len(toks), self.B) > k:      # hits take no grab: may still succeed
                    before = self.bm.snapshot()
                    try:
                        got = self.bm.allocate(-1, token_ids=toks)
                    except OutOfBlocks:
                        assert self.bm.snapshot() == before, "I10: rollback after injected OOM"
                    else:
                        del A.allocate
                        want = (list(got.block_ids), got.num_cached_tokens)
                        assert self.m.allocate(-1, toks) == want
                        self.write(-1, got.num_cached_tokens)
                        self.bm.free(-1)
                        self.m.free_seq(-1)
        finally:
            A.__dict__.pop("allocate", None)

    @invariant()
    def matches_model(self):
        self.bm.check_integrity()
        A, m = self.bm.allocator, self.m
        assert {s: list(self.bm.block_ids(s)) for s in self.bm.seq_ids()} == m.table
        assert list(A._ref) == m.ref and list(A._free) == m.free and A._evictable == m.freed_at
        assert {b: flat_prefix(meta.key) for b, meta in A._meta.items()} == m.prefix_of
        for s, toks in m.tokens.items():                       # I6 through the fake memory
            assert self.bm.seq_len(s) == len(toks)
            tbl = self.bm.block_ids(s)
            assert [self.mem[tbl[p // self.B]][p % self.B] for p in range(len(toks))] == toks

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        for s in self.bm.seq_ids():
            self.bm.free(s)
        self.bm.check_integrity()                               # quiescence after the fault
        assert all(r == 0 for r in self.bm.allocator._ref)
        assert self.bm.num_free_blocks == self.bm.allocator.num_usable


TestBlockManagerMachine = BlockManagerMachine.TestCase
