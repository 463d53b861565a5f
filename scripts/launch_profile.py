"""Host cost of one eager decode call, split into its parts (H200 diagnostic).

For each case, wall time per call of N back-to-back calls (host-bound: the kernels are short):

* ``paged_decode`` (validate=False) and ``run_decode`` with a plan, each with launch replay (the
  default, ``triton_kernels/_replay.py``) and without (``PAGEDATTN_LAUNCH_REPLAY=0``);
* without replay, every Triton launch the call makes, replayed alone through
  ``JITFunction.run`` (binding, specialisation, cache lookup, launch), and its parts: the binder
  alone, and the compiled kernel's launcher alone (``CompiledKernel.run`` with the bound
  arguments: the floor);
* ours = ``paged_decode`` without replay minus those launches (checks, dispatch, our launcher).

Usage: python scripts/launch_profile.py [--profile]  (--profile: cProfile top entries too)
"""
import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.runtime import jit as _jit  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

import pagedattn as pa  # noqa: E402
from pagedattn.bench.decode import _case  # noqa: E402

CASES = [  # name, (batch, ctx, Hq, Hkv, block)
    ("32/8 split (Triton kernel)", (1, 4096, 32, 8, 16)),
    ("32/32 split (Gluon kernel)", (1, 4096, 32, 32, 16)),
    ("32/8 one pass (Triton)", (64, 256, 32, 8, 16)),
    ("32/8 p64 one pass (Gluon)", (64, 256, 32, 8, 64)),
]


def per_call_us(fn, n=400):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def record_launches(fn):
    """The (JITFunction, args, kwargs, grid) of every Triton launch one call of fn makes."""
    seen, orig = [], _jit.JITFunction.run

    def rec(self, *args, grid, warmup, **kwargs):
        seen.append((self, args, dict(kwargs), grid))
        return orig(self, *args, grid=grid, warmup=warmup, **kwargs)

    _jit.JITFunction.run = rec
    try:
        fn()
    finally:
        _jit.JITFunction.run = orig
    return seen


def launch_parts(jf, args, kwargs, grid):
    """us per call: the whole JITFunction.run, its binder, the compiled launcher alone."""
    whole = per_call_us(lambda: jf.run(*args, grid=grid, warmup=False, **kwargs))
    dev = driver.active.get_current_device()
    kw = dict(kwargs, debug=kwargs.get("debug", jf.debug) or False)
    kw["instrumentation_mode"] = _jit.knobs.compilation.instrumentation_mode
    binder = jf.device_caches[dev][4]
    bind = per_call_us(lambda: binder(*args, **kw))
    kernel = jf.run(*args, grid=grid, warmup=False, **kwargs)
    bound = tuple(binder(*args, **kw)[0].values())
    stream = driver.active.get_current_stream(dev)
    g = tuple(grid) + (1, 1)

    def direct():
        kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata, None, None,
                   None, *bound)

    floor = per_call_us(direct)
    return whole, bind, floor


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"# host cost per eager decode call, us ({torch.cuda.get_device_name()}, torch "
          f"{torch.__version__}, triton {triton.__version__})")
    x = torch.zeros(16, device="cuda")
    print(f"one torch launch (x.add_): {per_call_us(lambda: x.add_(0)):.1f}")
    for name, (batch, ctx, hq, hkv, bs) in CASES:
        q, k, v, table, lens = _case(batch, ctx, hq, hkv, bs, torch.bfloat16, "cuda", gen)
        out = torch.empty_like(q)
        call = lambda: pa.paged_decode(q, k, v, table, lens, backend="triton", out=out,  # noqa
                                       validate=False)
        plan = pa.plan_decode(table, lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=128,
                              block_size=bs, num_blocks=k.shape[0], q_dtype=torch.bfloat16,
                              backend="triton")
        fast = per_call_us(call)
        fast_planned = per_call_us(lambda: pa.run_decode(plan, q, k, v, out=out))
        os.environ["PAGEDATTN_LAUNCH_REPLAY"] = "0"
        total = per_call_us(call)
        planned = per_call_us(lambda: pa.run_decode(plan, q, k, v, out=out))
        launches = record_launches(call)
        parts = [launch_parts(*x) for x in launches]
        whole = sum(p[0] for p in parts)
        print(f"{name}: replay: paged_decode {fast:.1f} | run_decode {fast_planned:.1f}; "
              f"without: paged_decode {total:.1f} | run_decode {planned:.1f} | "
              f"ours {total - whole:.1f} | launches {len(parts)}:")
        for (jf, a, kw, grid), (w, b, f) in zip(launches, parts):
            print(f"    {jf.fn.__name__:16s} grid "
                  f"{tuple(grid)} args {len(a) + len(kw):3d}: run {w:6.1f} | binder {b:6.1f} | "
                  f"compiled launcher {f:6.1f}")
        os.environ.pop("PAGEDATTN_LAUNCH_REPLAY")
        if args.profile:  # the default path (replay)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(200):
                call()
            prof.disable()
            torch.cuda.synchronize()
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    store_kv_costs()


def store_kv_costs():
    """us per store_kv call (bf16 cache, 8 KV heads, D 128; the kernel is ~2-5 us)."""
    kc, vc = pa.make_kv_cache(4096, 16, 8, 128, dtype=torch.bfloat16, device="cuda")
    for t in (8, 1024):
        k = torch.randn(t, 8, 128, dtype=torch.bfloat16, device="cuda")
        slots = torch.randperm(4096 * 16, device="cuda")[:t]
        call = lambda: pa.store_kv(k, k, kc, vc, slots, validate=False)  # noqa: E731
        fast = per_call_us(call)
        os.environ["PAGEDATTN_LAUNCH_REPLAY"] = "0"
        slow = per_call_us(call)
        os.environ.pop("PAGEDATTN_LAUNCH_REPLAY")
        print(f"store_kv {t} tokens: replay {fast:.1f} | without {slow:.1f}")


if __name__ == "__main__":
    main()
