"""Launch a decode backend on one shape a few times (a driver for ncu; not a test).

usage: python scripts/hip_prof_case.py BATCH CTX [HQ HKV [BACKEND]]   (bf16, D 128, page 16,
bhsd; BACKEND hip (default) or triton)
"""
import sys

import torch

from bench.bench_decode import _case
import pagedattn as pa
from pagedattn import hip_kernels as H

batch, ctx = int(sys.argv[1]), int(sys.argv[2])
hq, hkv = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (32, 8)
backend = sys.argv[5] if len(sys.argv) > 5 else "hip"
gen = torch.Generator(device="cuda").manual_seed(0)
q, k, v, table, lens = _case(batch, ctx, hq, hkv, 16, torch.bfloat16, "cuda", gen)
out = torch.empty_like(q)
for _ in range(6):
    if backend == "hip":
        H.decode_raw(q, k, v, table, lens, out)
    else:
        pa.paged_decode(q, k, v, table, lens, backend=backend, out=out, validate=False)
torch.cuda.synchronize()
print("ok", float(out.float().abs().mean()))
