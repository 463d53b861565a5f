"""Per-kernel GPU time of one paged_decode call (torch.profiler, CUDA activity), per shape.

usage: python3 scripts/decode_profile.py [--shapes 0,1] [--combines "8,1;16,1"] [--block 16]
       [--configs "BLOCK_N,WARPS,STAGES;..."]
Prints, per shape and split-combine config, the mean device time of each kernel of the call
(decode vs combine), so a slow shape can be attributed before anything is changed.
"""
import argparse
import itertools
import os

import torch
from torch.profiler import ProfilerActivity, profile

import pagedattn as pa
from bench.bench_decode import D, _case
from scripts.decode_sweep import SHAPES


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="0,1")
    ap.add_argument("--combines", default="")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--heads", default="32/8")
    ap.add_argument("--configs", default="", help="PAGEDATTN_DECODE_CONFIG values, ';'-separated")
    a = ap.parse_args()
    hq, hkv = (int(x) for x in a.heads.split("/"))
    d, bs = D, a.block
    gen = torch.Generator(device="cuda").manual_seed(0)
    for i in (int(x) for x in a.shapes.split(",")):
        b, ctx = SHAPES[i]
        q, kc, vc, table, lens = _case(b, ctx, hq, hkv, bs, torch.bfloat16, "cuda", gen)
        nblk = kc.shape[0]
        out = torch.empty_like(q)
        for comb, cfg in itertools.product(a.combines.split(";") if a.combines else [""],
                                           a.configs.split(";") if a.configs else [""]):
            if comb:
                os.environ["PAGEDATTN_DECODE_COMBINE"] = comb
            if cfg:
                os.environ["PAGEDATTN_DECODE_CONFIG"] = cfg
            plan = pa.plan_decode(table, lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                                  block_size=bs, num_blocks=nblk, q_dtype=torch.bfloat16,
                                  backend="triton")
            for _ in range(5):
                pa.run_decode(plan, q, kc, vc, out=out)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    pa.run_decode(plan, q, kc, vc, out=out)
                torch.cuda.synchronize()
            rows = []
            for e in prof.key_averages():
                t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
                if t > 0:
                    rows.append((e.key[:40], e.count, t / max(e.count, 1)))
            desc = ", ".join(f"{k} x{n}: {us:.1f} us"
                             for k, n, us in sorted(rows, key=lambda r: -r[2]))
            print(f"B={b} ctx={ctx} combine {comb or 'default'} config {cfg or 'default'}: "
                  f"{desc}", flush=True)
        os.environ.pop("PAGEDATTN_DECODE_COMBINE", None)
        os.environ.pop("PAGEDATTN_DECODE_CONFIG", None)
        del kc, vc


if __name__ == "__main__":
    main()
