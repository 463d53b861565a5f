# CUDA-core decode module (BatchDecodeWithPagedKVCacheWrapper(..., use_tensor_cores=False)).
# decode.py plan() -> get_batch_decode_module(q, kv, o, indptr.dtype, 128, 128, posenc 0,
#   window_left != -1 -> False, logits_soft_cap > 0 -> False)
import sys
import fi_boot
from fi_boot import jit, jit_env
import torch
from flashinfer.jit.attention.modules import gen_batch_decode_module
args = (torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32, 128, 128, 0, False, False)
s = gen_batch_decode_module(*args)
print(s.name, s.aot_path, s.jit_library_path)
s.write_ninja()
if "-v" in sys.argv:
    print(open(s.ninja_path).read()[:4000])
if "build" in sys.argv:
    print("building", flush=True)
    s.build(verbose=True)
    print("done", flush=True)
