"""HIP fast-path benchmark (issue 6): the ``hip`` backend beside ``triton``, % of ceilings.

* decode: the Triton decode benchmark's shapes (Hq/Hkv 32/8 and 32/32, D 128, bf16, block 16
  and 64, (batch, ctx) in (1, 32768), (8, 8192), (64, 4096), (256, 2048), (128, 512)), layout
  bhsd. bytes = K + V read + q read + out written; GB/s and the fraction of the read bandwidth
  measured in the same run (bench.common.measure_ceilings).
* KV-head grid vs Q-head grid (reference §5.2.3) on GQA 32/8: the same kernel launched one
  block per KV head (every KV tile read once for the 4 query heads) or one block per query head
  (the upstream v1/v2 grid: each KV tile read 4 times). Bytes are the KV bytes each grid reads
  from memory (L2 may absorb part of the Q-grid's re-reads: time is the measured truth).
* extend: (batch, prefix, new) in (1, 0, 8192), (4, 4096, 1024), (16, 1024, 512),
  (32, 2048, 128), Hq/Hkv 32/8, D 128, block 16, causal. FLOPs = 4 * Hq * D * (visible
  keys summed over queries); TFLOP/s and the fraction of the measured bf16 matmul rate.

Time: median of CUDA-event timings with a cold L2 (bench.common.time_fn). Every part is in
try/except: a failure becomes a note in the table. Usage:
``python -m bench.bench_hip [--quick] [--out DIR]``.
"""
import argparse
import math
import sys
import time
import traceback

DECODE_SHAPES = [(1, 32768), (8, 8192), (64, 4096), (256, 2048), (128, 512)]
DECODE_HEADS = [(32, 8), (32, 32)]
BLOCKS = [16, 64]
EXTEND_SHAPES = [(1, 0, 8192), (4, 4096, 1024), (16, 1024, 512), (32, 2048, 128)]
D = 128


def _paged_cache(batch, ctx, hkv, bs, dtype, gen):
    import torch
    pages = math.ceil(ctx / bs)
    num_blocks = batch * pages + 1
    k = torch.randn(num_blocks, hkv, bs, D, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    perm = torch.randperm(num_blocks - 1, generator=gen)[: batch * pages] + 1
    table = perm.view(batch, pages).to(torch.int32).cuda()
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    return k, v, table, lens


def _fmt_err(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:80]}" if str(e) else type(e).__name__


def bench_decode(C, ceilings, quick):
    import pandas as pd
    import torch

    import pagedattn as pa
    from pagedattn import hip_kernels as H

    rows, notes = [], []
    gen = torch.Generator().manual_seed(0)
    shapes = DECODE_SHAPES[1:3] if quick else DECODE_SHAPES
    blocks = BLOCKS[:1] if quick else BLOCKS
    for (hq, hkv) in DECODE_HEADS:
        for bs in blocks:
            for batch, ctx in shapes:
                row = {"Hq/Hkv": f"{hq}/{hkv}", "block": bs, "batch": batch, "ctx": ctx}
                try:
                    k, v, table, lens = _paged_cache(batch, ctx, hkv, bs, torch.bfloat16, gen)
                    q = torch.randn(batch, hq, D, dtype=torch.bfloat16, device="cuda")
                    out = torch.empty_like(q)
                    kv_bytes = 2 * batch * ctx * hkv * D * 2
                    nbytes = kv_bytes + 2 * q.numel() * 2
                    row["MB"] = nbytes / 1e6
                    fns = {"hip": lambda: H.decode_raw(q, k, v, table, lens, out)}
                    if hq != hkv:
                        fns["hip_qgrid"] = lambda: H.decode_raw(q, k, v, table, lens, out,
                                                                q_head_grid=True)
                    fns["triton"] = lambda: pa.paged_decode(q, k, v, table, lens, out=out,
                                                            backend="triton", validate=False)
                    for name, fn in fns.items():
                        try:
                            t = C.time_fn(fn, device="cuda", rep=10 if quick else 30)
                            row[f"{name}_us"] = t * 1e6
                            row[f"{name}_GBps"] = nbytes / t / 1e9
                        except Exception as e:  # noqa: BLE001
                            row[f"{name}_us"] = float("nan")
                            notes.append(f"{name} {row['Hq/Hkv']} b{bs} {batch}x{ctx}: {_fmt_err(e)}")
                    row["hip_frac"] = row.get("hip_GBps", float("nan")) / ceilings["read_GBps"]
                    row["triton_frac"] = row.get("triton_GBps", float("nan")) / ceilings["read_GBps"]
                    row["hip/triton"] = row.get("triton_us", float("nan")) / row.get("hip_us", float("nan"))
                    if "hip_qgrid_us" in row:
                        g = hq // hkv
                        row["qgrid_MB"] = (g * kv_bytes + 2 * q.numel() * 2) / 1e6
                        row["kvgrid_speedup"] = row["hip_qgrid_us"] / row["hip_us"]
                    del k, v
                    torch.cuda.empty_cache()
                except Exception as e:  # noqa: BLE001
                    notes.append(f"decode {row}: {_fmt_err(e)}")
                rows.append(row)
    return pd.DataFrame(rows), notes


