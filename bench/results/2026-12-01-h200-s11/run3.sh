#!/usr/bin/env bash
# Session 11, call 3 (~2 min): the Gluon kernel with lean cp.async addressing (one 32x32->64
# multiply per row, loop-invariant token terms, one id per tile for pages >= 128): GPU tests, A/B.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $O/device.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 4 \
  tests/test_triton_extend_gpu.py -k "gluon" 2>&1 | tee $O/gluon-tests.log | tail -5
timeout 300 python3 scripts/extend_variants.py --out $O --rows early,gluon,early#2 2>&1 \
  | tee $O/extend_variants.log | tail -8
