"""Session 20 call 3: which condition makes the balanced even-fill GPU tests stall (calls 1-2:
never finished). One eager paged_decode per case, in this process; run each case in its own
process with a timeout. argv: lens kind (fill | long), return_lse (0/1), variant."""
import sys
import time

import torch

import pagedattn as pa
from attn_utils import make_paged_batch

kind, want_lse, variant = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
import os  # noqa: E402
os.environ["PAGEDATTN_DECODE_VARIANT"] = variant
lens = [1536 - 7 * i for i in range(64)] if kind == "fill" else [4096] * 64
hkv = 32 if variant == "auto32" else 8
if variant == "auto32":
    os.environ["PAGEDATTN_DECODE_VARIANT"] = "auto"
gen = torch.Generator().manual_seed(5)
b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=128, block_size=16, layout="bhsd",
                     dtype=torch.bfloat16, device="cuda", gen=gen, exact_capacity=kind == "long")
q = torch.randn(len(lens), 32, 128, generator=gen).to(device="cuda", dtype=torch.bfloat16)
print("table", tuple(b.block_table.shape), flush=True)
for i in range(2):
    t = time.time()
    r = pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout="bhsd",
                        backend="triton", return_lse=want_lse)
    torch.cuda.synchronize()
    print("OK", kind, want_lse, variant, i, round(time.time() - t, 3), flush=True)
