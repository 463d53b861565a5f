import sys
import fi_boot
from fi_boot import jit, jit_env
import torch
from flashinfer.jit.attention.modules import gen_batch_prefill_module, get_batch_prefill_uri
args = (torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32, 128, 128, 0, False, False, False)
specs = {b: gen_batch_prefill_module(b, *args) for b in ("fa2", "fa3")}
for b, s in specs.items():
    print(b, s.name, s.aot_path, s.jit_library_path)
    s.write_ninja()
    print(open(s.ninja_path).read()[:3000] if "-v" in sys.argv else "")
if "build" in sys.argv:
    for b in sys.argv[sys.argv.index("build")+1:]:
        print("building", b, flush=True)
        specs[b].build(verbose=True)
        print("done", b, flush=True)
