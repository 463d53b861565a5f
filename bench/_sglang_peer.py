"""SGLang's Python RadixCache as a benchmark peer, loaded from an unpacked sglang wheel (issue 9).

Importing `sglang.srt.mem_cache.radix_cache` normally pulls in the whole SGLang runtime. Here
only five source files are executed, from the directory given at run time:

    sglang/srt/mem_cache/unified_cache/component_type.py   (an Enum)
    sglang/srt/mem_cache/evict_policy.py                   (LRU/LFU/... strategies)
    sglang/srt/mem_cache/cache_init_params.py              (CacheInitParams)
    sglang/srt/mem_cache/base_prefix_cache.py              (params/results, BasePrefixCache)
    sglang/srt/mem_cache/radix_cache.py                    (RadixKey, TreeNode, RadixCache)

Everything else they import (allocator/memory-pool types, KV events, metrics, runtime context,
`mem_cache.utils`, `utils.common`) is replaced by the stub modules in `_stub_modules`, each
holding only the names these files use. Stub packages have an empty `__path__`, so an import
that is not stubbed fails at once instead of reaching the real runtime. The `sglang*` entries
are removed from `sys.modules` again after loading. Nothing of SGLang is part of this repo.

    pip download sglang --no-deps -d /tmp/sglang_whl
    mkdir -p /tmp/sglang_src && unzip -q -o /tmp/sglang_whl/sglang-*.whl -d /tmp/sglang_src
    PAGEDATTN_PEER_SGLANG=/tmp/sglang_src python bench/bench_radix.py --quick

Uniform API: `make_peer(page_size)` -> `SGLangRadix` (match / insert / lock / unlock / evict);
bench adapter: `peer_class(path)` -> a class with the interface of `bench_radix.Ours`.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
import time
import types
from array import array

import numpy as np
import torch

ENV = "PAGEDATTN_PEER_SGLANG"
_ANCHOR = os.path.join("sglang", "srt", "mem_cache", "radix_cache.py")
_REAL = [  # (module name, path under the root), in load order
    ("sglang.srt.mem_cache.unified_cache.component_type",
     "sglang/srt/mem_cache/unified_cache/component_type.py"),
    ("sglang.srt.mem_cache.evict_policy", "sglang/srt/mem_cache/evict_policy.py"),
    ("sglang.srt.mem_cache.cache_init_params", "sglang/srt/mem_cache/cache_init_params.py"),
    ("sglang.srt.mem_cache.base_prefix_cache", "sglang/srt/mem_cache/base_prefix_cache.py"),
    ("sglang.srt.mem_cache.radix_cache", "sglang/srt/mem_cache/radix_cache.py"),
]
_PACKAGES = ["sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.mem_cache.unified_cache",
             "sglang.srt.utils", "sglang.srt.observability"]
_HOW = (f"unpack an sglang wheel (pip download sglang --no-deps -d /tmp/sglang_whl; "
        f"unzip -q /tmp/sglang_whl/sglang-*.whl -d /tmp/sglang_src) and pass that directory "
        f"(--peer-path or ${ENV})")


class PeerUnavailable(ImportError):
    """SGLang's radix cache cannot be loaded from the given path (missing, or internals changed)."""


##### Locating and loading SGLang's files #####


def find_root(path: str | None = None) -> str:
    """The directory holding `sglang/srt/mem_cache/radix_cache.py`: `path`, else
    $PAGEDATTN_PEER_SGLANG, else the first `sys.path` entry that has it (bench_radix's hook
    puts --peer-path there)."""
    path = path or os.environ.get(ENV)
    if path:
        path = os.path.abspath(os.path.expanduser(path))
        if path.endswith(".whl"):
            raise PeerUnavailable(f"{path} is a wheel file, not a directory: {_HOW}")
        for root in (path, os.path.dirname(path)):   # the unpacked dir, or its sglang/ inside
            if os.path.isfile(os.path.join(root, _ANCHOR)):
                return root
        raise PeerUnavailable(f"no {_ANCHOR} under {path}: {_HOW}")
    for p in sys.path:
        if p and os.path.isfile(os.path.join(p, _ANCHOR)):
            return os.path.abspath(p)
    raise PeerUnavailable(f"no SGLang path given: {_HOW}")


def sglang_version(root: str) -> str:
    for name in sorted(os.listdir(root)):
        if name.startswith("sglang-") and name.endswith(".dist-info"):
            return name[len("sglang-"):-len(".dist-info")]
    return "unknown"


