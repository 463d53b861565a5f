#!/usr/bin/env bash
# Session-8 call 7: the final tree, HIP against Triton on every issue decode shape from CUDA
# graphs, both in one process, twice (two processes: the drift between them).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1; tail -n1 $O/build.log
for i in 1 2; do
  timeout 100 python3 scripts/hip_decode_ab.py --label "$PAGEDATTN_COMMIT run $i" --csv $O/ab_final_$i.csv hip= triton= 2>&1 | tee $O/ab_final_$i.md | tail -21
done
