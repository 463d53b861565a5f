#!/usr/bin/env bash
# Ready for session 10's first call (~8 min; give the run tool timeout_s 600): the whole GPU tier
# (scripts/gpu_run.sh's tests phase) with the conftest fix (kernel modules imported before any
# test touches TRITON_INTERPRET; this session's tier hit that bug), then fp8 128-token tiles
# capped at 168 registers (3 programs per SM instead of 2; offline they spill 48-160 bytes)
# against the default and 64-token tiles.
set -u
TOP=${1:?out}; O=$TOP/r
cd "$(dirname "$0")/../../.."
TEST_TIMEOUT=480 bash scripts/gpu_run.sh "$TOP" tests 2>&1 | grep -v "PytestBenchmarkWarning\|warner("
PACK_DIR=$O
. scripts/device_env.sh
timeout 70 python3 scripts/hip_decode_ab.py --kv e5m2 --blocks 16,64 --label "$PAGEDATTN_COMMIT" \
  --csv $O/ab_fp8_maxnreg.csv triton= triton_mr168=PAGEDATTN_DECODE_MAXNREG=168 \
  triton_t64=PAGEDATTN_DECODE_CONFIG=64,4,3 triton_b= 2>&1 | tee $O/ab_fp8_maxnreg.md | tail -21
