#!/usr/bin/env bash
# Session-5 probe (one device call): extend per-program cost model, ncu of extend and decode.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
pack() { tar czf "$TOP/results.tgz" -C "$O" . 2>/dev/null; }
trap pack EXIT
timeout 120 python3 scripts/extend_cost_model.py --batch 32 --new 128 2>&1 | tee $O/extend_cost_new128.log
timeout 90 python3 scripts/extend_cost_model.py --batch 8 --new 512 --prefixes 0,512,1024,2048,4096 2>&1 | tee $O/extend_cost_new512.log
cat > /tmp/drv.py <<'PY'
import sys, torch
from bench.bench_extend import make_inputs, run_triton
import pagedattn as pa
what = sys.argv[1]
if what == "extend":
    b, p, n = (int(v) for v in sys.argv[2].split(","))
    x = make_inputs(b, p, n, "cuda", torch.bfloat16); fn = run_triton(x, n, "cache")
else:
    from bench.bench_decode import _case
    b, ctx = (int(v) for v in sys.argv[2].split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, kc, vc, table, lens = _case(b, ctx, 32, 8, 16, torch.bfloat16, "cuda", gen)
    out = torch.empty_like(q)
    fn = lambda: pa.paged_decode(q, kc, vc, table, lens, backend="triton", out=out)
for _ in range(6): fn()
torch.cuda.synchronize()
PY
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
for shp in 32,2048,128 1,0,8192; do
  timeout 120 ncu --clock-control none --kernel-name regex:_extend --launch-skip 4 --launch-count 1 $S python3 /tmp/drv.py extend $shp > $O/ncu_extend_$shp.txt 2>&1; tail -60 $O/ncu_extend_$shp.txt | grep -E "Duration|Throughput|Busy|Warp Cycles|Issued|Occupancy|Stall|Registers|Eligible|One or More" | head -30
done
timeout 120 ncu --clock-control none --kernel-name regex:_decode_kernel --launch-skip 4 --launch-count 1 $S python3 /tmp/drv.py decode 1,32768 > $O/ncu_decode_1_32768.txt 2>&1; grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers" $O/ncu_decode_1_32768.txt | head
