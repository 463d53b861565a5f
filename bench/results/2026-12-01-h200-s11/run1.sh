#!/usr/bin/env bash
# Session 11, call 1 (~5 min): the Gluon sm_90 extend kernel (PAGEDATTN_EXTEND_VARIANT=gluon):
# its GPU tests, then the A/B against the default (`early`) on the four issue shapes.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $O/device.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $O/device.txt
timeout 240 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 4 \
  tests/test_triton_extend_gpu.py -k "gluon" 2>&1 | tee $O/gluon-tests.log | tail -40
VARIANT_ROWS=early,gluon,early#2
timeout 300 python3 scripts/extend_variants.py --out $O --rows $VARIANT_ROWS 2>&1 \
  | tee $O/extend_variants.log | tail -30
