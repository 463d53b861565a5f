#!/usr/bin/env bash
# Session-5 A/B (one device call): split-combine configs, HIP small-tile decode.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh  # wheels, PYTHONPATH, PAGEDATTN_VALIDATE=1, commit label, pack at exit
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
# HIP builds (CPU) in the background while the Triton A/B uses the GPU
(python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_default.log 2>&1) &
B1=$!
(PAGEDATTN_HIP_DECODE_SMALL_TILE=1 python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_small.log 2>&1) &
B2=$!
C="8,1,1,1;8,1,2,1;8,1,4,1;16,1,4,1;32,1,4,1"
timeout 100 python3 scripts/decode_profile.py --shapes 0,1 --combines "$C" 2>&1 | tee $O/combine_profile.log | cut -c1-200
timeout 60 python3 scripts/decode_profile.py --shapes 0,1 --heads 32/32 --combines "8,1,1,1;8,1,4,1;16,1,4,1" 2>&1 | tee $O/combine_profile_3232.log | cut -c1-200
timeout 150 python3 scripts/decode_sweep.py 16 --configs 32,4,3 --partitions 512 --modes split --shapes 0,1,5 --combines "$C" 2>&1 | tee $O/combine_sweep.log | grep -v "^$"
timeout 80 python3 scripts/decode_sweep.py 16 --configs 32,4,3 --partitions 512 --modes split --shapes 0,1 --heads 32/32 --combines "8,1,1,1;8,1,4,1;16,1,4,1" 2>&1 | tee $O/combine_sweep_3232.log | grep -v "^$"
for c in 8,1,4,1 16,1,4,1; do
  PAGEDATTN_DECODE_COMBINE=$c timeout 120 python3 -m pytest -q -p no:cacheprovider -x -rf --tb=short -n 4 tests/test_triton_decode.py -k "gpu_split_equals or many_partitions or batch_invariance or split_count" 2>&1 | tail -3 | sed "s/^/combine $c: /" | tee -a $O/combine_tests.log
done
wait $B1 $B2; tail -2 $O/build_default.log $O/build_small.log
PAGEDATTN_HIP_DECODE_SMALL_TILE=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_hip_backend.py 2>&1 | tee $O/hip_small_tests.log | tail -6
mkdir -p $O/ab_default $O/ab_small
timeout 120 python3 -m bench.ab --op paged_decode --cuda-graph --out $O/ab_default > $O/ab_default.log 2>&1; tail -3 $O/ab_default.log
PAGEDATTN_HIP_DECODE_SMALL_TILE=1 timeout 120 python3 -m bench.ab --op paged_decode --cuda-graph --out $O/ab_small > $O/ab_small.log 2>&1; tail -3 $O/ab_small.log
ls $O/ab_default $O/ab_small
