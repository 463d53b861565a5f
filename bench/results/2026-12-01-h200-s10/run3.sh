#!/usr/bin/env bash
# Session 10, call 3 (~4 min): two 8-warp extend programs per SM (128 registers, 32-key tiles,
# 80-96 KB of shared memory each) against the new default (early, 64-key masked tiles), and the
# GPU variant tests with the 2-CTA tiles.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
VARIANT_ROWS=early,early@128x32x8x3+r128,early@128x32x8x4+r128,pipe_fma#2 \
  SKIP_SWEEP=1 SKIP_VTESTS=1 VARIANTS_TIMEOUT=240 bash scripts/gpu_run.sh "$TOP" tune
PACK_DIR=$O
. scripts/device_env.sh
PAGEDATTN_EXTEND_CONFIG=128,32,8,3 PAGEDATTN_EXTEND_MAXNREG=128 timeout 150 python3 -m pytest -q \
  -p no:cacheprovider -rf --tb=short -n 8 tests/test_triton_extend_gpu.py -k "variant" 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" | tee $O/variant-tests-2cta.log | tail -8
