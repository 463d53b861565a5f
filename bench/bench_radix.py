"""Radix prefix cache benchmark: serving-workload replay through RadixCache (CPU, one core).

Per request it times match_prefix + inc_lock_ref + insert + dec_lock_ref (slot allocation and
freeing outside the timer), and reports matched tokens/s, latency median/p99/max, hit rate and
prefill tokens saved, for workloads
  (a) 1,000 requests sharing a 3,000-token system prompt + 50-200 unique tokens,
  (b) 200 conversations x 8 turns (history re-sent every turn),
  (c) tree-search branches (shared problem prefix, 4-way branching, depth 4),
plus latency with 1 M tokens already cached, evict cost vs number of leaves (per call of 10
leaves and per leaf), the longest garbage-collector pause seen (gc.callbacks), and the cost of
one full collector pass with the 1 M-token tree alive (what a generation-2 collection would
stall a request by; it grows with the number of GC-tracked objects). Page sizes 1 and 16.

Peer: SGLang's RadixCache, only when importable from `--peer-path DIR` or $PAGEDATTN_PEER_SGLANG
(an unpacked sglang wheel; nothing of SGLang is part of this repo).

    python bench/bench_radix.py [--quick] [--out DIR] [--peer-path DIR]
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import numpy as np
import pandas as pd
from tabulate import tabulate

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pagedattn.cache_mgmt.radix_cache import RadixCache  # noqa: E402

##### Workloads (lists of token arrays, in arrival order) #####


def workload_a(rng, n_req=1000, sys_len=3000):
    system = rng.integers(0, 32000, sys_len)
    return [np.concatenate([system, rng.integers(0, 32000, rng.integers(50, 201))])
            for _ in range(n_req)]


def workload_b(rng, n_conv=200, turns=8):
    hist = [rng.integers(0, 32000, rng.integers(100, 300)) for _ in range(n_conv)]
    out = []
    for _ in range(turns):
        for c in range(n_conv):
            prompt = np.concatenate([hist[c], rng.integers(0, 32000, rng.integers(20, 100))])
            out.append(prompt)
            hist[c] = np.concatenate([prompt, rng.integers(0, 32000, rng.integers(50, 200))])
    return out


def workload_c(rng, n_prob=10, depth=4, fan=4):
    out = []
    for _ in range(n_prob):
        level = [rng.integers(0, 32000, 500)]
        for _ in range(depth):
            level = [np.concatenate([p, rng.integers(0, 32000, rng.integers(30, 81))])
                     for p in level for _ in range(fan)]
            out.extend(level)
    return out


##### Adapters: one request through a cache #####


class Ours:
    name = "pagedattn"

    def __init__(self, size, page_size):
        self.c = RadixCache.create_simulated(size, page_size=page_size)
        self.pool, self.ps = self.c.pool, page_size

    def request(self, toks):
        """Returns (matched tokens, seconds timed)."""
        c, ps = self.c, self.ps
        need = -(-len(toks) // ps) * ps
        if self.pool.available_size() < need:
            c.evict(min(c.evictable_size(), need * 8))
        slots = self.pool.alloc(need)
        key = toks.tobytes()
        t0 = time.perf_counter()
        m = c.match_prefix(key)
        c.inc_lock_ref(m.last_node)
        got = c.insert(key, slots, start=m)
        c.dec_lock_ref(m.last_node)
        dt = time.perf_counter() - t0
        a = len(toks) - len(toks) % ps
        self.pool.free(np.concatenate([slots[:got].numpy(), slots[a:].numpy()]))
        return len(m.indices), dt

    def evictable(self):
        return self.c.evictable_size()

    def evict(self, n):
        self.c.evict(n)


def load_peer(path):
    """SGLang's RadixCache adapter class (bench/_sglang_peer.py), or None with the reason printed.

    path: an unpacked SGLang wheel (see docs/radix_peer.md); only its radix files are loaded.
    """
    if not path:
        return None
    try:
        from bench._sglang_peer import peer_class  # the repo root is on sys.path
        return peer_class(path)  # loads and checks SGLang's files now
    except ImportError as e:  # PeerUnavailable is an ImportError
        print(f"peer: SGLang RadixCache not available from {path}: {e}")
        return None


##### Measurements #####


class GcWatch:
    """Longest collector pause while active (gc.callbacks)."""

    def __enter__(self):
        self.max, self.n2, self._t = 0.0, 0, 0.0
        gc.callbacks.append(self._cb)
        return self

    def _cb(self, phase, info):
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.max = max(self.max, time.perf_counter() - self._t)
            self.n2 += info["generation"] == 2

    def __exit__(self, *a):
        gc.callbacks.remove(self._cb)


def replay(cache, reqs):
    lat, matched, total = np.empty(len(reqs)), 0, 0
    with GcWatch() as g:
        for i, toks in enumerate(reqs):
            m, dt = cache.request(toks)
            lat[i] = dt
            matched += m
            total += len(toks)
    return dict(req=len(reqs), matched_Mtok_s=matched / lat.sum() / 1e6,
                med_us=np.median(lat) * 1e6, p99_us=np.percentile(lat, 99) * 1e6,
                max_us=lat.max() * 1e6, hit_rate=matched / total, saved_tok=matched,
                gc_max_ms=g.max * 1e3, gc_full=g.n2)


def latency_at_1m(cls, ps, rng, quick):
    cached = 200_000 if quick else 1_000_000
    cache = cls(cached + 400_000, ps)
    for _ in range(cached // 500):
        cache.request(rng.integers(0, 32000, 500))
    reqs = workload_b(rng, n_conv=50 if quick else 200, turns=4)
    row = replay(cache, reqs)
    row["cached_tok"] = cached
    t0 = time.perf_counter()
    gc.collect()
    row["gc_pass_ms"] = (time.perf_counter() - t0) * 1e3
    return row


def evict_cost(cls, ps, rng, leaves):
    cache = cls(leaves * 64 + 64_000, ps)
    for _ in range(leaves):
        cache.request(rng.integers(0, 32000, 64))
    t, n = 0.0, 0
    while cache.evictable() >= 640 and n < 200:
        t0 = time.perf_counter()
        cache.evict(640)                      # 10 leaves per call
        t += time.perf_counter() - t0
        n += 1
    return t / max(n, 1) * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, < 30 s")
    ap.add_argument("--out", help="write radix_bench.csv / .md here")
    ap.add_argument("--peer-path", default=os.environ.get("PAGEDATTN_PEER_SGLANG"))
    ap.add_argument("--no-gc-freeze", action="store_true",
                    help="skip gc.freeze() of the startup heap (torch import: ~165k objects)")
    args = ap.parse_args(argv)
    if not args.no_gc_freeze:
        gc.collect()
        gc.freeze()   # a server freezes its startup objects; every cache gets the same treatment
    impls = [Ours] + [p for p in [load_peer(args.peer_path)] if p]
    q = args.quick
    rows = []
    for cls in impls:
        for ps in (1, 16):
            rng = np.random.default_rng(0)
            wl = {"a_system_prompt": workload_a(rng, n_req=300 if q else 1000),
                  "b_multi_turn": workload_b(rng, n_conv=60 if q else 200),
                  "c_tree_search": workload_c(rng, n_prob=3 if q else 10)}
            for name, reqs in wl.items():
                r = replay(cls(4_000_000, ps), reqs)
                rows.append(dict(impl=cls.name, page=ps, workload=name, **r))
            r = latency_at_1m(cls, ps, rng, q)
            rows.append(dict(impl=cls.name, page=ps, workload=f"b@{r.pop('cached_tok')}cached",
                             **r))
            for leaves in ((1000, 8000) if q else (1000, 8000, 32000)):
                us = evict_cost(cls, ps, rng, leaves)
                rows.append(dict(impl=cls.name, page=ps, workload=f"evict10@{leaves}leaves",
                                 med_us=us, us_per_leaf=us / 10))
    df = pd.DataFrame(rows)
    text = tabulate(df, headers="keys", tablefmt="github", showindex=False, floatfmt=".3g")
    load = "load average %.2f %.2f %.2f" % os.getloadavg()
    text += (f"\n\n{os.cpu_count()} cores, {load} at the end (another process may share the "
             "machine); med/p99/max: per request, µs; evict rows: med_us = one evict of 10 "
             "leaves.")
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        df.to_csv(os.path.join(args.out, "radix_bench.csv"), index=False)
        with open(os.path.join(args.out, "radix_bench.md"), "w") as f:
            f.write(text + "\n")
    return df


if __name__ == "__main__":
    main()
