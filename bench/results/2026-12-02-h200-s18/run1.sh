#!/usr/bin/env bash
# Session 18 call 1 (~6 min): PAGEDATTN_DECODE_QK=halves (q K^T as two dots over the head dim's
# halves: q in registers, two MMA chains; call 0's ncu source page put the Triton loop's warps on
# q's per-tile ldmatrix and the serial q K^T chain far more than HIP's). Its GPU tests, then an
# A/B on the 32/8 rows, blocks 16 and 64 (the Triton kernel forced at 64, where auto runs Gluon;
# at 16 triton_tl repeats triton: a noise yardstick), HIP beside.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 200 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 4 -m gpu \
  tests/test_triton_decode_cs.py -k qk 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
  > $O/gpu-tests-qk.log
grep -E "PASSED|FAILED|^E  |passed|failed" $O/gpu-tests-qk.log | tail -8
export PAGEDATTN_VALIDATE=0
H=PAGEDATTN_DECODE_QK=halves T=PAGEDATTN_DECODE_VARIANT=triton
timeout 330 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16,64 --csv $O/ab_qk.csv triton triton_qk=$H triton_tl=$T triton_tlqk=$T,$H hip \
  2>&1 | tee $O/ab_qk.md
