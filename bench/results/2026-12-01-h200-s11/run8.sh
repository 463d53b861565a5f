#!/usr/bin/env bash
# Session 11, call 8 (~4 min): `gluon` (split form) is the extend default on sm_90 now: the
# extend GPU test files under it, then bench_extend (Triton default vs FlashInfer FA2/FA3, SDPA).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $O/device.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $O/device.txt
timeout 220 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -m "not compile" -n 8 \
  tests/test_triton_extend.py tests/test_triton_extend_gpu.py 2>&1 | tee $O/gpu-tests-extend.log | tail -6
timeout 240 python3 -m bench.bench_extend --out $O 2>&1 | tee $O/bench_extend.log | tail -30
