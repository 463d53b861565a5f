#!/usr/bin/env bash
# Session 11, call 10 (~2.5 min): bench_extend again at the final tree (kernels as call 8): a
# second, independent timing of the short shapes' margin over 50 %.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout 200 python3 -m bench.bench_extend --out $O 2>&1 | tee $O/bench_extend.log | tail -22
