#!/usr/bin/env bash
# Session 18 call 2 (~7 min): PAGEDATTN_DECODE_COMBINE_WAIT=flags (the combine waits per group of
# partitions on ready flags the decode kernel publishes, instead of griddepcontrol.wait for the
# whole grid: the groups of early partitions merge while the decode grid runs). Its GPU tests
# (bitwise vs one pass, eager, launch replay and a CUDA graph), then an A/B on the 32/8 block-16
# rows (groups of 32 and of 8 states) with HIP beside, and CUPTI spans of the split rows.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 200 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 2 -m gpu \
  tests/test_triton_decode_cs.py -k flags 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
  > $O/gpu-tests-flags.log
grep -E "PASSED|FAILED|^E  |passed|failed" $O/gpu-tests-flags.log | tail -8
export PAGEDATTN_VALIDATE=0
F=PAGEDATTN_DECODE_COMBINE_WAIT=flags
timeout 240 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16 --csv $O/ab_flags.csv triton triton_fl=$F \
  triton_fl8=$F,PAGEDATTN_DECODE_COMBINE=8,1,4,1 triton_8=PAGEDATTN_DECODE_COMBINE=8,1,4,1 hip \
  2>&1 | tee $O/ab_flags.md
for v in grid flags; do
  PAGEDATTN_DECODE_COMBINE_WAIT=$v timeout 100 python3 scripts/decode_graph_trace.py \
    --shapes "1,32768;8,8192" --heads 32/8 --blocks 16 2>&1 | grep -v Warn \
    | tee $O/graph_trace_$v.md
done
