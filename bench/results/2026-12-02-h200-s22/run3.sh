#!/usr/bin/env bash
# Session 22 call 3 (~6.5 min): the results table (bench_decode; FlashInfer from the carried
# wheels and prebuilt kernels) at the commit of the wave rule.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
timeout 340 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -2
# the HIP backend's GPU tests (decode_cs.cuh split: decode_cs_cfg.h holds its config and stamps)
timeout -s KILL 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_hip_backend.py 2>&1 | tail -15 > $O/gpu-tests-hip.log; tail -3 $O/gpu-tests-hip.log
