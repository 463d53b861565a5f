"""BlockManager / BlockAllocator: copy-on-write through ``pagedattn.copy_blocks``, fault injection,
regressions, prefix caching, kernel inputs and admission. CPU only.

The model-based state machine with its plain-dict model is in test_block_manager_model.py.
"""
import random

import pytest
import torch

import pagedattn as pa
from pagedattn.layouts import gather_kv
from pagedattn.cache_mgmt import block_allocator as ba
from pagedattn.cache_mgmt.block_manager import (AllocStatus, BlockAllocator, BlockManager,
                                                DuplicateSeq, NULL_BLOCK)
from pagedattn.cache_mgmt.errors import DoubleFree, ForeignId, OutOfBlocks
from block_manager_utils import flat_prefix


# region: copy-on-write ---------------------------------------------------------------------------
def test_fork_append_shared_partial_tail_one_copy():
    bm = BlockManager(8, 4)
    parent = bm.allocate("p", 6).block_ids                  # [b1 full | b2 with 2 of 4]
    free = bm.num_free_blocks
    bm.fork("p", "c")
    assert bm.num_free_blocks == free and bm.allocator.ref_count(parent[1]) == 2
    copies = bm.append_slot("c")
    assert len(copies) == 1 and copies[0][0] == parent[1]
    assert bm.block_ids("c") == (parent[0], copies[0][1]) and bm.block_ids("p") == parent
    assert (bm.seq_len("p"), bm.seq_len("c")) == (6, 7)
    assert bm.allocator.ref_count(parent[1]) == 1 and bm.append_slot("p") == []  # now exclusive
    bm.check_integrity()


def test_fork_append_full_shared_tail_no_copy():
    bm = BlockManager(8, 4)
    parent = bm.allocate("p", 8).block_ids
    bm.fork("p", "c")
    assert bm.append_slot("c") == [] and bm.append_slot("p") == []
    assert bm.block_ids("c")[:2] == parent == bm.block_ids("p")[:2]
    assert bm.block_ids("c")[2] != bm.block_ids("p")[2]
    bm.check_integrity()


@pytest.mark.parametrize("layout", ["bhsd", "bshd", "vllm", "hcu"])
def test_copy_on_write_end_to_end_copy_blocks(layout):
    """Parent KV written with store_kv; the child's CoW copy through pa.copy_blocks; the child sees
    the parent's KV for the shared tokens, and its own new token never touches the parent."""
    B, H, D, n = 4, 2, 16, 6
    bm = BlockManager(8, B)
    kc, vc = pa.make_kv_cache(8, B, H, D, layout=layout, dtype=torch.float32)
    kc.fill_(float("nan")), vc.fill_(float("nan"))
    g = torch.Generator().manual_seed(0)
    bm.allocate("p", n)
    k, v = torch.randn(n, H, D, generator=g), torch.randn(n, H, D, generator=g)
    pa.store_kv(k, v, kc, vc, torch.tensor([bm.slot_of("p", i) for i in range(n)]), layout=layout)
    bm.fork("p", "c")
    copies = bm.append_slot("c")
    assert len(copies) == 1
    pa.copy_blocks(kc, vc, copies, backend="torch")
    k1, v1 = torch.randn(1, H, D, generator=g), torch.randn(1, H, D, generator=g)
    pa.store_kv(k1, v1, kc, vc, torch.tensor([bm.slot_of("c")]), layout=layout)
    bt, lens = bm.get_block_table(["p", "c"])
    pk, pv = gather_kv(kc, vc, bt[0], int(lens[0]), layout)
    ck, cv = gather_kv(kc, vc, bt[1], int(lens[1]), layout)
    assert torch.equal(pk, k) and torch.equal(pv, v)               # parent untouched
    assert torch.equal(ck[:n], k) and torch.equal(cv[:n], v)       # child == parent's KV
    assert torch.equal(ck[n], k1[0]) and torch.equal(cv[n], v1[0])
    bm.check_integrity()


