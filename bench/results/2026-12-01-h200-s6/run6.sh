#!/usr/bin/env bash
# Session-6 call 6: the column-split HIP decode — HIP GPU tests, bench_decode (hip column).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1; tail -1 $O/build.log
timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=line -n 8 tests/test_hip_backend.py 2>&1 | tee $O/hip_tests.log | tail -25
timeout 260 python3 -m bench.bench_decode --out $O > $O/bench_decode.log 2>&1; tail -2 $O/bench_decode.log
python3 - <<'PY' $O/bench_decode.csv
import sys, pandas as pd
df = pd.read_csv(sys.argv[1])
df["hip/triton"] = (df.triton_graph_us / df.hip_graph_us).round(3)
cols = [c for c in ["Hq", "Hkv", "block", "batch", "ctx", "triton_graph_us", "hip_graph_us", "hip/triton", "hip_graph_frac", "flashinfer_fa2_graph_us", "note"] if c in df]
print(df[cols].to_string())
PY
