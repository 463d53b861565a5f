#!/usr/bin/env bash
# Session-6 call 5: the restored HIP decode (bdaeb73's kernels) — HIP GPU tests (with the new
# batch-invariance test) and bench_decode with its hip column (the issue shapes, CUDA graphs).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1; tail -1 $O/build.log
timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_hip_backend.py 2>&1 | tee $O/hip_tests.log | tail -4
timeout 240 python3 -m bench.bench_decode --out $O > $O/bench_decode.log 2>&1; tail -2 $O/bench_decode.log
python3 - <<'PY' $O/bench_decode.csv
import sys, pandas as pd
df = pd.read_csv(sys.argv[1])
cols = [c for c in ["Hq", "Hkv", "block", "batch", "ctx", "triton_graph_us", "hip_graph_us", "triton_graph_frac", "hip_graph_frac", "flashinfer_fa2_graph_us", "sdpa_graph_us", "note"] if c in df]
print(df[cols].to_string())
PY
