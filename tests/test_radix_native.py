"""The radix cache's C helpers (cache_mgmt/_radix_native.c) against the Python code they stand
in for: key encoding, the tree walk, insert's slot check, the pools' alloc and free; the build,
its fallback, and the source under every Python whose headers this machine has. The whole cache
on both paths: test_radix_cache.py, test_radix_lifecycle.py (a drawn flag) and the
`radix_path` fixture."""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import pytest
import torch

from pagedattn.cache_mgmt import native
from pagedattn.cache_mgmt.errors import CacheError, ForeignId
from pagedattn.cache_mgmt.radix_cache import RadixCache
from pagedattn.cache_mgmt.radix_insert import _check_new_slots
from pagedattn.cache_mgmt.radix_integrity import iter_nodes
from pagedattn.cache_mgmt.radix_node import encode_tokens_py
from pagedattn.cache_mgmt.token_pool import CACHED, FREE, HELD, PagedTokenPool, TokenPool
from radix_paths import radix_path


@pytest.fixture(scope="module")
def nat():
    mod = native.load()
    assert mod is not None, native.reason()
    return mod


# Digit and sign boundaries of CPython ints (30-bit digits) and of int64.
EDGES = [0, 1, -1, 2**30 - 1, 2**30, -2**30, -(2**30 - 1), 2**31, 2**60, 2**63 - 1, -2**63]


def test_encode_matches_struct(nat):
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 1500):
        toks = rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64).tolist()
        assert nat.encode(toks) == encode_tokens_py(toks)
        assert nat.encode(tuple(toks)) == encode_tokens_py(toks)
    mixed = EDGES + [True, False, np.int64(5), np.int32(-7), np.uint16(9)]
    assert nat.encode(mixed) == encode_tokens_py(mixed)
    assert np.frombuffer(nat.encode(EDGES), np.int64).tolist() == EDGES


@pytest.mark.parametrize("bad,err", [([1, 2**63], ValueError), ([-2**63 - 1], ValueError),
                                     ([1, 2.0], TypeError), (["1"], TypeError),
                                     ([np.float32(1)], TypeError), ([None], TypeError)])
def test_encode_refuses_what_struct_refuses(nat, bad, err):
    with pytest.raises(err, match="tokens"):
        nat.encode(bad)
    with pytest.raises(err, match="tokens"):
        encode_tokens_py(bad)


def test_encode_survives_index_that_edits_the_list(nat):
    class Evil:
        def __init__(self, lst):
            self.lst = lst

        def __index__(self):
            self.lst.clear()
            return 3
    toks = [1, 2]
    toks.append(Evil(toks))
    toks += [4, 5]
    with pytest.raises(RuntimeError, match="changed size"):
        nat.encode(toks)

    class Boom:
        def __index__(self):
            raise KeyError("not a TypeError")
    with pytest.raises(KeyError):               # other errors pass through unchanged
        nat.encode([Boom()])


def random_cache(seed: int, ps: int, vocab: int):
    """A cache over prompts drawn from `vocab` tokens: 3 gives deep sharing and many splits,
    50 nodes with more children than `find` compares in place (SCAN_CHILDREN)."""
    cache = RadixCache.create_simulated(4096 * ps, page_size=ps)
    rng = np.random.default_rng(seed)
    for _ in range(60):
        toks = rng.integers(0, vocab, rng.integers(1, 40) * ps).tolist()
        m = cache.match_prefix(toks)
        slots = cache.pool.alloc(len(toks))
        got = cache.insert(toks, slots, start=m)
        cache.pool.free(slots[len(m.indices):got])
    return cache