def bench_extend(C, ceilings, quick):
    import pandas as pd
    import torch

    import pagedattn as pa

    rows, notes = [], []
    gen = torch.Generator().manual_seed(1)
    hq, hkv, bs = 32, 8, 16
    for batch, prefix, new in (EXTEND_SHAPES[2:3] if quick else EXTEND_SHAPES):
        row = {"batch": batch, "prefix": prefix, "new": new}
        try:
            ctx = prefix + new
            k, v, table, lens = _paged_cache(batch, ctx, hkv, bs, torch.bfloat16, gen)
            q = torch.randn(batch * new, hq, D, dtype=torch.bfloat16, device="cuda")
            cu = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * new
            out = torch.empty_like(q)
            visible = batch * (new * prefix + new * (new + 1) // 2)
            flops = 4 * hq * D * visible
            row["GFLOP"] = flops / 1e9
            for name in ("hip", "triton"):
                try:
                    fn = lambda name=name: pa.extend_attention(  # noqa: E731
                        q, k, v, table, cu, lens, backend=name, out=out, max_q_len=new,
                        validate=False)
                    t = C.time_fn(fn, device="cuda", rep=5 if quick else 20)
                    row[f"{name}_ms"] = t * 1e3
                    row[f"{name}_TFLOPs"] = flops / t / 1e12
                    row[f"{name}_frac"] = flops / t / 1e12 / ceilings["matmul_TFLOPs"]
                except Exception as e:  # noqa: BLE001
                    row[f"{name}_ms"] = float("nan")
                    notes.append(f"{name} extend {batch}x({prefix}+{new}): {_fmt_err(e)}")
            del k, v
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001
            notes.append(f"extend {row}: {_fmt_err(e)}")
        rows.append(row)
    return pd.DataFrame(rows), notes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench.bench_hip", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="two decode shapes, one extend shape")
    ap.add_argument("--out", default="results", help="directory for .md/.csv/.json tables")
    a = ap.parse_args(argv)
    import torch

    from bench import common as C

    if not torch.cuda.is_available():
        print("bench_hip: needs a GPU; skipped", flush=True)
        return 0
    t0 = time.perf_counter()
    try:
        from pagedattn.hip_kernels import build
        tb = time.perf_counter()
        build.load()
        print(f"bench_hip: hip backend ready in {time.perf_counter() - tb:.1f} s", flush=True)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        print(f"bench_hip: hip backend unavailable ({_fmt_err(e)}); skipped", flush=True)
        return 0
    ceilings = C.measure_ceilings("cuda", quick=a.quick)
    header = C.results_header(device="cuda", ceilings=ceilings)
    for name, fn, title in (("hip_decode", bench_decode, "HIP paged decode vs Triton (bf16, D 128)"),
                            ("hip_extend", bench_extend, "HIP extend vs Triton (bf16, 32/8, D 128, block 16)")):
        try:
            df, notes = fn(C, ceilings, a.quick)
            print(C.write_table(df, a.out, name, title=title, header=header, notes=notes),
                  flush=True)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
    print(f"bench_hip: done in {C.elapsed(t0)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
