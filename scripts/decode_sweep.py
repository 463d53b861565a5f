"""Sweep the Triton decode launch on the H200 shapes: (BLOCK_N, warps, stages) x partition size,
timed eagerly and from a CUDA graph (engines replay decode from graphs).

usage: python3 scripts/decode_sweep.py [block_size] [--quick] [--configs "BN,W,S;..."]
       [--partitions 256,512] [--modes split,one_pass] [--shapes 0,1] [--heads 32/8]
"""
import argparse
import itertools
import os

import torch
import triton

import pagedattn as pa
from bench.bench_decode import D, _bench_graph, _case
from bench.read_probe import read_ceiling

SHAPES = [(1, 32768), (8, 8192), (64, 4096), (256, 2048), (128, 512), (1, 4096)]  # 5: latency-bound
CONFIGS = [(bn, w, st) for bn, w, st in itertools.product((32, 64, 128), (4, 8), (2, 3, 4))]
PARTITIONS = (128, 256, 512)
MODES = ("split", "one_pass")  # PAGEDATTN_DECODE_MODE: the launch shape (same arithmetic)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("block_size", nargs="?", type=int, default=16)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--configs", default="", help='"BLOCK_N,warps,stages;..."')
    ap.add_argument("--partitions", default="")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--shapes", default="", help="indices into SHAPES")
    ap.add_argument("--heads", default="32/8", help="Hq/Hkv")
    ap.add_argument("--combines", default="", help='split combine "UNROLL,WARPS;..." '
                    "(PAGEDATTN_DECODE_COMBINE; default: the launcher's)")
    a = ap.parse_args()
    dev = "cuda"
    hq, hkv = (int(x) for x in a.heads.split("/"))
    d, bs, quick = D, a.block_size, a.quick
    gen = torch.Generator(device=dev).manual_seed(0)
    configs = [(64, 4, 3), (64, 4, 4), (128, 8, 3), (32, 4, 3)] if quick else CONFIGS
    if a.configs:
        configs = [tuple(int(x) for x in c.split(",")) for c in a.configs.split(";")]
    partitions = (256, 512) if quick else PARTITIONS
    if a.partitions:
        partitions = tuple(int(x) for x in a.partitions.split(","))
    modes = tuple(a.modes.split(","))
    shapes = [SHAPES[int(i)] for i in a.shapes.split(",")] if a.shapes else SHAPES
    bw, how, each = read_ceiling(dev, 4 << 30)
    print(f"read bw {bw / 1e9:.0f} GB/s ({how}; GB/s of each: "
          f"{', '.join(f'{k} {v:.0f}' for k, v in each.items())}); Hq/Hkv {hq}/{hkv}, D {d}, "
          f"block {bs}")
    print("batch ctx mode part cfg eager_us graph_us graph_frac")
    for b, ctx in shapes:
        q, kc, vc, table, lens = _case(b, ctx, hq, hkv, bs, torch.bfloat16, dev, gen)
        nblk = kc.shape[0]
        out = torch.empty_like(q)
        nbytes = 2 * b * ctx * hkv * d * 2
        best = None
        combines = a.combines.split(";") if a.combines else [""]
        for mode, part, cfg, comb in itertools.product(modes, partitions, configs, combines):
            os.environ["PAGEDATTN_DECODE_CONFIG"] = ",".join(map(str, cfg))
            if comb:
                os.environ["PAGEDATTN_DECODE_COMBINE"] = comb
            cfg = cfg + ((f"combine {comb}",) if comb else ())
            os.environ["PAGEDATTN_DECODE_MODE"] = mode
            plan = pa.plan_decode(table, lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                                  block_size=bs, num_blocks=nblk, q_dtype=torch.bfloat16,
                                  partition_size=part, backend="triton")
            f = lambda: pa.run_decode(plan, q, kc, vc, out=out)  # noqa: E731
            try:
                f()
                eager = triton.testing.do_bench(f, return_mode="median") * 1e3
                graph = _bench_graph(f)
            except Exception as e:  # noqa: BLE001
                print(b, ctx, mode, part, cfg, "failed", type(e).__name__, str(e)[:100])
                continue
            frac = nbytes / (graph * 1e-6) / bw
            print(b, ctx, mode, part, cfg, f"{eager:.1f}", f"{graph:.1f}", f"{frac:.3f}",
                  flush=True)
            if best is None or graph < best[2]:
                best = (f"{mode} partition {part}", cfg, graph, frac)
        print(f"BEST B={b} ctx={ctx}: {best[0]} cfg {best[1]} {best[2]:.1f} us "
              f"(graph) = {best[3]:.3f} of read bandwidth", flush=True)
        kc = vc = None  # free the case's cache before the next
    os.environ.pop("PAGEDATTN_DECODE_CONFIG", None)
    os.environ.pop("PAGEDATTN_DECODE_MODE", None)
    os.environ.pop("PAGEDATTN_DECODE_COMBINE", None)


if __name__ == "__main__":
    main()