@pytest.mark.parametrize("ps", [1, 2, 4, 16])
@pytest.mark.parametrize("vocab", [3, 50])
def test_find_matches_the_python_walk(nat, ps, vocab):
    """Same tree, every query: C `find` and RadixCache._find agree field by field, from the
    root and from inner nodes, with page-aligned bounds below the key's length too."""
    cache = random_cache(1, ps, vocab)
    widest = max(len(cache.child_nodes(x)) for x in [cache.root(), *iter_nodes(cache)])
    assert (widest > 8) == (vocab > 3 or ps > 1), widest     # both ways of looking up a child
    rng = np.random.default_rng(2)
    starts = [(cache.root(), 0)]
    for _ in range(30):
        toks = rng.integers(0, vocab, rng.integers(0, 50) * ps + rng.integers(0, ps)).tolist()
        key = encode_tokens_py(toks)
        n = len(key) - len(key) % (8 * ps)
        for n_ in (n, n - n % (8 * ps) - 8 * ps * (n > 0)):
            for node, pos in starts:
                if pos > n_:
                    continue
                py = RadixCache._find(cache, node, key, pos, n_)
                c = cache._find(node, key, pos, n_)
                assert c == py, (toks, node, pos, n_)
        m = cache.match_prefix(toks)
        starts.append((m.last_node, len(m.indices) * 8))
    cache.check_integrity()


@pytest.mark.usefixtures("radix_path")
def test_find_refuses_unaligned_bounds():
    """C `find` and RadixCache._find refuse the same bounds (the callers round to pages)."""
    cache = RadixCache.create_simulated(64, page_size=4)
    key = encode_tokens_py(list(range(8)))
    for pos, n in [(8, 64), (0, 40), (-32, 64), (0, 72)]:
        with pytest.raises(ValueError, match="bounds"):
            cache._find(cache.root(), key, pos, n)


CLAIMS = {   # ps 4 over a pool of 32 slots; slots 0-7 HELD, 8-11 CACHED, 12-15 FREE, 16-31 HELD
    "ok": ([0, 1, 2, 3, 16, 17, 18, 19], 0),
    "not whole": ([0, 1, 3, 2], 1), "unaligned": ([1, 2, 3, 4], 1),
    "negative": ([-4, -3, -2, -1], 2), "huge": ([2**62, 2**62 + 1, 2**62 + 2, 2**62 + 3], 2),
    "out of range": ([32, 33, 34, 35], 2), "twice": ([4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7], 3),
    "cached": ([0, 1, 2, 3, 8, 9, 10, 11], 4), "free": ([16, 17, 18, 19, 12, 13, 14, 15], 4),
}


def pool_state():
    st = bytearray([HELD]) * 32
    st[8:12] = bytes([CACHED, 0, 0, 0])
    st[12:16] = bytes([FREE]) * 4
    return st


def python_check_passes(state: np.ndarray, slots, ps: int) -> bool:
    """Does insert's Python slot check (radix_insert._check_new_slots) accept `slots` as new
    pages of a cache whose pool has the slot states `state`? (ValueError / ForeignId: no.)"""
    with native.disabled():
        pool = TokenPool(state.size) if ps == 1 else PagedTokenPool(state.size, ps)
        cache = RadixCache(pool, page_size=ps)
    pool._state[:] = state
    try:
        _check_new_slots(cache, np.array(slots, np.int64))
    except (ValueError, ForeignId):
        return False
    return True


@pytest.mark.parametrize("case", list(CLAIMS))
def test_claim_codes_and_marks(nat, case):
    """0 marks every page's first slot CACHED; any error leaves the state as it was, and the
    Python check raises for exactly those slot lists."""
    slots, code = CLAIMS[case]
    st = pool_state()
    vb = np.array(slots, np.int64).tobytes()
    assert nat.claim(st, vb, 4) == code
    want = pool_state()
    if code == 0:
        for h in slots[::4]:
            want[h] = CACHED
    assert st == want
    assert python_check_passes(np.frombuffer(pool_state(), np.uint8), slots, 4) == (code == 0)


def test_claim_random_against_python(nat):
    rng = np.random.default_rng(3)
    for ps in (1, 2, 4):
        for _ in range(300):
            state = rng.choice([HELD, HELD, HELD, FREE, CACHED], 16 * ps).astype(np.uint8)
            state[np.arange(16 * ps) % ps != 0] = HELD
            pages = rng.integers(-1, 17, rng.integers(1, 5))   # insert never claims none
            slots = (pages[:, None] * ps + np.arange(ps)).reshape(-1)
            if rng.random() < 0.2 and slots.size:
                slots[rng.integers(slots.size)] += 1
            st = bytearray(state.tobytes())
            code = nat.claim(st, slots.astype(np.int64).tobytes(), ps)
            ok = python_check_passes(state, slots, ps)
            assert ok == (code == 0), (ps, slots, state, code)
            want = state.copy()
            if ok:
                want[slots[::ps]] = CACHED
            assert bytes(st) == want.tobytes()


