"""A/B of HIP decode launch shapes on the issue's decode shapes, from CUDA graphs (GPU only).

Each variant is NAME=ENV[,ENV...] (environment set while that variant is captured and timed),
e.g. ``auto= split1=PAGEDATTN_HIP_DECODE_MODE=split,PAGEDATTN_HIP_DECODE_PPP=1``; a value may hold
commas (``triton_t32=PAGEDATTN_DECODE_CONFIG=32,4,3``). Names starting with ``triton`` time the
Triton backend (the yardstick), the others HIP; a HIP variant that sets a Triton decode knob
(``PAGEDATTN_DECODE_*``) is refused: it would time HIP unchanged. Prints one row per shape:
microseconds per variant and each variant's speed relative to the first (medians of --rounds
timings taken in rotated order, 3 by default). Outputs are not compared here (the GPU tests do).

Usage: python scripts/hip_decode_ab.py [--quick] [--heads 64/1,48/2] [--blocks 16,32]
[--kv e5m2] [--shapes "B,CTX;..."] [--csv PATH]
[--label L] VARIANT [VARIANT ...]
"""
import argparse
import re
import statistics
import sys
from pathlib import Path

# after PYTHONPATH: an A/B tree may shadow the package
sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench.bench_decode import (BLOCKS, HEADS, SHAPES, _bench_graph, _case, _ours,  # noqa: E402
                                _with_env)

KV_DTYPES = {"bf16": "bfloat16", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def _variants(specs):
    out = []
    for spec in specs:
        name, _, env = spec.partition("=")
        # NAME=value pairs split at the commas that start the next upper-case NAME=
        pairs = dict(re.findall(r"([A-Z_][A-Z0-9_]*)=(.*?)(?=,[A-Z_][A-Z0-9_]*=|$)", env))
        knobs = [k for k in pairs if k.startswith("PAGEDATTN_DECODE_")]
        if knobs and not name.startswith("triton"):
            raise SystemExit(f"variant {name!r} times the HIP backend but sets Triton knobs "
                             f"{knobs}: name it triton_...")
        out.append((name, pairs))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="32/8, block 16 only")
    ap.add_argument("--label", default="", help="printed in the header (e.g. a commit)")
    ap.add_argument("--heads", default=None,
                    help="Hq/Hkv pairs, comma-separated (default: the issue's 32/8 and 32/32)")
    ap.add_argument("--blocks", default=None,
                    help="block sizes, comma-separated (default: the issue's 16 and 64)")
    ap.add_argument("--kv", default="bf16", choices=sorted(KV_DTYPES),
                    help="cache dtype (fp8: the bf16 cache cast, per-head scales 0.5)")
    ap.add_argument("--shapes", default=None,
                    help="(batch, ctx) pairs 'B,CTX;...' (default: the issue's five)")
    ap.add_argument("--csv", default=None, help="also write the table here")
    ap.add_argument("--rounds", type=int, default=3,
                    help="timings per variant, in rotated order; the table shows medians")
    ap.add_argument("variants", nargs="+")
    args = ap.parse_args(argv)
    import torch

    variants = _variants(args.variants)
    gen = torch.Generator(device="cuda").manual_seed(0)
    heads, blocks = (HEADS[:1], BLOCKS[:1]) if args.quick else (HEADS, BLOCKS)
    if args.heads:
        heads = [tuple(int(x) for x in pair.split("/")) for pair in args.heads.split(",")]
    if args.blocks:
        blocks = [int(x) for x in args.blocks.split(",")]
    shapes = SHAPES if not args.shapes else [
        tuple(int(x) for x in pair.split(",")) for pair in args.shapes.split(";")]
    rows = []
    names = [n for n, _ in variants]
    kv_dtype = getattr(torch, KV_DTYPES[args.kv])
    print(f"# HIP decode A/B {args.label} (KV {args.kv}): us per call from CUDA graphs, median of "
          f"{args.rounds} rounds in rotated order; x = first / this")
    print("| Hq/Hkv | block | (batch, ctx) | " + " | ".join(names) + " | "
          + " | ".join(f"x {n}" for n in names[1:]) + " |")
    print("|" + "---|" * (3 + 2 * len(names) - 1))
    for hq, hkv in heads:
        for bs in blocks:
            for batch, ctx in shapes:
                q, k, v, table, lens = _case(batch, ctx, hq, hkv, bs, torch.bfloat16, "cuda", gen)
                scale = None
                if kv_dtype != torch.bfloat16:
                    k, v = k.to(kv_dtype), v.to(kv_dtype)
                    scale = torch.full((hkv,), 0.5, dtype=torch.float32, device="cuda")
                out = torch.empty_like(q)
                runs = [[] for _ in variants]
                for rnd in range(args.rounds):  # rotated order: a slow spell hits every variant
                    for i in ((j + rnd) % len(variants) for j in range(len(variants))):
                        name, env = variants[i]
                        backend = "triton" if name.startswith("triton") else "hip"
                        try:  # the variant's environment is set around every call (capture too)
                            runs[i].append(_bench_graph(_with_env(
                                _ours(q, k, v, table, lens, out, backend, scale), **env)))
                        except Exception as e:  # noqa: BLE001
                            print(f"  {name}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                            runs[i].append(float("nan"))
                times = [statistics.median(r) for r in runs]
                ratios = [times[0] / t for t in times[1:]]
                rows.append(dict(Hq=hq, Hkv=hkv, block=bs, batch=batch, ctx=ctx, kv=args.kv,
                                 **{f"{n}_graph_us": round(t, 1) for n, t in zip(names, times)}))
                print(f"| {hq}/{hkv} | {bs} | ({batch}, {ctx}) | "
                      + " | ".join(f"{t:.1f}" for t in times) + " | "
                      + " | ".join(f"{r:.3f}" for r in ratios) + " |", flush=True)
                del q, k, v, table, lens, out
                torch.cuda.empty_cache()
    if args.csv:
        import pandas as pd
        pd.DataFrame(rows).to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
