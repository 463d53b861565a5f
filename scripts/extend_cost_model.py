"""Where short extends lose: Triton extend time against the prefix length, from CUDA graphs.

usage: python3 scripts/extend_cost_model.py [--batch 32] [--new 128] [--prefixes 0,256,...]

Holds the number of programs fixed (batch x cdiv(new, BLOCK_Q) x Hkv) and grows each program's
key count with the prefix. A straight-line fit of time per wave against KV tiles per program
splits the cost into a per-program part (intercept: prologue, the masked diagonal tile,
epilogue) and a per-tile part (slope), which is what the steady-state loop costs.
"""
import argparse

import torch

from bench import common as C
from bench.bench_extend import D, HKV, HQ, flops, make_inputs, run_triton
from pagedattn.triton_kernels import _extend_configs as EC


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prefixes", default="0,128,256,512,1024,2048,4096")
    a = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    group = HQ // HKV  # a power of 2: the kernel's padded group is the group itself
    cfg = EC.default_config(torch.device("cuda"), D, group, a.new)  # the launcher's tiles
    block_q, block_n = cfg.block_m // group, cfg.block_n
    programs = a.batch * HKV * -(-a.new // block_q)
    waves = programs / sms
    print(f"batch {a.batch}, new {a.new}: {programs} programs on {sms} SMs = {waves:.2f} waves")
    print("prefix tiles_per_prog us us_per_wave TFLOPs")
    pts = []
    for p in (int(x) for x in a.prefixes.split(",")):
        x = make_inputs(a.batch, p, a.new, "cuda", torch.bfloat16)
        t = C.time_fn(run_triton(x, a.new, "cache"), device="cuda", cuda_graph=True,
                      graph_calls=10, rep=20)
        tiles = (p + a.new) / block_n
        per_wave = t * 1e6 / max(1.0, -(-programs // sms))
        pts.append((tiles, per_wave))
        tflops = flops(a.batch, p, a.new) / t / 1e12
        print(f"{p} {tiles:.2f} {t * 1e6:.1f} {per_wave:.2f} {tflops:.1f}", flush=True)
        del x
    n = len(pts)
    mx = sum(u for u, _ in pts) / n
    my = sum(v for _, v in pts) / n
    slope = sum((u - mx) * (v - my) for u, v in pts) / sum((u - mx) ** 2 for u, _ in pts)
    print(f"fit: us per wave = {my - slope * mx:.2f} + {slope:.3f} x tiles per program")


if __name__ == "__main__":
    main()
