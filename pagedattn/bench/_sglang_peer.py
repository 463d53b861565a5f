"""SGLang's Python RadixCache as a benchmark peer, run from a released sglang wheel.

`fetch(version)` downloads the wheel with pip (`pip download --no-deps sglang==VERSION`;
"latest": the newest release on the index) and extracts only the files run here into
`<cache>/sglang-peer/<version>/` ($PAGEDATTN_CACHE_DIR, else ~/.cache/pagedattn). `load(root)`
executes those files (`_REAL`) with stub modules for everything else they import (the union
over supported releases; stub packages have an empty `__path__`, so an unstubbed import fails
at once), then removes the `sglang*` modules again. Nothing of SGLang is part of this
repository. docs/radix_peer.md has the details.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import types
import zipfile

import torch

from pagedattn import config

VERSIONS = ("0.5.10.post1", "latest")   # a fixed reference release, and the newest
_REAL = [  # (module name, path under the root, required)
    ("sglang.srt.mem_cache.unified_cache.component_type",
     "sglang/srt/mem_cache/unified_cache/component_type.py", False),
    ("sglang.srt.mem_cache.evict_policy", "sglang/srt/mem_cache/evict_policy.py", True),
    ("sglang.srt.mem_cache.cache_init_params", "sglang/srt/mem_cache/cache_init_params.py", True),
    ("sglang.srt.mem_cache.base_prefix_cache", "sglang/srt/mem_cache/base_prefix_cache.py", True),
    ("sglang.srt.mem_cache.radix_cache", "sglang/srt/mem_cache/radix_cache.py", True),
]
_PACKAGES = ["sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.mem_cache.unified_cache",
             "sglang.srt.utils", "sglang.srt.observability", "sglang.srt.disaggregation"]
_VERSION_FILE = "SGLANG_VERSION"


class PeerUnavailable(ImportError):
    """SGLang's radix cache cannot be fetched or loaded (offline, or its internals changed)."""


##### Fetching a release #####


def cache_root() -> str:
    """Where fetched releases live: sglang-peer in the package cache directory
    (:func:`pagedattn.config.cache_dir`)."""
    return os.path.join(config.cache_dir(), "sglang-peer")


def _pip(*args: str) -> str:
    try:
        out = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True,
                             text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PeerUnavailable(f"pip {' '.join(args)}: {e}") from e
    if out.returncode:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise PeerUnavailable(f"pip {' '.join(args)} failed: {tail[0]}")
    return out.stdout


@functools.lru_cache(maxsize=None)
def latest_version() -> str:
    """The newest sglang release on the package index (`pip index versions sglang`)."""
    m = re.search(r"^sglang \(([^)]+)\)", _pip("index", "versions", "sglang"), re.M)
    if not m:
        raise PeerUnavailable("pip index versions sglang: no version in its answer")
    return m.group(1)


def fetch(version: str) -> str:
    """Directory holding the extracted radix-cache files of sglang `version` ("latest": the
    newest release); downloads the wheel with pip when it is not cached yet. Raises
    PeerUnavailable with the reason (no network, no such release, a wheel without the files)."""
    if version == "latest":
        version = latest_version()
    root = os.path.join(cache_root(), version)
    if os.path.isfile(os.path.join(root, _VERSION_FILE)):
        return root
    with tempfile.TemporaryDirectory() as tmp:
        _pip("download", "--no-deps", "--no-cache-dir", "-q", "-d", tmp, f"sglang=={version}")
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if len(wheels) != 1:
            raise PeerUnavailable(f"pip download sglang=={version}: got {wheels}, not one wheel")
        os.makedirs(os.path.dirname(root), exist_ok=True)
        staging = tempfile.mkdtemp(dir=os.path.dirname(root))
        with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as z:
            names = set(z.namelist())
            for _, rel, required in _REAL:
                if rel in names:
                    z.extract(rel, staging)
                elif required:
                    raise PeerUnavailable(f"sglang {version} wheel has no {rel}")
        with open(os.path.join(staging, _VERSION_FILE), "w") as f:
            f.write(version + "\n")
    try:
        os.rename(staging, root)
    except OSError:           # another process fetched it first
        if not os.path.isfile(os.path.join(root, _VERSION_FILE)):
            raise
    return root


def version_of(root: str) -> str:
    try:
        with open(os.path.join(root, _VERSION_FILE)) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


##### Loading SGLang's files #####


