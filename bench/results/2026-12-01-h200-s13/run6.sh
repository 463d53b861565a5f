#!/usr/bin/env bash
# Session 13, call 7 (~4 min): the GPU test files a paged_decode or store_kv call goes through
# that calls 5-6 did not run at the final code: the serving replay (store_kv replays there), the
# declared-combination runs, the HIP backend (the remembered route), and the replay tests again.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
python3 -c "from pagedattn.hip_kernels import build; build.load()" 2>&1 | tail -1
timeout -s INT 250 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -m "not compile" \
  -n 8 --durations=5 tests/test_replay.py tests/test_dispatch_runs.py tests/test_hip_backend.py \
  tests/test_launch_replay.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
  | tee $O/gpu-tests.log | tail -14
