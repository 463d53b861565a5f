#!/usr/bin/env bash
# Session-9 call 4: the decode benchmark on the final tree (HIP beside Triton, bf16; FlashInfer
# was not carried this session: its columns are in session 8's table).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1; tail -n1 $O/build.log
timeout 330 python3 -m bench.bench_decode --out $O > $O/bench_decode.log 2>&1; tail -2 $O/bench_decode.log
python3 - <<'PY' $O/bench_decode.csv
import sys, pandas as pd
df = pd.read_csv(sys.argv[1])
df["hip_vs_triton"] = (df["triton_graph_us"] / df["hip_graph_us"]).round(3)
print(df[["Hq", "Hkv", "block", "batch", "ctx", "triton_graph_us", "hip_graph_us", "triton_graph_frac",
          "hip_graph_frac", "hip_vs_triton"]].to_string(index=False))
PY
