"""Kernels, grids and device times of one decode call per backend (torch.profiler's CUDA trace),
beside torch SDPA over contiguous K/V: what a peer launches where it is faster (GPU only).

usage: python3 scripts/kernel_grids.py [--cases "1,32768,32,8;8,8192,32,32"] [--block 16]
       [--backends sdpa,triton,hip]
Per case and backend: every kernel of the call (mean device time over the profiled calls, grid,
block, registers per thread, shared memory per block) and the call's summed kernel time.
"""
import argparse
import collections
import json
import os
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from bench.bench_decode import _case, _ours, _sdpa

CALLS = 5


def _trace(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:  # the trace can be tens of MB: not left behind
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    kernels = collections.OrderedDict()
    for e in events:
        if e.get("cat") != "kernel":
            continue
        a = e.get("args", {})
        k = kernels.setdefault(e["name"], dict(n=0, us=0.0, grid=a.get("grid"),
                                               block=a.get("block"),
                                               regs=a.get("registers per thread"),
                                               smem=a.get("shared memory")))
        k["n"] += 1
        k["us"] += e["dur"]
    return kernels


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="1,32768,32,8;8,8192,32,8;8,8192,32,32")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--backends", default="sdpa,triton,hip")
    a = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    print("| case | backend | kernel | calls | us per call | grid | block | regs | smem |")
    print("|---|---|---|---|---|---|---|---|---|")
    for spec in a.cases.split(";"):
        batch, ctx, hq, hkv = (int(x) for x in spec.split(","))
        q, k, v, table, lens = _case(batch, ctx, hq, hkv, a.block, torch.bfloat16, "cuda", gen)
        out = torch.empty_like(q)
        for be in a.backends.split(","):
            fn = (_sdpa(q, k, v, table, lens, a.block) if be == "sdpa"
                  else _ours(q, k, v, table, lens, out, be))
            total = 0.0
            for name, s in _trace(fn).items():
                per = s["us"] / CALLS
                total += per
                print(f"| {spec} | {be} | {name[:70]} | {s['n']} | {per:.1f} | {s['grid']} | "
                      f"{s['block']} | {s['regs']} | {s['smem']} |")
            print(f"| {spec} | {be} | (sum) | | {total:.1f} | | | | |")


if __name__ == "__main__":
    main()
