#!/usr/bin/env bash
# Session 17 call 2 (~4 min): the in-kernel merge with a group of states per round trip (call 0:
# one state per round trip lost 0.74x at (1, 32768)): its GPU tests, an A/B against the combine
# on the 32/8 rows (block 64 with the Triton kernel too: auto runs Gluon there, which has no
# fold), and CUPTI spans (the counters' zeroing shows as the launch gap).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 200 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode_cs.py -k fold 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
  > $O/gpu-tests-fold.log
grep -E "PASSED|FAILED|^E  |passed|failed" $O/gpu-tests-fold.log | tail -6
export PAGEDATTN_VALIDATE=0
F=PAGEDATTN_DECODE_FOLD=last
timeout 200 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16,64 --csv $O/ab_fold.csv triton triton_fold=$F \
  triton_tl=PAGEDATTN_DECODE_VARIANT=triton triton_tlfold=PAGEDATTN_DECODE_VARIANT=triton,$F \
  2>&1 | tee $O/ab_fold.md
PAGEDATTN_DECODE_FOLD=last timeout 100 python3 scripts/decode_graph_trace.py \
  --shapes "1,32768;8,8192" --heads 32/8 --blocks 16 2>&1 | grep -v Warn \
  | tee $O/graph_trace_fold.md
