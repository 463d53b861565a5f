"""Radix prefix cache benchmark: ours side by side with SGLang's own RadixCache, same requests.

One span per request and cache: match_prefix, inc_lock_ref, insert, dec_lock_ref, on a plain
Python list built before the span (docs/radix_peer.md: what each cache gets, what is outside).
Rows, at page sizes 1 and 16: few-shot (1,000 requests, a shared 3,000-token prompt + 50-200
tokens), multi-turn (200 conversations x 8 turns), tree search (10 problems, 500-token trunk,
4-way to depth 4), 1M cached (multi-turn 200 x 4 on a tree holding 1,000,000 tokens). Also the
fast path (keys encoded outside the span), the pure-Python path (no C helpers), evict per leaf
at 1k/8k/32k leaves, the longest collector pause per replay (gc.callbacks), a full collection
with the 1M-token tree alive.

    pagedattn-bench radix --record            # results of record, bench/results/radix/
    pagedattn-bench radix --quick --sglang none
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import os
import platform
import re
import resource
import subprocess
import sys
import time
from array import array

import numpy as np
import pandas as pd
from tabulate import tabulate

from pagedattn.bench import _sglang_peer as peer
from pagedattn.cache_mgmt import native
from pagedattn.cache_mgmt.radix_cache import RadixCache

PAGES = (1, 16)

##### Workloads (lists of int64 arrays, in arrival order) #####

def few_shot(rng, n_req=1000, sys_len=3000):
    system = rng.integers(0, 32000, sys_len)
    return [np.concatenate([system, rng.integers(0, 32000, rng.integers(50, 201))])
            for _ in range(n_req)]


def multi_turn(rng, n_conv=200, turns=8):
    hist = [rng.integers(0, 32000, rng.integers(100, 300)) for _ in range(n_conv)]
    out = []
    for _ in range(turns):
        for c in range(n_conv):
            prompt = np.concatenate([hist[c], rng.integers(0, 32000, rng.integers(20, 100))])
            out.append(prompt)
            hist[c] = np.concatenate([prompt, rng.integers(0, 32000, rng.integers(50, 200))])
    return out


def tree_search(rng, n_prob=10, depth=4, fan=4):
    out = []
    for _ in range(n_prob):
        level = [rng.integers(0, 32000, 500)]
        for _ in range(depth):
            level = [np.concatenate([p, rng.integers(0, 32000, rng.integers(30, 81))])
                     for p in level for _ in range(fan)]
            out.extend(level)
    return out


##### Adapters: one request through a cache, timed span only #####

KEYS = {"list": lambda a: a.tolist(), "bytes": lambda a: a.tobytes(),
        "array": lambda a: array("q", a.tobytes())}   # token forms, made before the span


class Ours:
    """`c`: the cache (evictable_size, evict); `keys`: the token form (KEYS) it is given;
    `c_helpers`: False builds it on the pure-Python path (native.py)."""

    def __init__(self, size, page_size, keys="list", c_helpers=True):
        with contextlib.nullcontext() if c_helpers else native.disabled():
            self.c = RadixCache.create_simulated(size, page_size=page_size)
        self.pool, self.ps, self.keys = self.c.pool, page_size, KEYS[keys]

    def request(self, arr):
        """Returns (matched tokens, seconds in the span)."""
        c, ps = self.c, self.ps
        need = -(-len(arr) // ps) * ps
        if self.pool.available_size() < need:
            c.evict(min(c.evictable_size(), need * 8))
        slots = self.pool.alloc(need)
        toks = self.keys(arr)
        t0 = time.perf_counter()
        m = c.match_prefix(toks)
        c.inc_lock_ref(m.last_node)
        got = c.insert(toks, slots, start=m)
        c.dec_lock_ref(m.last_node)
        dt = time.perf_counter() - t0
        a = len(arr) - len(arr) % ps
        self.pool.free(np.concatenate([slots[:got].numpy(), slots[a:].numpy()]))
        return len(m.indices), dt


class SGLang:
    """`c`: SGLangRadix (evictable_size, evict); `keys`: the token form (KEYS) it is given."""

    def __init__(self, ns, size, page_size, keys="list"):
        self.c = peer.SGLangRadix(ns, size, page_size)
        self.ns, self.ps, self.keys = ns, page_size, KEYS[keys]

    def request(self, arr):
        p, c, ns, ps = self.c, self.c.cache, self.ns, self.ps
        need = -(-len(arr) // ps) * ps
        if p.alloc.available_size() < need:
            p.evict(min(p.evictable_size(), need * 8))
        slots = p.alloc.alloc(need)
        toks = self.keys(arr)
        a = len(arr) - len(arr) % ps
        t0 = time.perf_counter()
        m = c.match_prefix(ns.MatchPrefixParams(key=ns.RadixKey(toks)))
        node = m.last_device_node
        c.inc_lock_ref(node)
        if a < len(toks):                  # SGLang inserts page-aligned keys and values
            key, val = ns.RadixKey(toks[:a]), slots[:a]
        else:
            key, val = ns.RadixKey(toks), slots
        got = c.insert(ns.InsertParams(key=key, value=val)).prefix_len
        c.dec_lock_ref(node)
        dt = time.perf_counter() - t0
        p.alloc.free(np.concatenate([slots[:got].numpy(), slots[a:].numpy()]))
        return ns.match_len(m), dt


##### Measurements #####

class GcWatch:
    """Longest collector pause and collections per generation while active (gc.callbacks)."""

    def __enter__(self):
        self.max, self.count, self._t = 0.0, [0, 0, 0], 0.0
        gc.callbacks.append(self._cb)
        return self

    def _cb(self, phase, info):
        if phase == "start":
            self._t = time.perf_counter()
            return
        self.max = max(self.max, time.perf_counter() - self._t)
        self.count[info["generation"]] += 1

    def __exit__(self, *a):
        gc.callbacks.remove(self._cb)


def replay(cache, reqs):
    """Per-request spans. A request during which the OS switched this thread out (another
    process took the core: involuntary context switches, RUSAGE_THREAD) is left out of the
    statistics and counted in `switched`; collector pauses stay in."""
    lat, got = np.empty(len(reqs)), np.empty(len(reqs), np.int64)
    keep = np.ones(len(reqs), bool)
    with GcWatch() as g:                   # pauses anywhere in the replay, timed span or not
        for i, arr in enumerate(reqs):
            cs = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
            got[i], lat[i] = cache.request(arr)
            keep[i] = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw == cs
    k = lat[keep]
    row = dict(req=len(reqs), switched=int((~keep).sum()), med_us=np.median(k) * 1e6,
               p99_us=np.percentile(k, 99) * 1e6, mean_us=k.mean() * 1e6, req_s=len(k) / k.sum(),
               hit_rate=got.sum() / sum(len(r) for r in reqs), gc_max_ms=g.max * 1e3,
               gc_gen012="/".join(map(str, g.count)))
    return row, got


def prefill(cache, rng, tokens):   # `tokens` tokens of unrelated 500-token prompts
    for _ in range(tokens // 500):
        cache.request(rng.integers(0, 32000, 500))


def evict_cost(make, rng, leaves, calls):
    """Median microseconds per leaf of evict calls that each take 10 leaves of 64 tokens.
    Every prompt starts with its own token, so the tree is `leaves` leaves under the root and
    every call evicts exactly 10 of them (no shared first token, no split parent evicted
    beside them)."""
    cache = make(leaves * 64 + 64_000)
    for first in rng.permutation(leaves) + 32000:
        prompt = rng.integers(0, 32000, 64)
        prompt[0] = first
        cache.request(prompt)
    ts = []
    while cache.c.evictable_size() >= 640 and len(ts) < calls:
        t0 = time.perf_counter()
        cache.c.evict(640)
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) * 1e6 / 10


def impls(versions, fast):
    """(page size, name, factory(size)) for every cache in the run, at both page sizes, ours
    first. `fast`: also ours with keys encoded outside the span and on the pure-Python path,
    and SGLang with array keys where its RadixKey holds array[int] (what its scheduler keeps)."""
    out = []
    for ps in PAGES:
        out.append((ps, "pagedattn", lambda s, ps=ps: Ours(s, ps)))
        if fast:
            out += [(ps, f"pagedattn ({k} keys)", lambda s, ps=ps, k=k: Ours(s, ps, k))
                    for k in ("bytes", "array")]
            out.append((ps, "pagedattn (pure Python)",
                        lambda s, ps=ps: Ours(s, ps, c_helpers=False)))
        for ns in versions:
            arrays = "array" in str(ns.RadixKey.__init__.__annotations__.get("token_ids"))
            out += [(ps, f"sglang {ns.version}" + " (array keys)" * (k == "array"),
                     lambda s, ps=ps, ns=ns, k=k: SGLang(ns, s, ps, k))
                    for k in ("list", "array") if k == "list" or (fast and arrays)]
    return out


def run(args, versions):
    """Every workload at both page sizes; the replays of one workload are interleaved across
    page sizes and caches (machine drift hits every row alike, page 1 and page 16 included)."""
    quick, rows, mism = args.quick, [], []
    rng = np.random.default_rng(0)
    wl = {"few-shot": few_shot(rng, n_req=300 if quick else 1000),
          "multi-turn": multi_turn(rng, n_conv=60 if quick else 200),
          "tree search": tree_search(rng, n_prob=3 if quick else 10),
          "1M cached": multi_turn(rng, n_conv=50 if quick else 200, turns=4)}
    cached = 200_000 if quick else 1_000_000
    caches = impls(versions, not args.no_fast)
    for name, reqs in wl.items():
        runs, big = {(ps, n): [] for ps, n, _ in caches}, name == "1M cached"
        for _ in range(args.repeat):
            for ps, impl, make in caches:
                c = make(4_000_000 + cached * big)
                prefill(c, np.random.default_rng(1), cached * big)
                gc.collect()
                row, got = replay(c, reqs)
                t0 = time.perf_counter()
                gc.collect()                    # a full collection with the tree alive
                row["gc_full_ms"] = (time.perf_counter() - t0) * 1e3
                runs[ps, impl].append((row, got))
                del c
                gc.collect()
        for (ps, impl), rs in runs.items():     # every run against ours' first
            bad = sum(int((got != runs[ps, "pagedattn"][0][1]).sum()) for _, got in rs)
            mism += [f"{impl} {name} page {ps}: {bad} requests matched differently"] * (bad > 0)
            df = pd.DataFrame([r for r, _ in rs])
            agg = {k: df[k].median() if df[k].dtype.kind == "f" else df[k].iloc[0] for k in df}
            rows.append({"workload": name, "page": ps, "impl": impl, "mismatches": bad,
                         **agg, "gc_max_ms": df.gc_max_ms.max(),
                         "mean_us_runs": "/".join(f"{v:.3f}" for v in df.mean_us)})
        print(f"{name}: done", file=sys.stderr)
    df = pd.DataFrame(rows)
    return df.sort_values("page", kind="stable", ignore_index=True), mism


def run_evict(args, versions):
    """Per-leaf evict cost; the replays are interleaved across tree sizes and caches."""
    sizes = (1000, 8000) if args.quick else (1000, 8000, 32000)
    caches = impls(versions, False)
    us = {(ps, impl, n): [] for ps, impl, _ in caches for n in sizes}
    for _ in range(args.repeat):
        for ps, impl, make in caches:
            for leaves in sizes:    # SGLang heapifies every leaf in each call: fewer calls
                us[ps, impl, leaves].append(evict_cost(
                    make, np.random.default_rng(2), leaves, 100 if impl == "pagedattn" else 10))
                gc.collect()
    return pd.DataFrame([dict(impl=impl, page=ps, leaves=n, us_per_leaf=np.median(v),
                              us_runs="/".join(f"{x:.3f}" for x in v))
                         for (ps, impl, n), v in us.items()])


##### Report #####

# --record writes into the checkout's bench/results/radix/ (it needs a clean git checkout)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "bench", "results", "radix")
TAB = dict(headers="keys", tablefmt="github", showindex=False, floatfmt=".3g")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


COMMIT = None  # --commit: the commit to report (a copy of the tree without .git)


def git_commit() -> str:
    """Short commit of the checkout, `-dirty` when tracked code differs from it (COMMIT when
    set; `nogit` outside a checkout)."""
    if COMMIT:
        return COMMIT
    root = REPO
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                             capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                "pagedattn"],
                               cwd=root, text=True, capture_output=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "nogit"
    return sha + ("-dirty" if dirty else "")


def record_dir() -> str:
    cpu = re.sub(r"[^a-z0-9]+", "-", cpu_model().lower()).strip("-")
    return os.path.join(RESULTS, f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}-"
                                 f"{cpu}-{git_commit()}")


def summary(df, versions):
    """One row per workload and page: ours vs each SGLang release, plain lists."""
    out = []
    for (wl, ps), g in df.groupby(["workload", "page"], sort=False):
        r = g.set_index("impl")
        o = r.loc["pagedattn"]
        row = {"workload": wl, "page": ps, "ours med/p99 us": f"{o.med_us:.1f} / {o.p99_us:.1f}",
               "ours req/s": f"{o.req_s:,.0f}"}
        for ns in versions:
            s = r.loc[f"sglang {ns.version}"]
            row[f"{ns.version} med/p99 us"] = f"{s.med_us:.1f} / {s.p99_us:.1f}"
            row[f"{ns.version} req/s"] = f"{s.req_s:,.0f}"
            row[f"x {ns.version}"] = f"{o.req_s / s.req_s:.2f}"
        out.append(row)
    return pd.DataFrame(out)


def per_round(col: pd.Series) -> pd.Series:
    """The "/"-joined values of each replay round (`mean_us_runs`, `us_runs`) as arrays."""
    return col.map(lambda t: np.array(t.split("/"), float))


def targets(df, ev, versions, mism):
    ours = df[df.impl == "pagedattn"]
    lines = []
    for ns in versions:
        s = df[df.impl == f"sglang {ns.version}"].set_index(["workload", "page"]).req_s
        ratio = ours.set_index(["workload", "page"]).req_s / s
        lines.append(f"* >= 3x SGLang {ns.version} requests/s on every row: "
                     f"{'PASS' if ratio.min() >= 3 else 'FAIL'} (lowest {ratio.min():.2f}x, "
                     f"{ratio.idxmin()[0]} page {ratio.idxmin()[1]})")
    m = ours[ours.workload == "1M cached"]
    lines.append(f"* <= 50 us/request at 1M cached tokens: "
                 f"{'PASS' if max(m.mean_us.max(), m.med_us.max()) <= 50 else 'FAIL'} "
                 f"(mean {' / '.join(f'{v:.1f}' for v in m.mean_us)}, median "
                 f"{' / '.join(f'{v:.1f}' for v in m.med_us)} us at page 1 / 16)")
    o = ours.set_index(["workload", "page"]).mean_us.unstack()
    lines.append(f"* page 16 at least as fast as page 1 per request: "
                 f"{'PASS' if (o[16] <= o[1]).all() else 'FAIL'} (mean us p1 / p16: " + ", ".join(
                     f"{w} {r[1]:.1f} / {r[16]:.1f}" for w, r in o.iterrows()) + ")")
    runs = per_round(ours.set_index(["workload", "page"]).mean_us_runs).unstack()
    lines.append("  * the spread: page 16 / page 1 mean in each round of replays: "
                 + ", ".join(f"{w} " + " / ".join(f"{x:.3f}" for x in r[16] / r[1])
                             for w, r in runs.iterrows()))
    lines.append(f"* no GC pause over 1 ms in any replay: "
                 f"{'PASS' if ours.gc_max_ms.max() <= 1 else 'FAIL'} (longest "
                 f"{ours.gc_max_ms.max():.3f} ms)")
    e = ev[(ev.impl == "pagedattn") & (ev.page == 1)].set_index("leaves").us_per_leaf
    flat = e.max() / e.min()
    lines.append(f"* evict flat within 1.2x from 1k to 32k leaves (page 1): "
                 f"{'PASS' if flat <= 1.2 else 'FAIL'} ({' / '.join(f'{v:.2f}' for v in e)} "
                 f"us per leaf at {' / '.join(map(str, e.index))} leaves: {flat:.2f}x)")
    er = per_round(ev[(ev.impl == "pagedattn") & (ev.page == 1)].set_index("leaves").us_runs)
    lines.append("  * the spread: largest / smallest tree in each round of replays: " + " / ".join(
        f"{x:.2f}" for x in er[er.index.max()] / er[er.index.min()]))
    lines.append(f"* matched lengths agree request by request: "
                 f"{'PASS' if not mism else 'FAIL: ' + '; '.join(mism)}")
    return "\n".join(lines)


def report(df, ev, mism, versions, args, out, argv) -> str:
    evw = ev.pivot_table(index=["impl", "page"], columns="leaves", values="us_per_leaf",
                         sort=False).reset_index()
    evw.columns = [c if isinstance(c, str) else f"us/leaf @{c}" for c in evw.columns]
    cols = ["workload", "page", "impl", "med_us", "p99_us", "mean_us", "req_s", "switched",
            "hit_rate", "gc_max_ms", "gc_gen012", "gc_full_ms", "mismatches"]
    head = [f"date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit "
            f"{git_commit()}, CPU {cpu_model()} ({os.cpu_count()} cores, load "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end)",
            f"python {platform.python_version()}, numpy {np.__version__}, torch "
            f"{sys.modules['torch'].__version__}; SGLang "
            f"{', '.join(ns.version for ns in versions) or 'not run'} (released wheels from pip, "
            "radix cache module only: docs/radix_peer.md)",
            f"command: pagedattn-bench radix {' '.join(argv)}",
            "pagedattn rows: the C helpers (cache_mgmt/native.py) " + (
                "built and used" if native.load() is not None else
                f"NOT in use ({native.reason()})") + "; `pure Python`: the fallback path",
            f"{args.repeat} replays per cache and row, interleaved (median shown; gc_max_ms: the "
            f"longest); gc.freeze() of the startup heap: {'no' if args.no_gc_freeze else 'yes'}",
            "requests during which the OS switched the process out are left out of the "
            "statistics (`switched`: how many); req/s = 1 / mean"]
    text = "\n".join(["# Radix cache vs SGLang RadixCache", "", *[h + "  " for h in head], "",
                      "## Targets", "", targets(df, ev, versions, mism), "",
                      "## Plain lists (the engine call path), per request", "",
                      tabulate(summary(df, versions), **TAB), "",
                      "## All rows (`(... keys)` rows: tokens given as bytes or array('q'), "
                      "made outside the span; `(pure Python)`: without the C helpers)",
                      "", tabulate(df[cols], **TAB), "",
                      "## evict: us per leaf (median call of 10 leaves x 64 tokens; median of "
                      "the replays)", "", tabulate(evw, **TAB), ""])
    if out:
        os.makedirs(out, exist_ok=True)
        df.to_csv(os.path.join(out, "radix_bench.csv"), index=False)
        ev.to_csv(os.path.join(out, "radix_evict.csv"), index=False)
        with open(os.path.join(out, "README.md"), "w") as f:
            f.write(text)
    return text


def check_record_args(args) -> None:
    """Set COMMIT from --commit; exit with the reason when --record cannot name a commit (a
    dirty checkout, or a tree without .git and no --commit) or has nowhere to go (outside a
    checkout without --out)."""
    global COMMIT
    COMMIT = args.commit or None
    if not args.record:
        return
    commit = git_commit()
    if commit.endswith("-dirty"):
        sys.exit(f"--record: the checkout has uncommitted changes ({commit}): commit first "
                 "(results of record name a commit)")
    if commit == "nogit":
        sys.exit("--record: not a git checkout: name the commit the tree holds with --commit "
                 "(results of record name a commit), and the folder with --out")
    if not os.path.exists(os.path.join(REPO, ".git")) and not args.out:
        sys.exit(f"--record: {REPO} is not a checkout (no bench/results/radix/ to write to): "
                 "give --out DIR")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="pagedattn-bench radix",
                               description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    ap.add_argument("--sglang", default=",".join(peer.VERSIONS), help="SGLang releases "
                    "beside ours (pip): versions, 'latest' or 'none' (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=3, help="replays per cache and row; the "
                    "tables show the median of the runs (default: %(default)s)")
    ap.add_argument("--no-fast", action="store_true", help="skip the bytes/array-key rows")
    ap.add_argument("--record", action="store_true", help="write the results of record to "
                    "bench/results/radix/<date>-<cpu>-<commit>/ (a clean checkout, or --commit "
                    "and --out)")
    ap.add_argument("--commit", default=None, help="the commit to report (a tree without .git)")
    ap.add_argument("--out", help="write the results to this directory instead")
    ap.add_argument("--no-gc-freeze", action="store_true",
                    help="skip gc.freeze() of the startup heap (torch import: ~165k objects)")
    args = ap.parse_args(argv)
    check_record_args(args)
    versions = []
    for v in [] if args.sglang == "none" else args.sglang.split(","):
        try:
            versions.append(peer.load(peer.fetch(v)))
        except peer.PeerUnavailable as e:   # results of record need every peer
            if args.record:
                sys.exit(f"sglang {v}: {e}")
            print(f"sglang {v} not run: {e}", file=sys.stderr)
    print(f"SGLang peers: {', '.join(ns.version for ns in versions) or 'none'}", file=sys.stderr)
    if not args.no_gc_freeze:
        gc.collect()
        gc.freeze()   # a server freezes its startup objects; every cache gets the same treatment
    df, mism = run(args, versions)
    ev = run_evict(args, versions)
    out = args.out or (record_dir() if args.record else None)
    print(report(df, ev, mism, versions, args, out, sys.argv[1:] if argv is None else argv))
    return df, ev


if __name__ == "__main__":
    main()
