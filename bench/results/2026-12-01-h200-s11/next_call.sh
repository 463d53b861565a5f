#!/usr/bin/env bash
# For session 12's first GPU call (~9 min): the whole GPU tier under the new extend default (the
# Gluon kernel; session 11 ran only the extend files under it), then bench_extend once more.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
TEST_TIMEOUT=560 bash scripts/gpu_run.sh "$TOP" tests
PACK_DIR=$O
. scripts/device_env.sh
timeout 200 python3 -m bench.bench_extend --out $O 2>&1 | tee $O/bench_extend.log | tail -22