def pools_on_both_paths(ps: int, pages: int, paged: bool) -> list:
    """Two fresh pools of `pages` pages: with the C helpers, and on the pure-Python path
    (`paged`: PagedTokenPool, which keeps page states apart from slot states even at page 1)."""
    out = []
    for c_helpers in (True, False):
        with radix_path(c_helpers):
            out.append(PagedTokenPool(pages * ps, ps) if paged else TokenPool(pages))
    return out


# (page size, PagedTokenPool?): the token pool, and paged pools at pages of 1, 2 and 4
POOLS = [(1, False), (1, True), (2, True), (4, True)]


def pool_pair(ps: int, paged: bool, rng):
    """Two pools with the same history, one on each path: some pages handed out, some of those
    marked CACHED (what insert does to a page's first slot)."""
    pools = [(pool, pool.alloc(12 * ps).numpy()) for pool in pools_on_both_paths(ps, 16, paged)]
    cached = rng.choice(12, 3, replace=False) * ps
    for pool, held in pools:
        pool._state[held[cached]] = CACHED
    return pools


@pytest.mark.parametrize("ps, paged", POOLS)
def test_release_matches_the_python_free(nat, ps, paged):
    """pool.free with the C check and without: the same error type, or the same free stack and
    states, for whole pages in and out of order, partial pages, duplicates, free, cached and
    out-of-range slots."""
    rng = np.random.default_rng(4)
    for _ in range(200):
        (a, held), (b, _) = pool_pair(ps, paged, rng)
        pages = rng.choice(np.concatenate([held[::ps] // ps, [12, 13, 16, -1]]),
                           rng.integers(1, 5))
        slots = (pages[:, None] * ps + np.arange(ps)).reshape(-1)
        if rng.random() < 0.3:
            slots = slots[rng.permutation(slots.size)]
        if rng.random() < 0.2:
            slots = slots[:-1]
        errs = []
        for pool in (a, b):
            try:
                pool.free(torch.from_numpy(slots.copy()))
                errs.append(None)
            except (ValueError, CacheError) as e:
                errs.append(type(e))
        assert errs[0] == errs[1], (ps, slots, errs)
        assert a.available_size() == b.available_size()
        assert np.array_equal(a._state, b._state) and np.array_equal(a.free_slots(),
                                                                     b.free_slots())
        a.check_integrity()


@pytest.mark.parametrize("ps, paged", POOLS)
def test_release_cached_matches_the_python_one(nat, ps, paged):
    """Evict's free with the C helper and without: every page given CACHED -> the same free
    stack and states; a page that is not -> CacheError on both, nothing changed."""
    rng, outcomes = np.random.default_rng(6), set()
    for _ in range(200):
        (a, held), (b, _) = pool_pair(ps, paged, rng)
        heads = held[::ps]
        cached, plain = heads[a._state[heads] == CACHED] // ps, heads[a._state[heads] == 0] // ps
        pages = rng.permutation(cached)[:rng.integers(1, cached.size + 1)]
        if rng.random() < 0.3:                  # a held or a free page among them
            pages[rng.integers(pages.size)] = rng.choice([plain[0], 14])
        slots = (pages[:, None] * ps + np.arange(ps)).reshape(-1).astype(np.int64)
        pg = a._pages if paged else a              # the helper alone, on copies: no fallback
        code = nat.release_cached(bytearray(a._state_buf), slots, ps, pg._stack.copy(), pg._top,
                                  bytearray(pg._state_buf) if paged else None)
        errs = []
        for pool in (a, b):
            before = (pool._state.copy(), pool.free_slots())
            try:
                pool._release_cached(np.frombuffer(slots.tobytes(), np.int64))
                errs.append(None)
            except CacheError as e:
                errs.append(type(e))
                assert np.array_equal(pool._state, before[0])
                assert np.array_equal(pool.free_slots(), before[1])
        assert errs[0] == errs[1], (ps, slots, errs)
        assert np.array_equal(a._state, b._state) and np.array_equal(a.free_slots(),
                                                                     b.free_slots())
        assert a.available_size() == b.available_size()
        assert (code == 0) == (errs[0] is None), (ps, slots, code)
        outcomes.add(errs[0])
    assert outcomes == {None, CacheError}


@pytest.mark.parametrize("ps, paged", POOLS)
def test_hold_matches_the_python_alloc(nat, ps, paged):
    """pool.alloc with the C helper and without: the same slots (int64, in order), states and
    free counts over a random alloc/free history, empty allocs included."""
    a, b = pools_on_both_paths(ps, 64, paged)
    rng = np.random.default_rng(5)
    held = []
    for _ in range(300):
        n = int(rng.integers(0, 6)) * ps
        if (rng.random() < 0.5 or not held) and a.can_alloc(n):
            x, y = a.alloc(n), b.alloc(n)
            assert x.dtype == torch.int64 and torch.equal(x, y), (x, y)
            held.append((x, y))
        elif held:
            x, y = held.pop(int(rng.integers(len(held))))
            a.free(x)
            b.free(y)
        assert np.array_equal(a._state, b._state) and a.available_size() == b.available_size()
    a.check_integrity()


def test_hold_refuses_pages_outside_the_pool(nat):
    """Pages popped off a stack that lists one outside the pool, or more pages than the stack
    holds: ValueError and nothing changed; else the top pages' slots, last pushed first."""
    st, pst = bytearray([FREE]) * 16, bytearray([FREE]) * 4
    for stack, k in (([4], 1), ([-1], 1), ([0, 4], 2), ([0, 1], 3), ([0, 1], -1)):
        stack = np.array(stack + [0] * (4 - len(stack)), np.int64)
        with pytest.raises(ValueError, match="outside the pool|pages asked"):
            nat.hold(st, 4, stack, min(k, 2) if k > 0 else 2, k, pst)
    assert st == bytearray([FREE]) * 16 and pst == bytearray([FREE]) * 4
    stack = np.array([1, 0, 3, 2], np.int64)
    assert np.frombuffer(nat.hold(st, 4, stack, 3, 2, pst), np.int64).tolist() == \
        [12, 13, 14, 15, 0, 1, 2, 3]
    assert st == bytearray([HELD] * 4 + [FREE] * 8 + [HELD] * 4)
    assert pst == bytearray([HELD, FREE, FREE, HELD])


def test_pool_helpers_refuse_a_stack_that_does_not_fit(nat):
    """A free stack or page-state table of the wrong size, or a top outside it, is refused
    before anything is read or written: the helpers trust no length they are given."""
    st, slots = bytearray([HELD]) * 16, np.arange(4, dtype=np.int64).tobytes()
    good = np.zeros(4, np.int64)
    for stack, top, pst in ((np.zeros(3, np.int64), 0, bytearray(4)),   # 3 entries, 4 pages
                            (good, 5, bytearray(4)), (good, -1, bytearray(4)),
                            (good, 0, bytearray(3)), (good, 0, None)):  # paged: needs pstate
        with pytest.raises(ValueError, match="inconsistent"):
            nat.release(st, slots, 4, stack, top, pst)
        with pytest.raises(ValueError, match="inconsistent"):
            nat.hold(st, 4, stack, top, 0, pst)
    assert st == bytearray([HELD]) * 16 and not good.any()
    full = np.arange(4, dtype=np.int64)       # every page already on the stack
    assert nat.release(st, slots, 4, full, 4, bytearray(4)) != 0 and st == bytearray([HELD]) * 16


def test_build_and_fallback(tmp_path, monkeypatch):
    """A fresh cache directory gets a working build; without a compiler the cache falls back
    to the pure-Python path, says why, and warns once."""
    monkeypatch.setenv("PAGEDATTN_CACHE_DIR", str(tmp_path))
    mod, why = native._load()
    assert why == "" and mod.encode([3, -4]) == encode_tokens_py([3, -4])
    assert glob.glob(str(tmp_path / "native" / "_radix_native-*"))
    monkeypatch.setenv("PAGEDATTN_CACHE_DIR", str(tmp_path / "other"))
    monkeypatch.setattr(native, "_compiler", lambda: None)
    monkeypatch.setattr(native, "_state", {})
    with pytest.warns(RuntimeWarning, match="pure-Python path .no C compiler"):
        assert native.load() is None
    assert "no C compiler" in native.reason()
    cache = RadixCache.create_simulated(16)
    assert cache._claim is None and cache._encode is encode_tokens_py
    monkeypatch.setattr(native, "_compiler", lambda: ["cc"])
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("PAGEDATTN_CACHE_DIR", str(blocker))   # not a directory
    mod, why = native._load()
    assert mod is None and "not writable" in why


CHECK = r"""
import struct, sys
sys.path.insert(0, sys.argv[1])
import _radix_native as m
toks = [0, 1, -1, 2**30 - 1, 2**30, -2**30, 2**62, -2**63, 2**63 - 1, True]
assert m.encode(toks) == struct.pack(f"{len(toks)}q", *toks)
try:
    m.encode([2**63]); raise SystemExit("no error")
except ValueError:
    pass
key = struct.pack("6q", 1, 2, 3, 4, 5, 6)
kids, keys = {1: {struct.pack("q", 1): 2}}, {2: struct.pack("3q", 1, 2, 9)}
assert m.find(kids, keys, 8, 1, 1, key, 0, 48) == ([], 1, 0, 2, 16)
st = bytearray(4)
assert m.claim(st, struct.pack("2q", 1, 3), 1) == 0 and st == bytearray([0, 2, 0, 2])
print("ok")
"""


def _pythons():
    """Other CPython 3.9+ interpreters that have their headers: on PATH, or pyenv's."""
    seen, out = {os.path.realpath(sys.executable)}, []
    exes = [shutil.which(f"python3.{minor}") for minor in range(9, 15)]
    exes += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3")))
    for exe in filter(None, exes):
        r = subprocess.run([exe, "-c", "import sysconfig, sys; print(sysconfig.get_paths()"
                            "['include']); print(sys.executable); print(sysconfig.get_config_var("
                            "'EXT_SUFFIX')); print(*sys.version_info[:2], sep='.')"],
                           capture_output=True, text=True)
        if r.returncode:
            continue
        inc, real, suffix, ver = r.stdout.split()
        if os.path.realpath(real) in seen or not os.path.exists(os.path.join(inc, "Python.h")) \
                or tuple(map(int, ver.split("."))) < (3, 9):
            continue
        seen.add(os.path.realpath(real))
        out.append((ver, real, inc, suffix))
    return out


def test_source_builds_and_runs_under_other_pythons(tmp_path):
    """Each CPython on this machine with headers (3.12+ takes the documented compact-int API,
    earlier ones the digit layout): compile the module, load it there, run the helpers."""
    pys = _pythons()
    if not pys:
        pytest.skip("no other CPython 3.9+ with headers on PATH")
    cc = native._compiler()
    for ver, exe, inc, suffix in pys:
        d = tmp_path / ver
        d.mkdir()
        out = d / f"_radix_native{suffix}"
        cmd = cc + ["-O2", "-shared", "-fPIC", "-std=c99", "-Wall", "-Werror", f"-I{inc}",
                    native._SRC, "-o", str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, (ver, r.stderr)
        r = subprocess.run([exe, "-c", CHECK, str(d)], capture_output=True, text=True)
        assert r.stdout.strip() == "ok", (ver, r.stdout, r.stderr)


def test_this_python_builds_without_warnings(tmp_path):
    inc = sysconfig.get_paths()["include"]
    cmd = native._compiler() + ["-O2", "-shared", "-fPIC", "-std=c99", "-Wall", "-Wextra",
                                "-Wno-unused-parameter", "-Werror", f"-I{inc}", native._SRC,
                                "-o", str(tmp_path / "m.so")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