# region: fault injection -------------------------------------------------------------------------
def _flaky(bm, k):
    """Make ``bm``'s allocator raise OutOfBlocks after ``k`` successful grabs."""
    real, grabs = bm.allocator.allocate, [0]

    def allocate():
        if grabs[0] >= k:
            raise OutOfBlocks("injected")
        grabs[0] += 1
        return real()
    bm.allocator.allocate = allocate


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_oom_mid_allocate_rolls_back(k, caching):
    """4 fresh blocks needed; the k-th grab fails (with caching, grabs evict cached blocks)."""
    bm = BlockManager(6, 4, 0.0, enable_prefix_caching=caching)
    bm.allocate("a", token_ids=range(8))
    bm.allocate("b", token_ids=range(100, 112))
    bm.free("b")                                    # caching: 3 evictable blocks
    before = bm.snapshot()
    _flaky(bm, k)
    with pytest.raises(OutOfBlocks):
        bm.allocate("x", token_ids=range(200, 215))
    assert bm.snapshot() == before
    bm.check_integrity()
    del bm.allocator.allocate
    assert bm.allocate("y", token_ids=range(300, 303)).num_cached_tokens == 0  # smaller one fits
    bm.check_integrity()


def test_oom_mid_cow_rolls_back_eviction():
    """CoW must evict a cached block; the free of the old tail fails after the grab: the evicted
    block's hash, LRU tick and the shared tail are all restored."""
    bm = BlockManager(4, 2, 0.0, enable_prefix_caching=True)
    bm.allocate("c", token_ids=[7, 7])              # block 1, hashed
    bm.free("c")                                    # evictable
    bm.allocate("p", token_ids=[1, 2, 3])           # blocks 2, 3 (3 partial)
    bm.fork("p", "q")
    before = bm.snapshot()

    def failing_free(block):
        raise OutOfBlocks("injected")
    bm.allocator.free = failing_free
    with pytest.raises(OutOfBlocks):
        bm.append_slot("q", 4)
    assert bm.snapshot() == before
    del bm.allocator.free
    _flaky(bm, 0)
    with pytest.raises(OutOfBlocks):
        bm.append_slot("q", 4)
    assert bm.snapshot() == before
    del bm.allocator.allocate
    assert bm.append_slot("q", 4) == [(3, 1)]       # evicts block 1 for real
    bm.check_integrity()


def test_regression_ucm_1053_double_free_raises_and_keeps_free_list_unique():
    """ModelEngine UCM PR #1053 (and vllm-ascend #14301): a double free reached the free queue and
    corrupted it. Here it raises DoubleFree, and the free list stays duplicate-free."""
    a = BlockAllocator(4, 16)
    b = a.allocate()
    a.free(b)
    before = a.snapshot()
    with pytest.raises(DoubleFree, match="block"):
        a.free(b)
    assert a.snapshot() == before and len(set(a._free)) == len(a._free) == 3
    bm = BlockManager(4, 2)
    bm.allocate("s", 3)
    bm.free("s")
    with pytest.raises(ForeignId, match="seq_id"):
        bm.free("s")
    bm.check_integrity()


def test_regression_kvcached_398_null_block_never_handed_out():
    """kvcached PR #398: block 0 (the null block) was given to a real request. Reserved ids are
    never allocated (also not through eviction), never freed, and pad block tables."""
    bm = BlockManager(5, 1, 0.0, enable_prefix_caching=True)
    got = set(bm.allocate("a", token_ids=[1, 2, 3, 4]).block_ids)
    bm.free("a")
    b = bm.allocate("b", token_ids=[5, 6, 7, 8]).block_ids      # all through eviction,
    assert b == (4, 3, 2, 1) and NULL_BLOCK not in got | set(b)  # tail first (freed first, I9)
    with pytest.raises(OutOfBlocks):
        bm.append_slot("b", 9)
    with pytest.raises(ForeignId, match="reserved"):
        bm.allocator.free(NULL_BLOCK)
    with pytest.raises(ForeignId, match="reserved"):
        bm.allocator.incref(NULL_BLOCK)
    bm.allocate("e", token_ids=[])
    bt, lens = bm.get_block_table(["b", "e"])
    assert bt.tolist() == [[4, 3, 2, 1], [0, 0, 0, 0]] and lens.tolist() == [4, 0]
    custom = BlockAllocator(3, 4, reserved=(2,))
    assert sorted(custom.allocate() for _ in range(2)) == [0, 1]


