#!/usr/bin/env bash
# One GPU session: install carried wheels (FlashInfer), run the GPU test tier, then benchmarks.
# usage: scripts/gpu_run.sh OUT_DIR [PHASES] [extra pytest args...]
#   PHASES: comma-separated tune, diag, tests, bench (default all = tests,bench)
#   tune: the extend-variant A/B and the decode launch sweep (scripts/extend_variants.py,
#   scripts/decode_sweep.py); diag: scripts/hip_hostcheck_diag.py. Everything is written under
#   OUT_DIR/r and packed into OUT_DIR/results.tgz (the device tool returns at most 8 files).
set -u
TOP=${1:?out dir}; WHAT=${2:-all}; shift 2 || true
OUT_DIR=$TOP/r  # everything lands here; TOP gets results.tgz (the device tool returns 8 files)
[ "$WHAT" = all ] && WHAT=tests,bench
has() { case ",$WHAT," in *",$1,"*) return 0;; esac; return 1; }
mkdir -p "$OUT_DIR"
cd "$(dirname "$0")/.."
PACK_DIR=$OUT_DIR
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUT_DIR/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT_DIR/device.txt"
if has tune; then
  [ -n "${SKIP_VARIANTS:-}" ] || timeout ${VARIANTS_TIMEOUT:-300} python3 scripts/extend_variants.py --out "$OUT_DIR" ${VARIANT_ROWS:+--rows $VARIANT_ROWS} ${VARIANT_ARGS:-} 2>&1 | tee "$OUT_DIR/extend_variants.log" | tail -40
  [ -n "${SKIP_SWEEP:-}" ] || timeout ${SWEEP_TIMEOUT:-200} python3 scripts/decode_sweep.py 16 ${SWEEP_ARGS:---quick} 2>&1 | tee "$OUT_DIR/decode_sweep16.log" | grep -E "BEST|read bw|failed"
  has tests || [ -n "${SKIP_VTESTS:-}" ] || timeout ${VTEST_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider -rf \
    --tb=short -n 8 tests/test_triton_extend_gpu.py -k variant 2>&1 | tee "$OUT_DIR/variant-tests.log" | tail -15
fi
if has diag; then
  timeout ${DIAG_TIMEOUT:-120} python3 scripts/hip_hostcheck_diag.py 2>&1 | tee "$OUT_DIR/hip_hostcheck_diag.log"
  timeout ${PROFILE_TIMEOUT:-120} python3 scripts/decode_profile.py ${PROFILE_ARGS:-} 2>&1 | tee "$OUT_DIR/decode_profile.log"
  timeout 45 python3 scripts/launch_profile.py 2>&1 | tee "$OUT_DIR/launch_profile.log" | head -12
fi
if has tests; then
  # the HIP extension is built once here, not by 8 racing xdist workers
  python3 -c "from pagedattn.hip_kernels import build; build.load()" 2>&1 | tail -3
  timeout ${TEST_TIMEOUT:-600} python3 -m pytest -q -p no:cacheprovider -rf --tb=short -m "not compile" \
    -n ${TEST_JOBS:-8} --durations=15 \
    ${GPU_TESTS:-tests/test_triton_decode.py tests/test_triton_extend.py tests/test_triton_extend_gpu.py tests/test_triton_store_copy.py tests/test_plan.py tests/test_hip_backend.py tests/test_dispatch.py tests/test_dispatch_runs.py tests/test_replay.py tests/test_launch_replay.py} \
    "$@" 2>&1 | tee "$OUT_DIR/gpu-tests.log" | tail -60
fi
if has bench; then
  python3 -m pagedattn.dispatch 2>&1 | tee "$OUT_DIR/dispatch.txt" | tail -20
  timeout ${BENCH_TIMEOUT:-900} python3 -m bench all --out "$OUT_DIR" ${BENCH_ARGS:-} 2>&1 | tee "$OUT_DIR/bench.log" | tail -80
fi
