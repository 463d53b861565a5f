#!/usr/bin/env bash
# Session-5 check of the capped combine group (one device call): decode GPU tests, graph A/B.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh  # wheels, PYTHONPATH, PAGEDATTN_VALIDATE=1, commit label, pack at exit
timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_triton_decode.py tests/test_plan.py 2>&1 | tee $O/gpu-tests-decode.log | tail -3
timeout 60 python3 scripts/decode_sweep.py 16 --configs 32,4,3 --partitions 512 --modes split --shapes 0,1,5 2>&1 | tee $O/sweep.log | grep -E "^[0-9]"
mkdir -p $O/ab
timeout 120 python3 -m bench.ab --op paged_decode --cuda-graph --out $O/ab > $O/ab.log 2>&1; tail -2 $O/ab.log
