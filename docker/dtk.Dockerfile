# The Hygon DCU CI image: a DTK PyTorch image from Hygon's developer registry (DTK's hipcc and
# torch, and DTK's own Triton where the image ships it) plus the test and benchmark dependencies.
# There is no public default: BASE_IMAGE (repository variable DTK_IMAGE) names the image.
# build: docker/run.sh build dtk; run with --device /dev/kfd --device /dev/dri and the host's
# /opt/hyhal mounted (docker/run.sh)
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN python3 -m pip install --no-cache-dir "pandas>=1.5" "tabulate>=0.9" "pytest>=7" \
        "hypothesis>=6.80" ninja \
    && python3 -c "import torch; assert torch.version.hip, 'not a DTK torch'; print('torch', torch.__version__, 'hip', torch.version.hip)"
WORKDIR /src
