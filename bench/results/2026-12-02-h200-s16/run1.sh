#!/usr/bin/env bash
# Session 16, call 1 (~7 min): the column split of the Triton decode kernel (_decode_cs.py, config
# SUB > 1): its GPU tests (bf16/fp16, real sizes, bitwise across launch shapes), then A/B on the
# 32/8 rows against the default (32, 4, 3), two stage counts, and the HIP backend (the column
# split it copies in spirit). Offline (sm_90, triton 3.6, 32/8 block 16, split): (64,4,3,4) loop
# 408 instructions and 2 BAR.SYNC per 64-key tile, 255 registers, 64 KB; default (32,4,3) 428
# and 9 per 32-key tile, 76 registers, 37 KB.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 260 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode_cs.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
  > $O/gpu-tests-cs.log
grep -c PASSED $O/gpu-tests-cs.log; grep -E "FAILED|Error|passed|failed" $O/gpu-tests-cs.log | head -20
export PAGEDATTN_VALIDATE=0
C=PAGEDATTN_DECODE_CONFIG
V=PAGEDATTN_DECODE_VARIANT=triton
timeout 240 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16 --csv $O/ab_cs16.csv triton triton_cs4=$C=64,4,3,4 triton_cs2=$C=32,2,3,2 \
  triton_cs4s4=$C=64,4,4,4 triton_cs2s4=$C=32,2,4,2 hip 2>&1 | tee $O/ab_cs16.md
timeout 120 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 64 --csv $O/ab_cs64.csv triton triton_tl=$V triton_tlcs4=$V,$C=64,4,3,4 2>&1 \
  | tee $O/ab_cs64.md
