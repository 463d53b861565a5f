#!/usr/bin/env bash
# Session 11, call 9 (~1 min): the host-only gate test fixed for the GPU tier (call 8's one
# failure: it passed CPU tensors without TRITON_INTERPRET), with the Gluon GPU tests again.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout 100 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -m "not compile" -n 4 \
  tests/test_triton_extend.py tests/test_triton_extend_gpu.py -k "gluon" 2>&1 | tee $O/gpu-tests-gluon.log | tail -4
