#!/usr/bin/env bash
# Session 11, call 6 (~2 min; call 5 ran run5.sh with 240 s / 300 s limits and hung: the empty
# barriers counted 256 arrivals, Gluon arrives from one elected thread): the warp-specialized Gluon kernel (a producer warpgroup gathers
# the pages through cp.async + mbarriers; 8 consumer warps only compute): GPU tests of both
# forms, then the A/B against `early` and the single-role form.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $O/device.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 4 \
  tests/test_triton_extend_gpu.py -k "gluon" 2>&1 | tee $O/gluon-tests.log | tail -12
timeout 200 python3 scripts/extend_variants.py --out $O --rows early,gluon,early#2 \
  2>&1 | tee $O/extend_variants.log | tail -9
