"""Sweep the block count of the persistent NVIDIA HIP decode (H200 A/B; not a test).

For each decode shape: the Triton decode and the HIP decode launched with grid_blocks = k x the
resident slots (k = 1: one wave, each block a long run of items) up to one block per work item
(the pre-persistent launch). µs per call from CUDA graphs of 10 calls (bench.common.time_fn);
the bits are the same for every block count (tests/test_hip_backend.py).

usage: python scripts/hip_grid_sweep.py [--mults 1,2,4,8,16,0] [--shapes all|issue|ab|quick]
       (0 = one block per item)
"""
import argparse
import inspect
import math

import torch

import pagedattn as pa
from bench.common import time_fn
from pagedattn import hip_kernels as H

ISSUE = [(b, c, 32, 8) for b, c in [(1, 32768), (8, 8192), (64, 4096), (256, 2048), (128, 512)]]
ISSUE += [(8, 8192, 32, 32), (128, 512, 32, 32), (1, 32768, 32, 32)]
AB = [(b, c, 32, 8) for b, c in [(1, 4096), (8, 4096), (32, 2048), (64, 8192), (128, 1024),
                                 (16, 32768)]]


HAS_BLOCKS = "grid_blocks" in inspect.signature(H.decode_raw).parameters


def case(batch, ctx, hq, hkv, bs=16, d=128, gen=None):
    pages = math.ceil(ctx / bs)
    nblocks = batch * pages + 1
    k = torch.randn(nblocks, hkv, bs, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    perm = torch.randperm(nblocks - 1, generator=gen)[: batch * pages] + 1
    table = perm.view(batch, pages).to(torch.int32).cuda()
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, hq, d, dtype=torch.bfloat16, device="cuda")
    return q, k, v, table, lens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mults", default="1,2,4,8,16,0")
    ap.add_argument("--shapes", default="all", choices=["all", "issue", "ab", "quick"])
    a = ap.parse_args()
    mults = [int(x) for x in a.mults.split(",")]
    quick = [AB[0], AB[1], AB[3], ISSUE[4], ISSUE[0]]
    shapes = {"all": ISSUE + AB, "issue": ISSUE, "ab": AB, "quick": quick}[a.shapes]
    slots = 2 * torch.cuda.get_device_properties(0).multi_processor_count  # D 128: 2 per SM
    gen = torch.Generator().manual_seed(0)
    print(f"resident slots (D 128, 2 blocks per SM): {slots}")
    print("shape | triton us | " + " | ".join(f"hip x{m}" if m else "hip per-item" for m in mults))
    for batch, ctx, hq, hkv in shapes:
        q, k, v, table, lens = case(batch, ctx, hq, hkv, gen=gen)
        out = torch.empty_like(q)
        t_tri = time_fn(lambda: pa.paged_decode(q, k, v, table, lens, backend="triton", out=out,
                                                validate=False),
                        device="cuda", cuda_graph=True, graph_calls=10, rep=50) * 1e6
        cells = []
        for m in mults:
            blocks = m * slots if m else 1 << 30
            kw = {"grid_blocks": blocks} if HAS_BLOCKS else {}  # older trees: one block per item
            t = time_fn(lambda: H.decode_raw(q, k, v, table, lens, out, **kw),
                        device="cuda", cuda_graph=True, graph_calls=10, rep=50) * 1e6
            cells.append(f"{t:.1f} ({t_tri / t:.2f})")
        print(f"B{batch} L{ctx} {hq}/{hkv} | {t_tri:.1f} | " + " | ".join(cells), flush=True)
        del q, k, v, table, lens, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
