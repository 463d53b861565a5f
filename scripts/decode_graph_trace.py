"""Where the time of a graph-replayed paged_decode call goes (GPU only): kernel spans and gaps.

A CUDA graph of 10 calls (how engines run decode, and how bench_decode times it) is replayed
under torch.profiler; per call, from the CUPTI kernel records: the decode kernel's span, the
combine kernel's span, the gap from the decode's end to the combine's end, and the gap from the
previous call's last kernel to this call's decode start. Medians over the replayed calls.

usage: python3 scripts/decode_graph_trace.py [--shapes "1,32768;8,8192"] [--heads 32/8]
       [--blocks 16,64] [--backends triton,hip]
"""
import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

import pagedattn as pa
from bench.bench_decode import _case


def _kernels(prof):
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
           and e.time_range.elapsed_us() > 0 and "Memcpy" not in e.name]
    return sorted(((e.time_range.start, e.time_range.end, e.name) for e in evs))


def trace(batch, ctx, hq, hkv, block, backend="triton", calls=10, replays=5):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, kc, vc, table, lens = _case(batch, ctx, hq, hkv, block, torch.bfloat16, "cuda", gen)
    out = torch.empty_like(q)

    def call():
        pa.paged_decode(q, kc, vc, table, lens, backend=backend, out=out, validate=False)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            call()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
    ks = _kernels(prof)
    dec = [k for k in ks if "decode" in k[2] and "combine" not in k[2]]
    rows = {"decode": [], "combine": [], "decode end -> call end": [], "launch gap": [],
            "call": []}
    prev_end = 0.0
    for i, d in enumerate(dec):
        nxt = dec[i + 1][0] if i + 1 < len(dec) else None
        comb = [k for k in ks if "combine" in k[2] and d[0] <= k[0] and (nxt is None
                                                                          or k[0] < nxt)]
        end = max([d[1]] + [c[1] for c in comb])
        rows["decode"].append(d[1] - d[0])
        if comb:
            rows["combine"].append(comb[0][1] - comb[0][0])
        rows["decode end -> call end"].append(end - d[1])
        if i > 0 and i % calls:  # within one replay: the previous call's end to this start
            rows["launch gap"].append(d[0] - prev_end)
            rows["call"].append(end - prev_end + 0.0)
        prev_end = end
    names = sorted({k[2][:60] for k in ks})
    return {k: statistics.median(v) if v else float("nan") for k, v in rows.items()}, names


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1,32768;8,8192")
    ap.add_argument("--heads", default="32/8")
    ap.add_argument("--blocks", default="16,64")
    ap.add_argument("--backends", default="triton")
    a = ap.parse_args()
    hq, hkv = (int(x) for x in a.heads.split("/"))
    print("| backend | heads | block | batch | ctx | decode us"
          " | combine span us (PDL: starts early, waits) | decode end -> call end us"
          " | launch gap us | call us (gap + span) | kernels |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in a.shapes.split(";"):
        b, ctx = (int(x) for x in shape.split(","))
        for bs, be in ((int(x), be) for x in a.blocks.split(",")
                       for be in a.backends.split(",")):
            r, names = trace(b, ctx, hq, hkv, bs, be)
            print(f"| {be} | {hq}/{hkv} | {bs} | {b} | {ctx} | {r['decode']:.2f}"
                  f" | {r['combine']:.2f} | {r['decode end -> call end']:.2f}"
                  f" | {r['launch gap']:.2f} | {r['call']:.2f} | {', '.join(names)} |",
                  flush=True)


if __name__ == "__main__":
    main()