@functools.lru_cache(maxsize=None)
def load(root: str) -> types.SimpleNamespace:
    """SGLang's radix-cache classes, executed from the files under `root` (see module docstring).

    Returns a namespace with RadixCache, RadixKey, MatchPrefixParams, InsertParams, EvictParams
    and version. Raises PeerUnavailable naming the file and symbol when SGLang's internals no
    longer fit the stubs (an unstubbed import, a missing name, a changed result field).
    """
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for k in saved:
        del sys.modules[k]
    mods = {}
    try:
        sys.modules.update(_stub_modules(mods))
        for name, rel in _REAL:
            mods[name] = _exec_file(name, os.path.join(root, rel))
    finally:
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    radix = mods["sglang.srt.mem_cache.radix_cache"]
    base = mods["sglang.srt.mem_cache.base_prefix_cache"]
    ns = types.SimpleNamespace(version=sglang_version(root), root=root)
    for mod, attr in [(radix, "RadixCache"), (radix, "RadixKey"), (base, "MatchPrefixParams"),
                      (base, "InsertParams"), (base, "EvictParams")]:
        if not hasattr(mod, attr):
            raise PeerUnavailable(f"SGLang internals changed: {mod.__file__} has no {attr}")
        setattr(ns, attr, getattr(mod, attr))
    _smoke(ns)
    return ns


def _exec_file(name: str, path: str) -> types.ModuleType:
    if not os.path.isfile(path):
        raise PeerUnavailable(f"SGLang internals changed: {path} is missing")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except ImportError as e:
        raise PeerUnavailable(
            f"SGLang internals changed: {path} imports from {e.name or e}, which "
            f"bench/_sglang_peer.py does not load or stub ({e}); add it to _REAL (small, pure "
            f"Python) or _stub_modules") from e
    except Exception as e:  # noqa: BLE001 - e.g. a stub lacking what module-level code uses
        raise PeerUnavailable(f"SGLang internals changed: executing {path} failed: {e!r}") from e
    return mod


def _smoke(ns) -> None:
    """Run SGLang's cache once on a 4-token key so an API change fails here, with the reason."""
    try:
        alloc = SlotAllocator(16, 1)
        c = ns.RadixCache.create_simulated(mock_allocator=alloc, page_size=1)
        key = ns.RadixKey(array("q", [1, 2, 3, 4]))
        got = c.insert(ns.InsertParams(key=key, value=alloc.alloc(4))).prefix_len
        m = c.match_prefix(ns.MatchPrefixParams(key=ns.RadixKey(array("q", [1, 2, 9]))))
        n, node = m.device_prefix_len, m.last_device_node
        c.inc_lock_ref(node)
        c.dec_lock_ref(node)
        c.evict(ns.EvictParams(num_tokens=4))
        left = c.evictable_size()
    except Exception as e:  # noqa: BLE001 - any failure means the API moved
        raise PeerUnavailable(f"SGLang internals changed: RadixCache smoke run failed: {e!r}") \
            from e
    if (got, n, left, alloc.available_size()) != (0, 2, 0, 16):
        raise PeerUnavailable(f"SGLang internals changed: smoke run gave inserted-prefix {got}, "
                              f"match {n}, evictable {left}, free {alloc.available_size()} "
                              f"(expected 0, 2, 0, 16)")


##### Stub modules (only the names the five files use) #####


def _module(name: str, package: bool = False, **attrs) -> types.ModuleType:
    m = types.ModuleType(name, "pagedattn stub for SGLang's " + name)
    if package:
        m.__path__ = []   # a submodule that is not stubbed raises ModuleNotFoundError
    m.__dict__.update(attrs)
    return m


def _off(what: str):
    def fail(*a, **k):
        raise NotImplementedError(f"{what} is stubbed out by bench/_sglang_peer.py")
    return fail


class _NoEvents:
    """KVCacheEventRecorder, events disabled (SGLang's default): every record_* is a no-op."""

    def __init__(self, *, enabled=False, **_):
        if enabled:
            raise NotImplementedError("KV cache events are stubbed out by bench/_sglang_peer.py")

    def take(self):
        return []

    def __getattr__(self, name):
        if name.startswith("record_"):
            return lambda *a, **k: None
        raise AttributeError(name)


class _LoRANames:
    def __init__(self, *a, **k):
        pass


