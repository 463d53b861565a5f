#!/usr/bin/env bash
# Session-5 check of the capped combine group (one device call): decode GPU tests, graph A/B.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site:$PWD/.ficache PYTHONUNBUFFERED=1 PAGEDATTN_VALIDATE=1
export PAGEDATTN_COMMIT=${PAGEDATTN_COMMIT:-unknown}
pack() { tar czf "$TOP/results.tgz" -C "$O" . 2>/dev/null; }
trap pack EXIT
timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_triton_decode.py tests/test_plan.py 2>&1 | tee $O/gpu-tests-decode.log | tail -3
timeout 60 python3 scripts/decode_sweep.py 16 --configs 32,4,3 --partitions 512 --modes split --shapes 0,1,5 2>&1 | tee $O/sweep.log | grep -E "^[0-9]"
mkdir -p $O/ab
timeout 120 python3 -m bench.ab --op paged_decode --cuda-graph --out $O/ab > $O/ab.log 2>&1; tail -2 $O/ab.log
