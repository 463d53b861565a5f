"""Which raw pagedattn_hip.paged_decode bad-input call crashes, and when (H200 diagnostic).

Each case runs in its own subprocess; prints the return code and the last lines of output.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRE = r"""
import sys, torch
sys.path[:0] = [%r, %r]
from attn_utils import make_paged_batch
from pagedattn.hip_kernels import build
ops = build.load()
gen = torch.Generator().manual_seed(0)
b = make_paged_batch([20], num_kv_heads=2, head_dim=64, block_size=16, layout="bhsd",
                     dtype=torch.float16, device="cuda", gen=gen)
q = torch.randn(1, 4, 64, generator=gen).to("cuda", torch.float16)
out = torch.empty_like(q)
def call(q, out):
    try:
        ops.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, out, None, None,
                         None, 0, 0.125, 512, 0)
    except RuntimeError as e:
        print("raised:", str(e).splitlines()[0][:120], flush=True)
    else:
        print("ran", flush=True)
""" % (os.path.join(ROOT, "tests"), ROOT)
CASES = {
    "good": "call(q, out)",
    "nqh_slices": "call(q[:, :3], out[:, :3])",
    "good_then_nqh_slices": "call(q, out); torch.cuda.synchronize(); call(q[:, :3], out[:, :3])",
    "nqh_contiguous": "call(q[:, :3].contiguous(), out[:, :3].contiguous())",
    "nqh_q_only": "call(q[:, :3].contiguous(), out)",
    "head_dim": "call(torch.randn(1, 4, 128, device='cuda', dtype=torch.float16), out)",
    "out_shape": "call(q, out[:, :2])",
}
for name, body in CASES.items():
    env = dict(os.environ, TORCH_SHOW_CPP_STACKTRACES="0")
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", PRE + body + "\nprint('END')"],
                       capture_output=True, text=True, env=env, timeout=300)
    tail = (r.stdout + r.stderr).strip().splitlines()[-6:]
    print(f"== {name}: rc {r.returncode}")
    for line in tail:
        print("   ", line[:160])
