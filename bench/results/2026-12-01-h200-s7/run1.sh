#!/usr/bin/env bash
# Session-7 call 1: HIP decode launch shapes (one pass / partitions per block) and the latency-
# hiding combine: GPU tests, then HIP auto vs split x1 vs f99544a's HIP (.ab_old) vs Triton.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1; tail -2 $O/build.log
(PYTHONPATH=$PWD/.ab_old:$PYTHONPATH python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_old.log 2>&1) &
timeout 230 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_hip_backend.py 2>&1 | tee $O/hip_tests.log | tail -12
wait
S="PAGEDATTN_HIP_DECODE_MODE=split,PAGEDATTN_HIP_DECODE_PPP=1"
timeout 150 python3 scripts/hip_decode_ab.py --label "$PAGEDATTN_COMMIT" auto= split1=$S triton= 2>&1 | tee $O/ab_new.md
PYTHONPATH=$PWD/.ab_old:$PYTHONPATH timeout 90 python3 scripts/hip_decode_ab.py --label f99544a old= 2>&1 | tee $O/ab_old.md
