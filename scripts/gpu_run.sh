#!/usr/bin/env bash
# The GPU job, on NVIDIA (CUDA), AMD (ROCm) or Hygon (DTK): every GPU CI job runs this one script
# (.github/workflows/gpu.yml, inside a docker/ image), and so does a manual run on a GPU machine.
#   1. the device and toolchain (nvidia-smi, rocm-smi or hy-smi, whichever is present);
#   2. python -m pagedattn.selfcheck: the layout probe and small cases per backend; its record
#      makes the backends that pass here eligible for `auto` in the phases after it;
#   3. the GPU test tier: the kernel and dispatch test files, their gpu- and hip-marked tests
#      included, at real sizes (the HIP extension built once first; -m "not compile": the
#      compile-only checks belong to the CPU tier);
#   4. python -m pagedattn.dispatch --all-archs, and the tables of record
#      (python -m pagedattn.bench record).
# usage: scripts/gpu_run.sh OUT_DIR [all|tests|tables] [extra pytest args...]
#   tests: phases 1-3 (FlashInfer's JIT modules are compiled in the background meanwhile, for a
#   `tables` run that follows on the same machine); tables: phases 1 (no self-check) and 4;
#   all (the default).
# Everything is written under OUT_DIR/r and packed into OUT_DIR/results.tgz. The exit status is
# non-zero when the self-check, the tests or the tables fail. Knobs (environment):
# SELFCHECK_TIMEOUT, TEST_TIMEOUT, BENCH_TIMEOUT (seconds), TEST_JOBS (pytest-xdist workers,
# when installed), GPU_TESTS (the test files).
set -uo pipefail
TOP=${1:?usage: scripts/gpu_run.sh OUT_DIR [all|tests|tables] [pytest args...]}
shift
PHASE=all
case "${1:-}" in all|tests|tables) PHASE=$1; shift ;; esac
mkdir -p "$TOP/r"
TOP=$(cd "$TOP" && pwd)
OUT_DIR=$TOP/r
cd "$(dirname "$0")/.." || exit 2
PACK_DIR=$OUT_DIR
# shellcheck source=scripts/device_env.sh
. scripts/device_env.sh
# HIP builds and the self-check record live outside the packed directory (builds are large)
export PAGEDATTN_CACHE_DIR=${PAGEDATTN_CACHE_DIR:-$TOP/cache}
status=0
fail() { echo "gpu_run: $1 failed" | tee -a "$OUT_DIR/failures.txt"; status=1; }

{
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
  elif command -v hy-smi >/dev/null; then
    hy-smi
  elif command -v rocm-smi >/dev/null; then
    rocm-smi --showproductname --showdriverversion --showuse --showmeminfo vram
  fi
  python3 - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "hip",
      getattr(torch.version, "hip", None))
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton: not installed")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(i, p.name, getattr(p, "gcnArchName", f"sm_{p.major}{p.minor}"),
          p.multi_processor_count, "CUs/SMs")
EOF
} 2>&1 | tee "$OUT_DIR/device.txt"

if [ "$PHASE" != tables ]; then
  timeout "${SELFCHECK_TIMEOUT:-600}" python3 -m pagedattn.selfcheck -v 2>&1 \
    | tee "$OUT_DIR/selfcheck.log" | tail -30 || fail selfcheck
  cp "$PAGEDATTN_CACHE_DIR"/selfcheck/*.json "$OUT_DIR/" 2>/dev/null
fi

# FlashInfer (the peer of the tables) compiles its modules at first use: warm them on the CPU
# while the GPU runs the tests, in a process of its own session that outlives this script (its
# JIT cache stays on the machine for a `tables` run; a build cut short is redone there)
if [ "$PHASE" = tests ] && python3 -c "import flashinfer" 2>/dev/null; then
  mkdir -p "$PAGEDATTN_CACHE_DIR"
  setsid python3 - > "$PAGEDATTN_CACHE_DIR/flashinfer-warm.log" 2>&1 <<'EOF' &
import torch
from pagedattn.bench import decode as D, extend as E
gen = torch.Generator(device="cuda").manual_seed(0)
for hq, hkv in D.HEADS:
    q, k, v, table, lens = D._case(2, 256, hq, hkv, 16, torch.bfloat16, "cuda", gen)
    for name, kw in D.FLASHINFER_PATHS.items():
        D._flashinfer(q, k, v, table, lens, 16, **kw)()
        print("decode", hq, hkv, name, "ready", flush=True)
x = E.make_inputs(2, 64, 64, "cuda", torch.bfloat16)
for be in ("fa2", "fa3"):
    E.run_flashinfer(x, 2, 64, 64, be)()
    print("prefill", be, "ready", flush=True)
torch.cuda.synchronize()
EOF
fi

if [ "$PHASE" = tables ]; then
  cp "$PAGEDATTN_CACHE_DIR/flashinfer-warm.log" "$OUT_DIR/" 2>/dev/null
  PAGEDATTN_VALIDATE=0 timeout "${BENCH_TIMEOUT:-1800}" python3 -m pagedattn.bench record \
    --out "$OUT_DIR/tables" --commit "$COMMIT" 2>&1 | tee "$OUT_DIR/bench.log" | tail -40 \
    || fail "tables of record"
  exit "$status"
fi

# the HIP extension is built once here, not by racing xdist workers (no toolkit: tests skip)
python3 -c "from pagedattn.hip_kernels import build; build.load()" 2>&1 \
  | tee "$OUT_DIR/hip-build.log" | tail -3
jobs=()
python3 -c "import xdist" 2>/dev/null && jobs=(-n "${TEST_JOBS:-8}")
read -r -a files <<< "${GPU_TESTS:-tests/test_triton_decode.py tests/test_triton_decode_balance.py \
tests/test_triton_decode_gluon.py tests/test_triton_extend.py tests/test_triton_extend_loop.py \
tests/test_triton_extend_gpu.py tests/test_triton_store_copy.py tests/test_plan.py \
tests/test_compat_gpu.py tests/test_fuzz_metadata.py tests/test_guards.py \
tests/test_hip_guards.py tests/test_hip_backend.py tests/test_dispatch.py \
tests/test_dispatch_runs.py tests/test_replay.py tests/test_launch_replay.py tests/test_selfcheck.py tests/test_verified_dispatch.py}"
timeout "${TEST_TIMEOUT:-1800}" python3 -m pytest -q -p no:cacheprovider -rf --tb=short \
  -m "not compile" "${jobs[@]}" --durations=15 "${files[@]}" "$@" 2>&1 \
  | tee "$OUT_DIR/gpu-tests.log" | tail -40 || fail "GPU tests"

python3 -m pagedattn.dispatch --all-archs > "$OUT_DIR/dispatch.txt" 2>&1 || fail dispatch
[ "$PHASE" = tests ] && exit "$status"
PAGEDATTN_VALIDATE=0 timeout "${BENCH_TIMEOUT:-1800}" python3 -m pagedattn.bench record \
  --out "$OUT_DIR/tables" --commit "$COMMIT" 2>&1 | tee "$OUT_DIR/bench.log" | tail -40 \
  || fail "tables of record"
# the folder of record: the tables, the facts, the command and the GPU test log together
cp "$OUT_DIR/gpu-tests.log" "$OUT_DIR/tables/" 2>/dev/null
exit "$status"
