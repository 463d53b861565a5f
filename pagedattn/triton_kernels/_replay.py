"""Launch replay: the eager fast path of the Triton backend on NVIDIA GPUs.

Why: an eager decode call spent ~400 us of host time on the H200 host against ~15 us of GPU time
: Triton binds and specialises ~65 arguments per launch
(35-66 us a launch), and the launcher re-derives tiles, modes, device properties, environment
knobs and workspace shapes every call. Engines capture decode in CUDA graphs, where none of it
remains, but an eager caller pays it per layer.

What: every launch argument of a decode call is a function of the call's *metadata* (shapes,
strides, dtypes, the 16-byte alignment of every pointer, option values, device, tuning knobs)
and of its tensors. The first call with a given metadata key runs the normal launcher, whose
launches go through :func:`launch` with a :class:`Recorder`; it keeps each launch's compiled
kernel, grid and full argument list, with every tensor replaced by a named slot. Later calls
with the same key run :meth:`Replay.__call__`: fresh workspace, the call's tensors in their
slots, and the compiled kernel's own launcher (``CompiledKernel.run``), which is what
``JITFunction.run`` ends with. The key covers everything Triton specialises on (pointer
alignment, integer values through the shapes and strides they come from, dtypes), so a replay
runs the very kernel the normal path would pick, with the same arguments: same bits.

Limits: triton 3.6 (the version whose launch protocol this mirrors; others take the normal path),
no launch hooks set (profilers), no tensor that is not one of the named slots (then nothing is
recorded). ``PAGEDATTN_LAUNCH_REPLAY=0`` turns it off.
"""

import torch

from pagedattn import config

TRITON = "3.6."  # JITFunction.run's launch protocol, read from this release
MAX_ENTRIES = 512  # distinct metadata keys kept (then the cache starts over)
_CACHE = {}
_VERSION_OK = None  # whether this triton is TRITON (read once)


def enabled(device) -> bool:
    """Replay is possible for calls on ``device``: CUDA, triton 3.6, no launch hooks (profilers),
    no Triton debug or instrumentation mode."""
    global _VERSION_OK
    if device.type != "cuda" or not config.get("PAGEDATTN_LAUNCH_REPLAY"):
        return False
    if _VERSION_OK is None:
        import triton
        _VERSION_OK = triton.__version__.startswith(TRITON) and not torch.version.hip
    if not _VERSION_OK:
        return False
    from triton import knobs
    rt = knobs.runtime
    return (not rt.debug and not knobs.compilation.instrumentation_mode
            and _empty(rt.launch_enter_hook) and _empty(rt.launch_exit_hook))


def _empty(hook):
    """No hook: None, or an empty chain (triton 3.6 keeps a HookChain that is never None)."""
    return hook is None or getattr(hook, "calls", None) == []


def lookup(key):
    return _CACHE.get(key)


def store(key, replay):
    if len(_CACHE) >= MAX_ENTRIES:
        _CACHE.clear()
    _CACHE[key] = replay


def clear():
    _CACHE.clear()


def aliasing(*tensors) -> tuple:
    """Which arguments are one object (each position: the first position holding it): a slot
    then stands for all of them, on every call of the key."""
    first = {}
    return tuple(first.setdefault(id(t), i) for i, t in enumerate(tensors))


def alignment(*tensors) -> tuple:
    """Triton's pointer specialisation: whether each data pointer is 16-byte aligned (None for
    an absent tensor)."""
    return tuple(None if t is None else t.data_ptr() % 16 == 0 for t in tensors)


class Recorder:
    """Collects the launches of one normal-path call. ``slots``: {id(tensor): slot name} for
    every tensor an argument may hold; ``allocs``: {slot name: (shape, dtype)} of the slots the
    replay allocates afresh (workspace, lse); ``shared``: {slot name: tensor} reused as is (a
    never-touched dummy)."""

    def __init__(self, slots, allocs, shared):
        self.slots, self.allocs, self.shared = slots, allocs, shared
        self.launches = []
        self.ok = True

    def add(self, jf, kernel, grid, args, kwargs):
        if kernel is None or not hasattr(kernel, "packed_metadata") or jf.pre_run_hooks:
            self.ok = False
            return
        params = bound_params(jf, args, kwargs)
        template, slots = [], []
        for i, value in enumerate(params.values()):
            if isinstance(value, torch.Tensor):
                name = self.slots.get(id(value))
                if name is None:  # a tensor we cannot name: do not record this call
                    self.ok = False
                    return
                slots.append((i, name))
                value = None
            template.append(value)
        g = tuple(grid) + (1,) * (3 - len(grid))
        self.launches.append((kernel, g, template, tuple(slots)))

    def replay(self):
        """The :class:`Replay` of what was recorded, or None."""
        if not self.ok or not self.launches:
            return None
        return Replay(self.launches, self.allocs, self.shared)


