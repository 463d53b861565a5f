"""Backend registry, the pure selection rule, and ``resolve`` for the public ops.

``select(op, arch, **plain facts) -> Decision`` is pure (strings, dtypes, ints) and cached per
(op, arch, shape class); ``resolve`` turns a call's tensors into those facts without touching
device data (no ``.item()``/``.cpu()``: graph-capturable), reads the overrides from the
environment, and asks the chosen backend's own ``supports()`` for the final word.
"""
import functools
import importlib
from types import MappingProxyType
from typing import Mapping, NamedTuple, Optional, Tuple

import torch

from pagedattn import config
from pagedattn.dispatch import capabilities as C
from pagedattn.dispatch import verified as V
from pagedattn.dispatch.arch import arch_facts, clear_caches, device_facts

##### Registry #####

BACKENDS = {}  # name -> module path, imported lazily by load()


def register(caps: C.BackendCaps) -> C.BackendCaps:
    """Add a backend: its declared capability table and the module that implements it."""
    C.CAPS[caps.name] = caps
    BACKENDS[caps.name] = caps.module
    return caps


for _caps in (C.TORCH, C.TRITON, C.HIP):
    register(_caps)


_LOADED = {}  # name -> module: import_module costs ~2 us per call even when imported


def load(name: str):
    mod = _LOADED.get(name)
    if mod is None:
        if name not in BACKENDS:
            raise ValueError(f"backend: expected one of {['auto', *BACKENDS]}, got {name!r}")
        mod = _LOADED[name] = importlib.import_module(BACKENDS[name])  # ImportError: not cached
    return mod


##### Data tables #####

# NOTE the order ranks by speed; `auto` skips untrusted backends (verified.py). Keys: an arch, else
# its vendor; per op, else "*". Priors but NVIDIA's until the A/B bench measures an arch.
# * AMD/Hygon: Triton first until the HIP kernels have run there (compile- or syntax-checked
#   only); on the H200 the HIP extend runs at a quarter of Triton's rate.
# * NVIDIA: Triton first. On the H200 the HIP decode is 0.5-5.5 % ahead of Triton's on the 32/8
#   rows of the decode table (bench/results/2026-12-02-h200-3e3d07a) but behind on MHA, 1.2-1.9x
#   slower with fp8 caches and 1.06-1.6x for groups > 16; it has fewer options and a ~20 s nvcc
#   build on first use.
# * cpu / unknown GPUs: no HIP; Triton (the interpreter on cpu) then the torch reference.
PREFERENCE = {
    "amd": {"*": ("triton", "hip", "torch")},
    "hygon": {"*": ("triton", "hip", "torch")},
    "nvidia": {"*": ("triton", "hip", "torch")},
    "cpu": {"*": ("triton", "torch")},
    "unknown": {"*": ("triton", "torch")},
}
PREFERENCE_SOURCE = "docs/performance.md"

# Split-KV partition (tokens): 512, or 256 when the GQA group exceeds 15 (docs/dispatch.md): a
# big group already gives each block 16+ rows of work, so more partitions are
# needed to fill the device. PAGEDATTN_PARTITION_SIZE / partition_size= override.
PARTITION_SIZE, PARTITION_SIZE_BIG_GROUP, BIG_GROUP = 512, 256, 15
# Decode runs one pass when num_seqs * num_kv_heads >= FILL * CUs: the KV-head grid alone then
# keeps enough K/V tiles in flight (the one-pass vs split-KV choice is whether num_seqs *
# num_kv_heads fills the device: docs/dispatch.md). On the H200, with the one-pass program
# streaming its whole sequence through one pipelined loop, one pass beats split-KV from 3.9
# programs per SM (64 x 8: 247 against 260 us) and loses badly at 0.5 per SM (8 x 8: 251
# against 84 us). The Triton launcher (triton_kernels.decode._mode) reads this constant.
FILL = 3
# HIP decode template instantiations (hip_kernels/csrc/attn_inst.cuh PK_REUSEKV_SWITCH): the
# smallest REUSE >= group; groups above 64 take ceil(group / 64) blocks per KV head.
REUSE_KV_TIMES = (1, 2, 4, 8, 16, 32, 48, 64)


