# The NVIDIA CI image: a CUDA PyTorch image (the devel variant: nvcc builds the HIP backend's CUDA
# form) plus the test and benchmark dependencies. Triton comes with torch.
# build: docker/run.sh build cuda   (BASE_IMAGE overrides the base)
ARG BASE_IMAGE=pytorch/pytorch:2.7.0-cuda12.8-cudnn9-devel
FROM ${BASE_IMAGE}
RUN python3 -m pip install --no-cache-dir "pandas>=1.5" "tabulate>=0.9" "pytest>=7" \
        "hypothesis>=6.80" ninja \
    && python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
WORKDIR /src