class Replay:
    """The recorded launches of one metadata key."""

    __slots__ = ("launches", "allocs", "shared")

    def __init__(self, launches, allocs, shared):
        self.launches, self.allocs, self.shared = launches, allocs, shared

    def __call__(self, tensors: dict, device, stream: int, grid=None) -> dict:
        """Launch on ``stream`` (the current device's current stream, as ``JITFunction.run``)
        with ``tensors`` ({slot name: tensor}, the call's own), allocating on ``device``;
        ``grid``: the grid of every launch, where it is not part of the key (store_kv's token
        count). Returns the slots, the fresh allocations included."""
        vals = dict(self.shared)
        vals.update(tensors)
        for name, (shape, dtype) in self.allocs.items():
            vals[name] = torch.empty(shape, dtype=dtype, device=device)
        for kernel, g, template, slots in self.launches:
            g = g if grid is None else grid
            args = list(template)
            for i, name in slots:
                args[i] = vals[name]
            kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata, None,
                       None, None, *args)
        return vals


# ----------------------------------------------------------------------------------------------
# paged decode (decode.run)
# ----------------------------------------------------------------------------------------------

# every environment variable the decode launcher reads (decode.py)
DECODE_KNOBS = ("PAGEDATTN_DEV_DECODE_KERNEL", "PAGEDATTN_DEV_DECODE_MODE",
                "PAGEDATTN_DEV_GUARDS", "TRITON_INTERPRET")
_DECODE_KNOBS_KEY = config.names(*DECODE_KNOBS)


def decode_key(call, overrides, current):
    """Everything decode.run's launches depend on besides the tensors' data (``overrides``: the
    decode module's test overrides, FORCE_MODE, PPP and BALANCE). V starting where K does
    (an MLA latent cache's view) selects the kernel that reads V out of the K tile."""
    q, k, v, bt, out, o = call.q, call.k_cache, call.v_cache, call.block_table, call.out, call.opts
    own = (q, k, v, bt, call.seq_lens, out, o.k_scale, o.v_scale, o.alibi_slopes, o.sinks,
           call.errors)
    return (q.shape, q.stride(), q.dtype, k.shape, k.stride(), k.dtype, v.shape, v.stride(),
            v.dtype, bt.shape, bt.stride(), call.seq_lens.shape, out.stride(), out.dtype,
            call.layout, o.scale, o.sliding_window, o.logit_cap, call.partition_size,
            call.return_lse, q.device, current, overrides,
            alignment(*own), aliasing(*own), v.data_ptr() == k.data_ptr(),
            config.values(_DECODE_KNOBS_KEY))


def decode_tensors(call) -> dict:
    """The call's own tensors by slot name."""
    o = call.opts
    return {"q": call.q, "out": call.out, "k": call.k_cache, "v": call.v_cache,
            "bt": call.block_table, "lens": call.seq_lens, "k_scale": o.k_scale,
            "v_scale": o.v_scale, "alibi": o.alibi_slopes, "sinks": o.sinks, "err": call.errors}


def decode_recorder(call, q4, out4, lse, ws_ml, ws_o, dummy):
    """A :class:`Recorder` for decode.run's launches (tensors that are one object share a slot:
    the key holds that aliasing)."""
    own = decode_tensors(call)
    own["q"], own["out"] = q4, out4  # the kernels get these views: same data pointers
    slots = {id(t): name for name, t in own.items() if t is not None}
    slots[id(dummy)] = "dummy"
    allocs = {}
    for name, t in (("lse", lse), ("ws_ml", ws_ml), ("ws_o", ws_o)):
        if t is not dummy:
            slots[id(t)] = name
            allocs[name] = (tuple(t.shape), t.dtype)
    return Recorder(slots, allocs, {"dummy": dummy})


# ----------------------------------------------------------------------------------------------
# store_kv (kv_store.run): one launch on a (tokens, KV heads) grid
# ----------------------------------------------------------------------------------------------

def store_key(k, v, k_cache, v_cache, slot_mapping, layout, k_scale, v_scale, current):
    """Everything kv_store.run's launch depends on besides the data and the token count (the
    grid's first dimension only: no argument, no specialisation depends on it)."""
    own = (k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return ("store_kv", k.shape[1:], k.stride(), k.dtype, v.stride(), v.dtype, k_cache.shape,
            k_cache.stride(), k_cache.dtype, v_cache.shape, v_cache.stride(), v_cache.dtype,
            slot_mapping.dtype, slot_mapping.stride(), layout, k.device, current,
            alignment(*own), aliasing(*own), config.values(_STORE_KNOBS_KEY))


_STORE_KNOBS_KEY = config.names("TRITON_INTERPRET")


def store_tensors(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale) -> dict:
    return {"k": k, "v": v, "kc": k_cache, "vc": v_cache, "slots": slot_mapping,
            "k_scale": k_scale, "v_scale": v_scale}


def store_recorder(tensors: dict, dummy):
    slots = {id(t): name for name, t in tensors.items() if t is not None}
    slots[id(dummy)] = "dummy"
    return Recorder(slots, {}, {"dummy": dummy})


def bound_params(jf, args, kwargs) -> dict:
    """{parameter: value} of a launch, in the kernel's parameter order with defaults applied:
    ``JITFunction.run``'s own binder (triton 3.6: the last of ``device_caches[device]``)."""
    from triton.runtime.driver import driver
    binder = jf.device_caches[driver.active.get_current_device()][4]
    return binder(*args, **kwargs)[0]


def launch(rec, jf, grid, *args, **kwargs):
    """``jf[grid](*args, **kwargs)``, recorded into ``rec`` when it is not None."""
    kernel = jf[grid](*args, **kwargs)
    if rec is not None:
        rec.add(jf, kernel, grid, args, kwargs)
    return kernel
