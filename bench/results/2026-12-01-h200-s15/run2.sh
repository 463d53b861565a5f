#!/usr/bin/env bash
# Session 15, call 2 (~8 min): the Triton decode kernel's tile configs on 32/8 block 16 (the
# rows it serves by default; large one-pass rows at 0.943-0.949 of the ceiling, 0.95 asked),
# then the decode, launch-replay and plan GPU tests at this commit (the register-aware planner,
# the Gluon module split and the shared helpers of session 14 had not run on the GPU).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
C=PAGEDATTN_DECODE_CONFIG
timeout 200 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16 --csv $O/ab_config.csv triton t32x4x4=$C=32,4,4 t32x2x4=$C=32,2,4 \
  t64x4x2=$C=64,4,2 t64x8x3=$C=64,8,3 t32x8x3=$C=32,8,3 t16x2x4=$C=16,2,4 2>&1 \
  | tee $O/ab_config.md
timeout -s INT 330 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py tests/test_launch_replay.py tests/test_plan.py 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" | tee $O/gpu-tests.log | tail -12
