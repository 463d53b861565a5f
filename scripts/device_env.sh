# Sourced (from the repository root) by scripts/gpu_run.sh: carried wheels (the FlashInfer peer,
# scripts/fetch_gpu_wheels.sh), import paths, the commit label (COMMIT), and the packing of PACK_DIR into
# TOP/results.tgz at exit. Needs TOP and PACK_DIR set. Works on CUDA, ROCm and DTK machines: no
# step here needs nvcc or nvidia-smi.
# shellcheck shell=bash
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
# FlashInfer kernels prebuilt for sm_90a on a CPU machine (.ficache/README.txt): no JIT on the GPU
[ -d .ficache/flashinfer_jit_cache ] && export PYTHONPATH=${PYTHONPATH:-}:$PWD/.ficache
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
# the commit the results report (a copy of the tree without .git: set COMMIT from the checkout)
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export COMMIT
pack() { tar czf "$TOP/results.tgz" -C "$PACK_DIR" . 2>/dev/null; }
trap pack EXIT
# pytest -n N: N torch processes each spinning one OpenMP thread per core starve the CPU-side
# oracles (tests that pass in 3 s alone never finished in 320 s on a 16-core host)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
