# shellcheck shell=bash disable=SC2034  # sourced; PY is for the commands typed after it
export PYTHONPATH=/tmp/site:/tmp/fidep:/tmp/torchstub:/tmp
export FLASHINFER_CUDA_ARCH_LIST=9.0a
export FLASHINFER_WORKSPACE_BASE=/tmp/fiws
export CUDA_HOME=/usr/local/cuda-13.0
export FLASHINFER_EXTRA_LDFLAGS="-L/tmp/cudastub"
export MAX_JOBS=2
export PATH=/tmp/fidep/bin:$PATH
PY=/root/.pyenv/versions/3.12.1/bin/python3.12
export FLASHINFER_EXTRA_CUDAFLAGS="-isystem /tmp/curand/nvidia/cu13/include"
