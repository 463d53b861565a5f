#!/usr/bin/env bash
# Session-8 call 5: HIP combine blocks of D threads (default) against one-warp blocks of 32
# columns (PAGEDATTN_HIP_COMBINE_COLS=32); the winner at (1, 32768) runs the HIP decode tests
# and the decode benchmark. Triton's combine now at UNROLL 64: its GPU decode tests first.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
(python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_d.log 2>&1) &
(PAGEDATTN_HIP_COMBINE_COLS=32 python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_c32.log 2>&1) &
timeout 150 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_triton_decode.py 2>&1 | tee $O/triton_decode_tests.log | tail -3
wait; tail -qn1 $O/build_*.log
for v in "d:" "c32:PAGEDATTN_HIP_COMBINE_COLS=32"; do n=${v%%:*}; e=${v#*:}
  env $e timeout 60 python3 scripts/hip_decode_ab.py --heads 32/8,32/32 --label "$n" --csv $O/ab_comb_$n.csv hip_$n= triton= 2>&1 | tee $O/ab_comb_$n.md | grep -E "32768|Hq"; done
BEST=$(python3 - $O/ab_comb_d.csv $O/ab_comb_c32.csv <<'PY'
import sys, pandas as pd
d, c = (pd.read_csv(p) for p in sys.argv[1:3])
sel = lambda df, col: df[df["ctx"] == 32768][col].sum()
print("PAGEDATTN_HIP_COMBINE_COLS=32" if sel(c, "hip_c32_graph_us") < sel(d, "hip_d_graph_us") else "")
PY
)
echo "benchmark build: ${BEST:-default}" | tee $O/best.txt
env $BEST timeout 120 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_hip_backend.py -k "decode" 2>&1 | tee $O/hip_tests.log | tail -3
env $BEST timeout 240 python3 -m bench.bench_decode --out $O > $O/bench_decode.log 2>&1; tail -2 $O/bench_decode.log
python3 - <<'PY' $O/bench_decode.csv
import sys, pandas as pd
df = pd.read_csv(sys.argv[1])
cols = [c for c in ["Hq", "Hkv", "block", "batch", "ctx", "triton_graph_us", "hip_graph_us", "triton_graph_frac", "hip_graph_frac", "flashinfer_fa2_graph_us"] if c in df]
print(df[cols].to_string())
PY