@functools.lru_cache(maxsize=None)
def load(root: str) -> types.SimpleNamespace:
    """SGLang's radix-cache classes, executed from the files under `root` (module docstring).

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
        for name, rel, required in _REAL:
            path = os.path.join(root, rel)
            if required or os.path.isfile(path):
                mods[name] = _exec_file(name, path)
    finally:
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    radix = mods["sglang.srt.mem_cache.radix_cache"]
    base = mods["sglang.srt.mem_cache.base_prefix_cache"]
    ns = types.SimpleNamespace(version=version_of(root), root=root)
    for mod, attr in [(radix, "RadixCache"), (radix, "RadixKey"), (base, "MatchPrefixParams"),
                      (base, "InsertParams"), (base, "EvictParams")]:
        if not hasattr(mod, attr):
            raise PeerUnavailable(f"SGLang internals changed: {mod.__file__} has no {attr}")
        setattr(ns, attr, getattr(mod, attr))
    fields = getattr(getattr(base, "MatchResult", None), "_fields", ())
    if "device_prefix_len" in fields:        # newer releases: the length, indices on demand
        ns.match_len = lambda m: m.device_prefix_len
    elif "device_indices" in fields:
        ns.match_len = lambda m: len(m.device_indices)
    else:
        raise PeerUnavailable(f"SGLang internals changed: MatchResult fields {fields}")
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
            f"pagedattn/bench/_sglang_peer.py does not load or stub ({e}); add it to _REAL (small, pure "
            f"Python) or _stub_modules") from e
    except Exception as e:  # noqa: BLE001 - e.g. a stub lacking what module-level code uses
        raise PeerUnavailable(f"SGLang internals changed: executing {path} failed: {e!r}") from e
    return mod


def _smoke(ns) -> None:
    """Run SGLang's cache once on a 4-token key so an API change fails here, with the reason."""
    try:
        alloc = SlotAllocator(16, 1)
        c = ns.RadixCache.create_simulated(mock_allocator=alloc, page_size=1)
        got = c.insert(ns.InsertParams(key=ns.RadixKey([1, 2, 3, 4]),
                                       value=alloc.alloc(4))).prefix_len
        m = c.match_prefix(ns.MatchPrefixParams(key=ns.RadixKey([1, 2, 9])))
        n, node = ns.match_len(m), m.last_device_node
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


##### Stub modules (only the names the loaded files use) #####


def _module(name: str, package: bool = False, **attrs) -> types.ModuleType:
    m = types.ModuleType(name, "pagedattn stub for SGLang's " + name)
    if package:
        m.__path__ = []   # a submodule that is not stubbed raises ModuleNotFoundError
    m.__dict__.update(attrs)
    return m


def _off(what: str):
    def fail(*a, **k):
        raise NotImplementedError(f"{what} is stubbed out by pagedattn/bench/_sglang_peer.py")
    return fail


class _NoEvents:
    """KVCacheEventRecorder, events disabled (SGLang's default): every record_* is a no-op."""

    def __init__(self, *, enabled=False, **_):
        if enabled:
            raise NotImplementedError("KV cache events are stubbed out by pagedattn/bench/_sglang_peer.py")

    def take(self):
        return []

    def __getattr__(self, name):
        if name.startswith("record_"):
            return lambda *a, **k: None
        raise AttributeError(name)


class _Inert:
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
    """Stub modules by name (the union over supported releases); `real` maps names to the real
    modules loaded so far."""
    mods = {n: _module(n, package=True) for n in _PACKAGES}
    p = "sglang.srt."
    for name, attrs in {
        p + "mem_cache.allocator": dict(BaseTokenToKVPoolAllocator=type(
            "BaseTokenToKVPoolAllocator", (), {})),
        p + "mem_cache.memory_pool": dict(ReqToTokenPool=type("ReqToTokenPool", (), {})),
        p + "mem_cache.events": dict(KVCacheEventRecorder=_NoEvents, LoRANameTable=_Inert,
                                      KvEventLoraNames=_Inert),
        p + "mem_cache.utils": dict(
            get_eviction_strategy=functools.partial(_eviction_strategy, real),
            split_node_hash_value=_split_hashes, convert_to_bigram_key=_off("EAGLE bigram keys")),
        p + "mem_cache.hicache_storage": dict(get_hash_str=_off("KV event hashes"),
                                              hash_str_to_int64=_off("KV event hashes")),
        p + "disaggregation.kv_events": dict(MEDIUM_GPU="GPU", AllBlocksCleared=_Inert,
                                              BlockRemoved=_Inert, BlockStored=_Inert),
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
    """What SGLang's RadixCache calls on its allocator (`device`, `free`, `free_segment`), plus
    `alloc`. A free list of pages like SGLang's PagedTokenToKVPoolAllocator (page_size 1: one
    slot per page); slots of page p are [p * page_size, (p + 1) * page_size). Free pages are kept
    as a stack of chunks: `free` pushes one (O(1) inside evict), `alloc` takes from the top.
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

    Tokens are plain lists of ints (what SGLang's scheduler holds); slots are int64 tensors
    from `self.alloc`.
    """

    def __init__(self, ns, size: int, page_size: int):
        self.ns, self.page_size, self.version = ns, page_size, ns.version
        self.alloc = SlotAllocator(size, page_size)
        self.cache = ns.RadixCache.create_simulated(mock_allocator=self.alloc, page_size=page_size)

    def match(self, tokens):
        """(matched tokens, handle): may split a node; does not lock."""
        m = self.cache.match_prefix(self.ns.MatchPrefixParams(key=self.ns.RadixKey(tokens)))
        return self.ns.match_len(m), m.last_device_node

    def insert(self, tokens, slots) -> int:
        """Cache tokens[:L] -> slots[:L] (L page-aligned); returns how many were already cached
        (the caller frees its duplicate slots[:returned] and its partial page slots[L:])."""
        n = len(tokens) - len(tokens) % self.page_size     # SGLang inserts page-aligned keys
        if n < len(tokens):
            tokens, slots = tokens[:n], slots[:n]
        key = self.ns.RadixKey(tokens)
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


def make_peer(page_size: int, *, size: int = 4_000_000, version: str = VERSIONS[0]) \
        -> SGLangRadix:
    """SGLang `version`'s RadixCache over a `size`-slot SlotAllocator (fetched with pip when not
    cached); PeerUnavailable with the reason."""
    return SGLangRadix(load(fetch(version)), size, page_size)


__all__ = ["VERSIONS", "PeerUnavailable", "cache_root", "latest_version", "fetch", "version_of",
           "load", "SlotAllocator", "SGLangRadix", "make_peer"] 