class Decision(NamedTuple):
    """Which backend serves a call, which kernel variant, its launch parameters, and why."""

    backend: str
    variant: str = "default"
    params: Mapping = MappingProxyType({})
    reasons: Tuple[str, ...] = ()
    arch: str = ""

    def describe(self) -> str:
        p = ", ".join(f"{k}={v}" for k, v in self.params.items())
        head = f"{self.backend} (variant {self.variant}{'; ' + p if p else ''}) on {self.arch}"
        return head + "".join(f"\n  - {r}" for r in self.reasons)


##### Shape rules #####

def partition_size_for(group: Optional[int], block_size: Optional[int],
                       override: Optional[int] = None) -> Tuple[int, str]:
    """Split-KV partition size and why; always a multiple of the block size."""
    if override is not None:
        p, why = override, f"partition_size {override}: overridden"
    elif group is not None and group > BIG_GROUP:
        p, why = PARTITION_SIZE_BIG_GROUP, f"partition_size 256: group {group} > {BIG_GROUP}"
    else:
        p, why = PARTITION_SIZE, "partition_size 512: default"
    if block_size is not None and block_size > p:
        p, why = block_size, why + f", raised to block_size {block_size}"
    return p, why


def reuse_kv_times(group: int) -> Tuple[int, int]:
    """(REUSE_KV_TIMES, head groups per KV head): group rounded up to a specialisation."""
    for r in REUSE_KV_TIMES:
        if group <= r:
            return r, 1
    r = REUSE_KV_TIMES[-1]
    return r, -(-group // r)


def _variant(backend, op, f, arch) -> Tuple[str, dict, list]:
    if backend == "torch" or op in ("store_kv", "copy_blocks"):
        return ("reference" if backend == "torch" else "default"), {}, []
    why = []
    if op == "extend_attention":
        variant = "tree_mask" if "tree_mask" in f["features"] else "prefix_prefill"
        params = {"block_m": 64, "block_n": min(64, f["block_size"] or 64)} \
            if backend == "hip" else {}
    else:
        part, pwhy = partition_size_for(f["group"], f["block_size"], f["partition_size"])
        if f["short"]:
            variant, vwhy = "one_pass", f"one pass: the context fits one {part}-token partition"
        elif backend == "triton":
            variant, vwhy = "balanced", ("balanced split: each program sizes its share of a "
                                         "sequence from the batch's lengths, on the device")
        elif f["fills"]:
            variant, vwhy = "one_pass", (f"one pass: num_seqs * num_kv_heads >= {FILL} x "
                                         f"{arch.num_cus} CUs fills the device")
        else:
            variant = "split_kv"
            vwhy = ("split-KV: num_seqs * num_kv_heads " + ("unknown" if f["fills"] is None else
                    f"< {FILL} x {arch.num_cus} CUs") + ", partitions fill the device")
        why.append(vwhy)
        params = {"partition_size": part} if variant in ("split_kv", "balanced") else {}
        if variant in ("split_kv", "balanced"):
            why.append(pwhy)
        if backend == "hip" and f["group"] is not None:
            reuse, heads = reuse_kv_times(f["group"])
            params.update(reuse_kv_times=reuse, head_groups=heads)
            why.append(f"REUSE_KV_TIMES {reuse}: group {f['group']} rounded up to {REUSE_KV_TIMES}")
    return variant, params, why


##### Selection (pure) #####

_DTYPES = {"fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
           "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32,
           "float32": torch.float32, "float": torch.float32, "e4m3": torch.float8_e4m3fn,
           "fp8_e4m3": torch.float8_e4m3fn, "float8_e4m3fn": torch.float8_e4m3fn,
           "e5m2": torch.float8_e5m2, "fp8_e5m2": torch.float8_e5m2,
           "float8_e5m2": torch.float8_e5m2}


def _dtype(name, v):
    if v is None or isinstance(v, torch.dtype):
        return v
    if isinstance(v, str) and v.replace("torch.", "") in _DTYPES:
        return _DTYPES[v.replace("torch.", "")]
    raise TypeError(f"{name}: expected a torch.dtype or one of {sorted(_DTYPES)}, got {v!r}")


def preference(arch: str, op: str) -> Tuple[str, ...]:
    facts = arch_facts(arch)
    row = PREFERENCE.get(arch) or PREFERENCE.get(facts.vendor) or PREFERENCE["unknown"]
    return row.get(op) or row["*"]


def select(op: str, arch: str, *, dtype=None, kv_dtype=None, head_dim: Optional[int] = None,
           block_size: Optional[int] = None, group: Optional[int] = None,
           layout: Optional[str] = None, features=(), q_len: int = 1,
           num_seqs: Optional[int] = None,
           num_kv_heads: Optional[int] = None, max_seq_len: Optional[int] = None,
           partition_size: Optional[int] = None, num_cus: Optional[int] = None,
           interpret: bool = False, backend: str = "auto", forced_by: str = "backend=",
           rejected: Tuple[Tuple[str, Tuple[str, ...]], ...] = (),
           checked: Tuple[V.Check, ...] = (), head_dim_v: Optional[int] = None,
           has_triton: bool = True) -> Decision:
    """The backend, variant and parameters for one call, from plain facts (pure, cached).

    arch: ``detect_arch()``'s string. dtype: q's dtype; kv_dtype: the cache's (default dtype).
    head_dim, head_dim_v: K's and V's head dims (head_dim_v default head_dim).
    group: num_q_heads / num_kv_heads. features: names from ``capabilities.FEATURES``.
    q_len: decode query tokens per sequence (> 1: speculative decoding).
    num_seqs, num_kv_heads, max_seq_len: the decode variant's inputs (None = unknown).
    num_cus: the device's CU/SM count (default: the arch table's). interpret: TRITON_INTERPRET.
    has_triton: whether ``import triton`` works (the Triton backend's first condition).
    backend: "auto" or a forced backend (``forced_by`` names the override in messages).
    rejected: (backend, reasons) pairs its module's ``supports()`` gave at call time.
    checked: this device's self-check results for ``op``; auto picks only trusted backends.

    Raises ValueError (naming the argument) for unknown names, and when a forced backend, or
    every backend, cannot serve the call: the message lists the reasons.
    """
    if op not in C.OPS:
        raise ValueError(f"op: expected one of {list(C.OPS)}, got {op!r}")
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {['auto', *BACKENDS]}, got {backend!r}")
    features = frozenset(features)
    if not features <= C.FEATURES:
        raise ValueError(f"features: unknown {sorted(features - C.FEATURES)}; known "
                         f"{sorted(C.FEATURES)}")
    dtype = _dtype("dtype", dtype)
    kv_dtype = _dtype("kv_dtype", kv_dtype) or dtype
    facts = arch_facts(arch)
    cus = num_cus or facts.num_cus
    part, _ = partition_size_for(group, block_size, partition_size)
    fills = None if num_seqs is None or num_kv_heads is None else \
        num_seqs * num_kv_heads >= FILL * cus
    short = None if max_seq_len is None else max_seq_len <= part
    if q_len > 1:
        features |= {"spec_decode"}
    if head_dim_v is None:
        head_dim_v = head_dim
    elif head_dim is not None and head_dim_v != head_dim:
        features |= {"head_dim_v"}
    return _select(op, arch, dtype, kv_dtype, head_dim, head_dim_v, block_size, group, layout,
                   features, int(q_len), fills, short, partition_size, cus, bool(interpret),
                   backend, forced_by, tuple(rejected), tuple(checked), bool(has_triton))


@functools.lru_cache(maxsize=4096)
def _select(op, arch, dtype, kv_dtype, head_dim, head_dim_v, block_size, group, layout, features,
            q_len, fills, short, partition_size, cus, interpret, backend, forced_by, rejected,
            checked, has_triton) -> Decision:
    facts = arch_facts(arch)._replace(num_cus=cus)
    f = dict(group=group, block_size=block_size, features=features, fills=fills, short=short,
             partition_size=partition_size)
    late = dict(rejected)

    def why_not(name):
        return C.unsupported(name, op, facts, dtype=dtype, kv_dtype=kv_dtype, head_dim=head_dim,
                             block_size=block_size, group=group, layout=layout,
                             features=features, interpret=interpret, q_len=q_len,
                             head_dim_v=head_dim_v, has_triton=has_triton) \
            + list(late.get(name, ()))

    def decide(name, notes):
        variant, params, vwhy = _variant(name, op, f, facts)
        return Decision(name, variant, MappingProxyType(params), tuple(notes + vwhy), arch)

    where = (f"arch {arch} ({facts.vendor}, {facts.matrix_unit}, wave{facts.wave_size}, "
             f"{cus} CUs)")
    if backend != "auto":
        why = why_not(backend)
        if why:
            raise ValueError(f"backend {backend!r} (forced by {forced_by}) cannot serve {op} on "
                             f"{arch}: " + "; ".join(why))
        return decide(backend, [f"{backend} forced by {forced_by}", where,
                                V.trust_note(backend, op, arch, checked)])
    order = preference(arch, op)
    notes = [f"{where}: order {' > '.join(order)} (prior; measured order goes in "
             f"{PREFERENCE_SOURCE})"]
    for name in order:
        why = why_not(name) or V.distrust(name, op, arch, checked)
        if not why:
            return decide(name, notes + [f"{name}: first backend in the order that supports "
                                         "the call", V.trust_note(name, op, arch, checked)])
        notes.append(f"{name} skipped: " + "; ".join(why))
    raise ValueError(f"no backend can serve {op} on {arch}: " + " | ".join(notes[1:]))


_GENERATION = [0]  # bumped by cache_clear: memos of resolved calls (api) key on it


def generation() -> int:
    return _GENERATION[0]


def cache_clear() -> None:
    """Forget cached decisions and detected archs (tests; after changing devices)."""
    _select.cache_clear()
    clear_caches()
    V.clear()
    _GENERATION[0] += 1


##### Resolution for the public ops #####

def _env_backend() -> str:
    return config.get("PAGEDATTN_BACKEND")


def _env_partition_size() -> Optional[int]:
    v = config.get("PAGEDATTN_PARTITION_SIZE")
    if v is not None and v & (v - 1):
        raise ValueError(f"PAGEDATTN_PARTITION_SIZE: expected a positive power of 2, got {v}")
    return v


def count_or_auto(raw, what: str) -> int:
    """A launch parameter that is ``"auto"`` (0) or a positive integer; anything else raises
    ValueError naming `what`."""
    if raw == "auto":
        return 0
    try:
        n = int(raw)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise ValueError(f"{what}: expected a positive integer or auto, got {raw!r}")
    return n


def call_facts(op: str, *, q=None, k_cache=None, layout=None, geom=None, opts=None,
               causal=True, k_new=None, custom_mask=None, return_lse=False, block_table=None,
               partition_size=None, **_ignored) -> dict:
    """The plain facts ``select`` needs, read from tensor metadata only (no device sync)."""
    t = k_cache if k_cache is not None else q
    dev = t.device if isinstance(t, torch.Tensor) else torch.device("cpu")
    facts = device_facts(dev)
    if geom is None and k_cache is not None and layout is not None:
        from pagedattn.layouts import cache_geometry
        geom = cache_geometry(k_cache, layout)
    attn = op in ("paged_decode", "extend_attention")
    features = set()
    if opts is not None:
        for name, on in (("sinks", opts.sinks is not None), ("alibi", opts.alibi_slopes
                         is not None), ("window", opts.sliding_window is not None),
                         ("soft_cap", bool(opts.logit_cap))):
            if on:
                features.add(name)
    if return_lse:
        features.add("lse")
    if op == "paged_decode" and q is not None and q.dim() == 4:
        features.add("spec_decode")
    if op == "extend_attention":
        features |= {n for n, on in (("non_causal", causal is False), ("k_new", k_new is not None),
                                     ("tree_mask", custom_mask is not None)) if on}
    if geom is not None and geom.head_dim_v != geom.head_dim and op != "copy_blocks":
        features.add("head_dim_v")
    group = q.shape[-2] // geom.num_kv_heads if attn and q is not None and geom else None
    bs = geom.block_size if geom else None
    return dict(
        arch=facts.arch, num_cus=facts.num_cus,
        dtype=(q.dtype if q is not None else None) if op != "copy_blocks" else None,
        kv_dtype=k_cache.dtype if k_cache is not None else None,
        head_dim=geom.head_dim if geom else None,
        head_dim_v=geom.head_dim_v if geom else None, block_size=bs, group=group, layout=layout,
        features=frozenset(features),
        q_len=q.shape[1] if op == "paged_decode" and q is not None and q.dim() == 4 else 1,
        num_seqs=q.shape[0] if op == "paged_decode" and q is not None else None,
        num_kv_heads=geom.num_kv_heads if geom else None,
        max_seq_len=block_table.shape[1] * bs if block_table is not None and bs else None,
        checked=V.device_checks(dev, op),
        partition_size=partition_size if partition_size is not None else _env_partition_size())


def resolve_decision(op: str, backend: str = "auto", **facts) -> Decision:
    """The Decision for a call given the public op's facts (q, k_cache, layout, geom, opts…).

    Per-call ``backend=`` beats ``PAGEDATTN_BACKEND``, which beats "auto". The chosen backend's
    ``supports()`` has the final word: in auto mode a refusal moves on to the next backend (the
    refusal is listed in the reasons); a forced backend that refuses raises ValueError.
    """
    from pagedattn._triton import interpreter_enabled, triton_available

    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {['auto', *BACKENDS]}, got {backend!r}")
    forced_by = f"backend={backend!r}"
    if backend == "auto":
        backend = _env_backend()
        forced_by = f"PAGEDATTN_BACKEND={backend}"
    plain = call_facts(op, **facts)
    arch = plain.pop("arch")
    rejected = ()
    for _ in range(len(BACKENDS) + 1):
        d = select(op, arch, interpret=interpreter_enabled(), backend=backend,
                   forced_by=forced_by, rejected=rejected, has_triton=triton_available(), **plain)
        why = _runtime_reasons(d.backend, op, facts)
        if not why:
            return V.warn_reference_fallback(d, op)
        if backend != "auto":
            raise ValueError(f"backend {backend!r} (forced by {forced_by}) cannot serve {op} on "
                             f"{arch}: " + "; ".join(why))
        rejected += ((d.backend, tuple(f"{r} (its supports())" for r in why)),)
    raise AssertionError("unreachable: select raises once every backend is rejected")


def _runtime_reasons(name: str, op: str, facts) -> list:
    try:
        mod = load(name)
    except ImportError as e:
        return [f"{name} backend unavailable: {e}"]
    return list(mod.supports(op, **facts))


def resolve(op: str, backend: str = "auto", **facts):
    """(name, module) of the backend serving this call (see :func:`resolve_decision`)."""
    d = resolve_decision(op, backend, **facts)
    return d.backend, load(d.backend)
