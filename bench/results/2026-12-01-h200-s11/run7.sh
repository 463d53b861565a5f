#!/usr/bin/env bash
# Session 11, call 7 (~1.5 min): the warp-specialized Gluon kernel with two 4-warp consumers
# (PAGEDATTN_EXTEND_GLUON_WS=2): GPU tests of all three forms, then the A/B of the split form
# against the 8-warp consumer and `early`.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $O/device.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 4 \
  tests/test_triton_extend_gpu.py -k "gluon" 2>&1 | tee $O/gluon-tests.log | tail -6
timeout 150 python3 scripts/extend_variants.py --out $O --rows early,gluon,gluon-split,early#2 \
  2>&1 | tee $O/extend_variants.log | tail -9
