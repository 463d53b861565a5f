#!/usr/bin/env bash
# Session-8 call 1: the whole GPU test tier (first since session 7 moved the Triton decode
# kernels and the HIP combine), the read ceiling against the size of one read, and per-kernel
# durations at (1, 32768) (ncu, clocks and caches as in a normal run) for both backends.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1; tail -n1 $O/build.log
timeout 400 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -m "not compile" -n 8 \
  --durations=10 tests/test_triton_decode.py tests/test_triton_extend.py \
  tests/test_triton_extend_gpu.py tests/test_triton_store_copy.py tests/test_plan.py \
  tests/test_hip_backend.py tests/test_dispatch.py tests/test_dispatch_runs.py tests/test_replay.py \
  2>&1 | tee $O/gpu-tests.log | tail -25
timeout 60 python3 scripts/read_size_sweep.py --csv $O/read_size_sweep.csv 2>&1 | tee $O/read_size_sweep.txt
for b in hip triton; do
  for h in 8 32; do
    timeout 40 ncu --clock-control none --cache-control none --launch-skip 6 --launch-count 4 \
      --metrics gpu__time_duration.sum python3 scripts/hip_prof_case.py 1 32768 32 $h $b \
      > $O/ncu_dur_${b}_$h.txt 2>&1 || echo "ncu $b $h rc $?"
    grep -E "^  [a-z_A-Z].*\(|gpu__time_duration" $O/ncu_dur_${b}_$h.txt | sed 's/(AttnParams).*//' | head -8
  done
done
