#!/usr/bin/env bash
# Session 12, call 1 (~9 min): the Gluon decode kernel's GPU tests, then the A/B against the
# Triton kernel on the 20 rows (one process, CUDA graphs), then the decode test file.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $O/device.txt
T="python3 -m pytest -q -p no:cacheprovider -rf --tb=short"
timeout 170 $T -x -n 8 tests/test_triton_decode.py -k "gluon" 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" | tee $O/gluon-tests.log | tail -25
timeout 230 python3 scripts/hip_decode_ab.py --label "$PAGEDATTN_COMMIT" --csv $O/ab_gluon.csv \
  triton=PAGEDATTN_DECODE_VARIANT=triton triton_g64x3= \
  triton_g32x3=PAGEDATTN_DECODE_GLUON_TILE=32,3 triton_g32x4=PAGEDATTN_DECODE_GLUON_TILE=32,4 \
  triton_g64x2=PAGEDATTN_DECODE_GLUON_TILE=64,2 2>&1 | tee $O/ab_gluon.md | tail -25
timeout 130 $T -n 8 tests/test_triton_decode.py 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" | tee $O/decode-tests.log | tail -12
