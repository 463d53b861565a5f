#!/usr/bin/env bash
# Session 10, call 4 (~9 min; carry .whl and .ficache): the extend GPU tests under the new default
# (early, 64-key masked tiles), then bench_extend and bench_decode beside FlashInfer (prebuilt).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
TEST_TIMEOUT=250 GPU_TESTS="tests/test_triton_extend.py tests/test_triton_extend_gpu.py" \
  bash scripts/gpu_run.sh "$TOP" tests 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" | tail -8
PACK_DIR=$O
. scripts/device_env.sh
export FLASHINFER_DISABLE_JIT=1  # prebuilt modules only: no nvcc minutes here
timeout 150 python3 -m bench.bench_extend --out $O > $O/bench_extend.log 2>&1; tail -24 $O/bench_extend.log
timeout 170 python3 -m bench.bench_decode --out $O > $O/bench_decode.log 2>&1; tail -26 $O/bench_decode.log
