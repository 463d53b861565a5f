#!/usr/bin/env bash
# Session 12, call 3 (~8 min): bench_decode (graph times in 3 rotated rounds; the Gluon decode
# kernel as triton_gluon) and bench_extend.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
timeout 400 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -3
timeout 150 python3 -m bench.bench_extend --out $O 2>&1 | tee $O/bench_extend.log | tail -12
