#!/usr/bin/env bash
# Session-6 call 1: the persistent HIP decode — its GPU tests, then HIP vs Triton from CUDA graphs.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh  # wheels, PYTHONPATH, PAGEDATTN_VALIDATE=1, commit label, pack at exit
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1; tail -2 $O/build.log
timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_hip_backend.py 2>&1 | tee $O/hip_tests.log | tail -12
mkdir -p $O/ab
timeout 150 python3 -m bench.ab --op paged_decode --cuda-graph --out $O/ab > $O/ab.log 2>&1; tail -3 $O/ab.log
grep -h "triton\|hip " $O/ab/*.md | grep "B[0-9]" | awk -F'|' '{print $2,$3,$4,$7}' | head -40
timeout 200 python3 -m bench.bench_decode --out $O > $O/bench_decode.log 2>&1; tail -3 $O/bench_decode.log
python3 - <<'PY' $O/bench_decode.csv
import sys, pandas as pd
df = pd.read_csv(sys.argv[1])
cols = [c for c in ["Hq", "Hkv", "block", "batch", "ctx", "triton_graph_us", "hip_graph_us", "triton_graph_frac", "hip_graph_frac", "flashinfer_graph_us", "flashinfer_fa2_graph_us", "note"] if c in df]
print(df[cols].to_string())
PY
