#!/usr/bin/env bash
# Session-7 call 6: swizzled K/V tiles with the shared-memory opt-in fixed: GPU tests; if they
# pass, A/B against the padded rows and the full decode benchmark (else the benchmark runs the
# padded build and says so).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
(python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_swz.log 2>&1) &
(PAGEDATTN_HIP_DECODE_SWIZZLE=0 python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_pad.log 2>&1) &
wait; tail -qn1 $O/build_*.log
timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_hip_backend.py 2>&1 | tee $O/hip_tests.log | tail -4
if grep -qE "^[0-9]+ passed" $O/hip_tests.log && ! grep -q failed $O/hip_tests.log; then BEST=""; echo "swizzled build passes: benchmark it"
  for v in "swz:" "pad:PAGEDATTN_HIP_DECODE_SWIZZLE=0"; do n=${v%%:*}; e=${v#*:}; env $e timeout 45 python3 scripts/hip_decode_ab.py --quick --label "$n" hip= 2>&1 | tail -5 | tee $O/ab_$n.md; done
else BEST="PAGEDATTN_HIP_DECODE_SWIZZLE=0"; echo "swizzled build FAILS: benchmark the padded one"; fi
env $BEST timeout 230 python3 -m bench.bench_decode --out $O > $O/bench_decode.log 2>&1; tail -2 $O/bench_decode.log
python3 - <<'PY' $O/bench_decode.csv
import sys, pandas as pd
df = pd.read_csv(sys.argv[1])
cols = [c for c in ["Hq", "Hkv", "block", "batch", "ctx", "triton_graph_us", "hip_graph_us", "triton_graph_frac", "hip_graph_frac", "flashinfer_graph_us", "flashinfer_fa2_graph_us", "note"] if c in df]
print(df[cols].to_string())
PY