@pytest.mark.parametrize("order", [("p", "c"), ("c", "p"), ("c", "c")])
def test_fork_free_orders(order):
    bm = BlockManager(6, 2)
    blocks = bm.allocate("p", 5).block_ids
    bm.fork("p", "c")
    bm.free(order[0])
    assert [bm.allocator.ref_count(b) for b in blocks] == [1, 1, 1]
    if order[0] == order[1]:
        with pytest.raises(ForeignId):
            bm.free(order[1])
        bm.free("p")
    else:
        bm.free(order[1])
    assert bm.num_free_blocks == 5 and list(bm.allocator._free) == [4, 5] + list(reversed(blocks))
    bm.check_integrity()


# region: prefix caching --------------------------------------------------------------------------
def test_prefix_hit_rules_and_lru_order():
    """I7: hits are whole blocks and at most n - 1 tokens; I9: cached blocks are reused least
    recently freed first; nano-vllm 9fa256a: a hit keeps its block mapped from its hash."""
    bm = BlockManager(8, 2, 0.0, enable_prefix_caching=True)
    a = bm.allocate("a", token_ids=[1, 2, 3, 4]).block_ids            # blocks 1, 2
    assert bm.allocate("b", token_ids=[1, 2, 3, 4]).num_cached_tokens == 2   # not 4: n - 1
    assert bm.allocate("c", token_ids=[1, 2, 3, 4, 5]).block_ids[:2] == a    # 4 of 5
    assert bm.allocator.lookup(bm.allocator.meta(a[0]).hash, bm.allocator.meta(a[0]).key) == a[0]
    for s in ("a", "b", "c"):
        bm.free(s)
    assert bm.allocate("d", token_ids=[1, 2, 9]).num_cached_tokens == 2     # hit after free
    lru = sorted(bm.allocator._evictable, key=bm.allocator._evictable.get)
    got = bm.allocate("e", token_ids=list(range(20, 30))).block_ids
    taken = [b for b in got if b in lru]
    assert taken and taken == lru[:len(taken)]
    bm.check_integrity()


