#!/usr/bin/env bash
# Ready for session 10's first call (~8 min; give the run tool timeout_s 600): the whole GPU tier
# with the conftest fix (kernel modules imported before any test touches TRITON_INTERPRET; this
# session's tier hit that bug), then fp8 128-token tiles capped at 168 registers (3 programs per
# SM instead of 2; offline they spill 48-160 bytes) against the default and 64-token tiles.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1; tail -n1 $O/build.log
timeout 480 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -m "not compile" -n 8 \
  --durations=10 tests/test_triton_decode.py tests/test_triton_extend.py \
  tests/test_triton_extend_gpu.py tests/test_triton_store_copy.py tests/test_plan.py \
  tests/test_hip_backend.py tests/test_dispatch.py tests/test_dispatch_runs.py tests/test_replay.py \
  2>&1 | grep -v "PytestBenchmarkWarning\|warner(" | tee $O/gpu-tests.log | tail -25
timeout 70 python3 scripts/hip_decode_ab.py --kv e5m2 --blocks 16,64 --label "$PAGEDATTN_COMMIT" \
  --csv $O/ab_fp8_maxnreg.csv triton= triton_mr168=PAGEDATTN_DECODE_MAXNREG=168 \
  triton_t64=PAGEDATTN_DECODE_CONFIG=64,4,3 triton_b= 2>&1 | tee $O/ab_fp8_maxnreg.md | tail -21