def _eviction_strategy(real: dict, policy: str, config=None):
    """mem_cache.utils.get_eviction_strategy over the real evict_policy module (in `real`)."""
    names = {"lru": "LRUStrategy", "lfu": "LFUStrategy", "fifo": "FIFOStrategy",
             "mru": "MRUStrategy", "filo": "FILOStrategy", "priority": "PriorityStrategy",
             "slru": "SLRUStrategy"}
    mod = real.get("sglang.srt.mem_cache.evict_policy")
    cls = getattr(mod, names.get(policy.lower(), ""), None)
    if cls is None:
        raise ValueError(f"eviction policy {policy!r}: the peer supports {sorted(names)}")
    return cls(**config) if config else cls()


def _split_hashes(hashes, split_len: int, page_size: int):
    """mem_cache.utils.split_node_hash_value: per-page hash lists split at a token offset."""
    if hashes is None:
        return None, None
    k = split_len // page_size
    return hashes[:k], hashes[k:]


def _stub_modules(real: dict) -> dict:
    """Stub modules by name; `real` maps names to the real modules loaded so far."""
    mods = {n: _module(n, package=True) for n in _PACKAGES}
    p = "sglang.srt."
    for name, attrs in {
        p + "mem_cache.allocator": dict(BaseTokenToKVPoolAllocator=type(
            "BaseTokenToKVPoolAllocator", (), {})),
        p + "mem_cache.memory_pool": dict(ReqToTokenPool=type("ReqToTokenPool", (), {})),
        p + "mem_cache.events": dict(KVCacheEventRecorder=_NoEvents, LoRANameTable=_LoRANames,
                                      KvEventLoraNames=_LoRANames),
        p + "mem_cache.utils": dict(
            get_eviction_strategy=functools.partial(_eviction_strategy, real),
            split_node_hash_value=_split_hashes),
        p + "utils.common": dict(ceil_align=lambda x, y: -(-x // y) * y),
        p + "observability.metrics_collector": dict(
            STAT_LOGGER_ROLE_RADIX_CACHE="radix_cache", RadixCacheMetricsCollector=None,
            radix_cache_metric_labels=_off("metrics"), resolve_collector_class=_off("metrics")),
        p + "runtime_context": dict(get_observability=_off("runtime context"),
                                    get_parallel=_off("runtime context")),
    }.items():
        mods[name] = _module(name, **attrs)
    return mods


##### Token-to-KV-pool allocator stand-in #####


class SlotAllocator:
    """What SGLang's RadixCache calls on its allocator (`device`, `free_segment`), plus `alloc`.

    A free list of pages like SGLang's PagedTokenToKVPoolAllocator (page_size 1: one slot per
    page); slots of page p are [p * page_size, (p + 1) * page_size). Free pages are kept as a
    stack of chunks: `free` pushes one (O(1) inside evict), `alloc` takes from the top.
    NOTE: never concatenate the whole free list per call: copying a 4M-slot list between two
    timed requests flushes the CPU caches and made SGLang look 3x slower than it is.
    """

    def __init__(self, size: int, page_size: int):
        if size < page_size or page_size < 1:
            raise ValueError(f"size {size} / page_size {page_size}: need size >= page_size >= 1")
        self.page_size, self.device = page_size, "cpu"
        self._chunks = [torch.arange(size // page_size, dtype=torch.int64)]   # page ids
        self._n_free = size // page_size
        self._offs = torch.arange(page_size, dtype=torch.int64)

    def available_size(self) -> int:
        return self._n_free * self.page_size

    def alloc(self, n: int) -> torch.Tensor:
        """int64 tensor [n] of slots, whole pages (n must be a multiple of page_size)."""
        ps = self.page_size
        if n % ps or n > self.available_size():
            raise ValueError(f"alloc({n}): page_size {ps}, {self.available_size()} slots free")
        k, parts = n // ps, []
        while k:
            top = self._chunks[-1]
            if len(top) <= k:
                parts.append(self._chunks.pop())
                k -= len(top)
            else:
                parts.append(top[len(top) - k:])
                self._chunks[-1], k = top[:len(top) - k], 0
        pages = parts[0] if len(parts) == 1 else torch.cat(parts)
        self._n_free -= n // ps
        return pages if ps == 1 else (pages[:, None] * ps + self._offs).reshape(-1)

    def free(self, slots) -> None:
        """Return the pages of `slots` (whole pages, page-aligned, as handed out by alloc)."""
        slots = torch.as_tensor(slots, dtype=torch.int64)
        if slots.numel() % self.page_size:
            raise ValueError(f"free: {slots.numel()} slots is not whole pages of {self.page_size}")
        pages = slots[::self.page_size] // self.page_size
        if len(pages):
            self._chunks.append(pages)
            self._n_free += len(pages)

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        if start_pos % self.page_size:
            raise ValueError(f"free_segment: start_pos {start_pos} is not page-aligned")
        self.free(free_index)


##### Uniform peer API #####


class SGLangRadix:
    """SGLang's RadixCache behind the small API the benchmark and the cross-check use.

    Tokens are int64 numpy arrays (or int sequences); slots are int64 tensors from `self.alloc`.
    """

    def __init__(self, ns, size: int, page_size: int):
        self.ns, self.page_size = ns, page_size
        self.alloc = SlotAllocator(size, page_size)
        self.cache = ns.RadixCache.create_simulated(mock_allocator=self.alloc, page_size=page_size)

    def key(self, tokens):
        """SGLang's RadixKey over array('q'); build it once per request, outside any timer."""
        return self.ns.RadixKey(array("q", np.ascontiguousarray(tokens, np.int64).tobytes()))

    def match(self, tokens):
        """(matched tokens, handle): may split a node; does not lock. `tokens` may be a key."""
        key = tokens if isinstance(tokens, self.ns.RadixKey) else self.key(tokens)
        m = self.cache.match_prefix(self.ns.MatchPrefixParams(key=key))
        return m.device_prefix_len, m.last_device_node

    def insert(self, tokens, slots) -> int:
        """Cache tokens[:L] -> slots[:L] (L page-aligned); returns how many were already cached
        (the caller frees its duplicate slots[:returned] and its partial page slots[L:])."""
        key = tokens if isinstance(tokens, self.ns.RadixKey) else self.key(tokens)
        return self.cache.insert(self.ns.InsertParams(key=key, value=slots)).prefix_len

    def lock(self, handle) -> None:
        self.cache.inc_lock_ref(handle)

    def unlock(self, handle) -> None:
        self.cache.dec_lock_ref(handle)

    def evict(self, n: int) -> int:
        """Evict >= n unlocked tokens (fewer if not evictable); their slots go back to alloc."""
        return self.cache.evict(self.ns.EvictParams(num_tokens=n)).num_tokens_evicted

    def evictable_size(self) -> int:
        return self.cache.evictable_size()


def make_peer(page_size: int, *, size: int = 4_000_000, path: str | None = None) -> SGLangRadix:
    """SGLang's RadixCache over a `size`-slot SlotAllocator; PeerUnavailable with the reason."""
    return SGLangRadix(load(find_root(path)), size, page_size)


##### bench_radix adapter (the interface of bench_radix.Ours) #####


def peer_class(path: str | None = None) -> type:
    """A bench_radix cache class for SGLang under `path`; loads (and checks) SGLang now."""
    ns = load(find_root(path))

    class SGLangPeer:
        name = f"sglang-{ns.version}"

        def __init__(self, size, page_size):
            self.p, self.ps = SGLangRadix(ns, size, page_size), page_size

        def request(self, toks):
            """Same steps and timer span as Ours.request: match, lock, insert, unlock.

            NOTE: SGLang's insert walks from the root again (it has no resume-from-match
            argument), as its cache_finished_req does; ours resumes at the matched node.
            """
            p, c, ps = self.p, self.p.cache, self.ps
            need = -(-len(toks) // ps) * ps
            if p.alloc.available_size() < need:
                p.evict(min(p.evictable_size(), need * 8))
            slots = p.alloc.alloc(need)
            key = p.key(toks)
            t0 = time.perf_counter()
            m = c.match_prefix(ns.MatchPrefixParams(key=key))
            c.inc_lock_ref(m.last_device_node)
            got = c.insert(ns.InsertParams(key=key, value=slots)).prefix_len
            c.dec_lock_ref(m.last_device_node)
            dt = time.perf_counter() - t0
            a = len(toks) - len(toks) % ps
            p.alloc.free(torch.cat([slots[:got], slots[a:]]))
            return m.device_prefix_len, dt

        def evictable(self):
            return self.p.evictable_size()

        def evict(self, n):
            self.p.evict(n)

    return SGLangPeer


def __getattr__(name):
    # bench_radix's hook does `from _sglang_peer import SGLangPeer` after putting --peer-path on
    # sys.path: resolve it then, so a bad path fails at import time with the reason.
    if name == "SGLangPeer":
        return peer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
