#!/usr/bin/env bash
# Session 10, call 5 (~3 min): persistent extend programs (one per SM walking the query blocks;
# PAGEDATTN_EXTEND_PERSIST=sm, and sm:pre with the next block's scalars loaded ahead) against the
# default, then their GPU tests.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
VARIANT_ROWS=early,early+persist,early+persist:pre,early#2 \
  SKIP_SWEEP=1 SKIP_VTESTS=1 VARIANTS_TIMEOUT=200 bash scripts/gpu_run.sh "$TOP" tune
PACK_DIR=$O
. scripts/device_env.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 \
  tests/test_triton_extend_gpu.py tests/test_triton_extend.py -k "persist" 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" | tee $O/persist-tests.log | tail -8
