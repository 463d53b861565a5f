#!/usr/bin/env bash
# Session-9 call 3: the whole GPU test tier on the final tree (first full run since session 8's
# 78a3ae9), then fp8 tiles at block 64, where 128 and 64 tokens each won half the rows in call 2.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1; tail -n1 $O/build.log
timeout 430 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -m "not compile" -n 8 \
  --durations=10 tests/test_triton_decode.py tests/test_triton_extend.py \
  tests/test_triton_extend_gpu.py tests/test_triton_store_copy.py tests/test_plan.py \
  tests/test_hip_backend.py tests/test_dispatch.py tests/test_dispatch_runs.py tests/test_replay.py \
  2>&1 | tee $O/gpu-tests.log | tail -25
timeout 60 python3 scripts/hip_decode_ab.py --kv e5m2 --blocks 64 --label "$PAGEDATTN_COMMIT" \
  --csv $O/ab_fp8_b64.csv triton= triton_t64=PAGEDATTN_DECODE_CONFIG=64,4,3 \
  triton_w8=PAGEDATTN_DECODE_CONFIG=128,8,3 triton_s2=PAGEDATTN_DECODE_CONFIG=128,4,2 \
  2>&1 | tee $O/ab_fp8_b64.md | tail -11
