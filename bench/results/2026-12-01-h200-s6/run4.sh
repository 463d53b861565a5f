#!/usr/bin/env bash
# Session-6 call 4: bisect the persistent HIP decode's per-tile branches (build switches), and
# the old kernel (bdaeb73, oldpkg/) timed the same way. (Fixed after the run: the default entry
# was written "default::", so env got ":" and that variant did not run.)
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
V="default: lazy0:PAGEDATTN_HIP_DECODE_LAZY=0 full0:PAGEDATTN_HIP_DECODE_FULL_TILES=0 both0:PAGEDATTN_HIP_DECODE_LAZY=0,PAGEDATTN_HIP_DECODE_FULL_TILES=0"
for v in $V; do n=${v%%:*}; e=${v#*:}; (env $(echo $e | tr ',' ' ') python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_$n.log 2>&1) & done
(PYTHONPATH=$PWD/oldpkg:$PYTHONPATH python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_old.log 2>&1) &
wait
for v in $V; do n=${v%%:*}; e=${v#*:}; echo "== $n"; env $(echo $e | tr ',' ' ') timeout 100 python3 scripts/hip_grid_sweep.py --mults 1 --shapes quick 2>&1 | tail -5 | tee $O/sweep_$n.log; done
echo "== old (bdaeb73)"; PYTHONPATH=$PWD/oldpkg:$PYTHONPATH timeout 100 python3 scripts/hip_grid_sweep.py --mults 1 --shapes quick 2>&1 | tail -5 | tee $O/sweep_old.log
