#!/usr/bin/env bash
# Session 13, call 4 (~8 min): launch replay with the fast environment reads: the GPU tests of
# every file a paged_decode call goes through but the HIP backend's (its kernels are unchanged;
# only the remembered route is new there), then the host cost per eager call, then bench_decode
# (the eager columns are the point; graph columns as the session's table).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
python3 -c "from pagedattn.hip_kernels import build; build.load()" 2>&1 | tail -1
# SIGINT at the limit: pytest still prints its summary of what ran
timeout -s INT 270 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -m "not compile" \
  -n 8 --durations=8 tests/test_launch_replay.py tests/test_triton_decode.py tests/test_plan.py \
  tests/test_dispatch.py tests/test_replay.py tests/test_dispatch_runs.py \
  2>&1 | grep -v "PytestBenchmarkWarning\|warner(" | tee $O/gpu-tests.log | tail -22
PAGEDATTN_VALIDATE=0 timeout 90 python3 scripts/launch_profile.py 2>&1 | tee $O/launch_profile.log
timeout 200 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -2
