"""Launch the HIP decode on one shape a few times (a driver for ncu; not a test).

usage: python scripts/hip_prof_case.py BATCH CTX [HQ HKV]   (bf16, D 128, page 16, bhsd)
"""
import math
import sys

import torch

from pagedattn import hip_kernels as H

batch, ctx = int(sys.argv[1]), int(sys.argv[2])
hq, hkv = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (32, 8)
bs, d = 16, 128
gen = torch.Generator().manual_seed(0)
pages = math.ceil(ctx / bs)
k = torch.randn(batch * pages + 1, hkv, bs, d, dtype=torch.bfloat16, device="cuda")
v = torch.randn_like(k)
table = (torch.randperm(batch * pages, generator=gen) + 1).view(batch, pages).int().cuda()
lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
q = torch.randn(batch, hq, d, dtype=torch.bfloat16, device="cuda")
out = torch.empty_like(q)
for _ in range(6):
    H.decode_raw(q, k, v, table, lens, out)
torch.cuda.synchronize()
print("ok", float(out.float().abs().mean()))
