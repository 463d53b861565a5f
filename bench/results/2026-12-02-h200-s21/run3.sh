#!/usr/bin/env bash
# Session 21 call 3 (~6.5 min): (1) the results table (bench_decode; FlashInfer from the carried
# wheels and prebuilt kernels). (2) The fp8 (e4m3) cache, 32/8 block 16: balanced against the
# count rule (the balanced fp8 kernel's speed was never measured).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
timeout 340 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -2
timeout 60 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --quick --kv e4m3 \
  --csv $O/ab_count_e4m3.csv triton triton_count=PAGEDATTN_DECODE_MODE=count 2>&1 \
  | grep -v "Warn\|warn" | tee $O/ab_count_e4m3.md
