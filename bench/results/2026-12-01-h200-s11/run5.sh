#!/usr/bin/env bash
# Session 11, call 5 (~3 min): the warp-specialized Gluon kernel (a producer warpgroup gathers
# the pages through cp.async + mbarriers; 8 consumer warps only compute): GPU tests of both
# forms, then the A/B against `early` and the single-role form.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $O/device.txt
timeout 240 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 4 \
  tests/test_triton_extend_gpu.py -k "gluon" 2>&1 | tee $O/gluon-tests.log | tail -12
timeout 300 python3 scripts/extend_variants.py --out $O --rows early,gluon,gluon-1role,early#2 \
  2>&1 | tee $O/extend_variants.log | tail -9
