"""Which raw pagedattn_hip.paged_decode bad-input call crashes, and when (H200 diagnostic).

Each case runs in its own subprocess; prints the return code and the last lines of output.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests"), ROOT]
from test_hip_backend import HOST_CHECK_SETUP  # noqa: E402  (the test's batch and op handle)

PRE = "import sys\nsys.path[:0] = [%r, %r]\n" % (os.path.join(ROOT, "tests"), ROOT) \
    + HOST_CHECK_SETUP + r"""
def call(q, out):
    try:
        ops.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, out, None, None,
                         None, 0, 0.125, 512, 0)
    except RuntimeError as e:
        print("raised:", str(e).splitlines()[0][:120], flush=True)
    else:
        print("ran", flush=True)
"""
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
