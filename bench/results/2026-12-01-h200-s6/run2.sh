#!/usr/bin/env bash
# Session-6 call 2: the leaner persistent HIP decode: tests, block-count sweep, A/B from graphs.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1; tail -1 $O/build.log
timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_hip_backend.py 2>&1 | tee $O/hip_tests.log | tail -4
timeout 200 python3 scripts/hip_grid_sweep.py --mults 1,4,0 2>&1 | tee $O/grid_sweep.log