def test_regression_constant_hash_collision_never_reuses_wrong_kv(monkeypatch):
    """vLLM PR #15297 / openvino.genai #3722: content hash only -> wrong KV on a collision.
    With every hash equal, a hit still requires the whole token prefix to match."""
    monkeypatch.setattr(ba, "hash_block", lambda parent, toks: 0)
    bm = BlockManager(16, 2, 0.0, enable_prefix_caching=True)
    bm.allocate("a", token_ids=[1, 2, 3, 4, 5])
    assert bm.allocate("b", token_ids=[9, 9, 3, 4, 5]).num_cached_tokens == 0   # same block 2
    assert bm.allocate("c", token_ids=[1, 2, 7, 7, 7]).num_cached_tokens == 2   # block 1 only
    rng = random.Random(0)
    for i in range(200):                        # random churn: hits must always be verified
        toks = [rng.randrange(2) for _ in range(rng.randrange(1, 9))]
        r = bm.allocate(i, token_ids=toks)
        for j in range(r.num_cached_tokens // 2):
            assert flat_prefix(bm.allocator.meta(r.block_ids[j]).key) == tuple(toks[:2 * j + 2])
        bm.check_integrity()
        bm.free(rng.choice(bm.seq_ids()))


# region: kernel inputs, admission, bad inputs ----------------------------------------------------
def test_get_block_table_tensors():
    bm = BlockManager(10, 4)
    bm.allocate(0, 9), bm.allocate(1, 1), bm.allocate(2, 0)
    bt, lens = bm.get_block_table([1, 0, 2], device=torch.device("cpu"))
    assert bt.dtype == lens.dtype == torch.int32 and bt.is_contiguous()
    assert bt.tolist() == [[4, 0, 0], [1, 2, 3], [0, 0, 0]] and lens.tolist() == [1, 9, 0]
    assert bm.get_block_table([0], width=5).block_table.tolist() == [[1, 2, 3, 0, 0]]
    assert bm.get_block_table([]).block_table.shape == (0, 1)
    with pytest.raises(ValueError, match="width"):
        bm.get_block_table([0], width=2)


def test_can_allocate_watermark():
    bm = BlockManager(101, 16, 0.1)                  # 100 usable, watermark 10 blocks
    assert bm.can_allocate(90 * 16) is AllocStatus.OK
    assert bm.can_allocate(90 * 16 + 1) is AllocStatus.NEVER
    bm.allocate("a", 50 * 16)
    assert bm.can_allocate(40 * 16) is AllocStatus.OK
    assert bm.can_allocate(41 * 16) is AllocStatus.LATER
    one = BlockManager(1, 4)                         # only the null block: nothing ever fits
    assert one.can_allocate(1) is AllocStatus.NEVER and one.allocate("e", 0).block_ids == ()
    with pytest.raises(OutOfBlocks):
        one.append_slot("e")


@pytest.mark.parametrize("call, exc, match", [
    (lambda: BlockManager(0, 16), ValueError, "num_blocks"),
    (lambda: BlockManager(4, 0), ValueError, "block_size"),
    (lambda: BlockManager(4, 16, 1.5), ValueError, "watermark"),
    (lambda: BlockManager(4, 16, reserved=(4,)), ValueError, "reserved"),
    (lambda: BlockManager(4, 16).allocate("a", -1), ValueError, "num_tokens"),
    (lambda: BlockManager(4, 16).allocate("a", 2.0), TypeError, "num_tokens"),
    (lambda: BlockManager(4, 16).allocate("a", 3, token_ids=[1]), ValueError, "num_tokens"),
    (lambda: BlockManager(4, 16, enable_prefix_caching=True).allocate("a", 3), ValueError,
     "token_ids"),
    (lambda: BlockManager(4, 16).append_slot("nope"), ForeignId, "seq_id"),
    (lambda: BlockManager(4, 16).fork("nope", "b"), ForeignId, "parent_id"),
    (lambda: BlockManager(4, 16).get_block_table(["nope"]), ForeignId, "seq_ids"),
    (lambda: BlockManager(4, 16).can_allocate(-3), ValueError, "num_tokens"),
    (lambda: BlockAllocator(4, 16).free(9), ForeignId, "block"),
    (lambda: BlockAllocator(4, 16).incref(2), ForeignId, "block"),
])
def test_bad_inputs_raise_typed_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_duplicate_seq_ids_leave_state_unchanged():
    bm = BlockManager(8, 4)
    bm.allocate("a", 5), bm.allocate("b", 1)
    before = bm.snapshot()
    for call, match in ((lambda: bm.allocate("a", 1), "seq_id"),
                        (lambda: bm.fork("a", "b"), "child_id")):
        with pytest.raises(DuplicateSeq, match=match):
            call()
        assert bm.snapshot() == before


# region: memory accounting (pagedattn/bench/block_manager.py) ------------------------------------
def test_memory_accounting_matches_the_manager():
    """The bench's closed-form paged reservation equals the blocks the real manager holds."""
    from pagedattn.bench import block_manager as mod
    p, o = mod.sample_lengths(161, 338, 40, 2048, seed=1)
    for B in (16, 128):
        bm, held = BlockManager(4096, B, 0.0), 0
        for i, (pi, oi) in enumerate(zip(p.tolist(), o.tolist())):
            bm.allocate(i, pi)
            for _ in range(oi):
                bm.append_slot(i)
                held += len(bm.block_ids(i)) * B
        assert held == mod.paged_reserved(mod.token_steps(p, o), B).sum()
    df = mod.memory_table(n=2000, max_seq_len=2048, seed=0)
    paged16 = df[(df.workload == "sharegpt") & (df.scheme == "paged B=16")].iloc[0]
    assert paged16["waste %"] < 4 and abs(paged16["waste tok/seq (end)"] - 7.5) < 1
