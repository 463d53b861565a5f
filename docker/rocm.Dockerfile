# The AMD CI image: rocm/pytorch (ROCm, hipcc and torch's own Triton, `pytorch-triton-rocm`)
# plus the test and benchmark dependencies. PyPI's triton is not installed: it would shadow the
# ROCm one. Pin BASE_IMAGE (repository variable ROCM_IMAGE) to a tag for reproducible runs.
# build: docker/run.sh build rocm; run with --device /dev/kfd --device /dev/dri (docker/run.sh)
ARG BASE_IMAGE=rocm/pytorch:latest
FROM ${BASE_IMAGE}
RUN python3 -m pip install --no-cache-dir "pandas>=1.5" "tabulate>=0.9" "pytest>=7" \
        "hypothesis>=6.80" ninja \
    && python3 -c "import torch; assert torch.version.hip, 'not a ROCm torch'; print('torch', torch.__version__, 'hip', torch.version.hip)"
WORKDIR /src
