#!/usr/bin/env bash
# GPU: kernel tests (short), the decode config sweep and the extend autotune, in one call.
set -u
OUT_DIR=${1:?out}; mkdir -p "$OUT_DIR"; cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PAGEDATTN_VALIDATE=1
timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider --tb=line -rf \
  tests/test_triton_decode.py tests/test_triton_extend.py tests/test_triton_extend_gpu.py tests/test_triton_store_copy.py \
  > "$OUT_DIR/tests.log" 2>&1; grep -E "FAILED|passed|failed|Error" "$OUT_DIR/tests.log" | tail -25
timeout ${SWEEP_TIMEOUT:-240} python3 scripts/decode_sweep.py 16 --quick > "$OUT_DIR/sweep16.log" 2>&1; grep -E "BEST|bw|failed" "$OUT_DIR/sweep16.log" | head -12
PAGEDATTN_AUTOTUNE=1 TRITON_PRINT_AUTOTUNING=1 timeout ${TUNE_TIMEOUT:-170} python3 -c "
from bench import bench_extend; bench_extend.main(['--out','$OUT_DIR'])" > "$OUT_DIR/extend_tune.log" 2>&1
grep -iE "best config|triton " "$OUT_DIR/extend_tune.log" | head -20
