#!/usr/bin/env bash
# Session 12, call 5 (~5 min): the final defaults (auto: Gluon for MHA and pages >= 64 tokens;
# EARLY refill): the decode GPU tests, then bench_decode.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
T="python3 -m pytest -q -p no:cacheprovider -rf --tb=short"
timeout 175 $T -n 8 -m gpu tests/test_triton_decode.py 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" | tee $O/decode-gpu-tests.log | tail -8
timeout 110 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -2
