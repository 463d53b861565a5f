#!/usr/bin/env bash
# Build and run the CI images (docker/FLAVOUR.Dockerfile) with the devices each GPU stack needs.
# usage: docker/run.sh build FLAVOUR           FLAVOUR: cuda | rocm | dtk
#        docker/run.sh run FLAVOUR CMD...      the checkout mounted at /src, CMD run there
#        docker/run.sh run-cpu FLAVOUR CMD...  the same without GPU devices (compile-only jobs)
# BASE_IMAGE overrides the flavour's base image (required for dtk: Hygon's DTK PyTorch images
# come from Hygon's registry); IMAGE names the built image (default pagedattn-ci:FLAVOUR).
# Devices: NVIDIA --gpus all; ROCm and DTK --device /dev/kfd --device /dev/dri (and /dev/mkfd
# where the host has it), the video group; DTK also the host's /opt/hyhal, read-only.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:?usage: docker/run.sh build|run|run-cpu FLAVOUR [CMD...]}
flavour=${2:?FLAVOUR: cuda, rocm or dtk}
shift 2
case $flavour in cuda|rocm|dtk) ;; *) echo "docker/run.sh: unknown flavour $flavour" >&2; exit 2;; esac
image=${IMAGE:-pagedattn-ci:$flavour}

if [ "$what" = build ]; then
  args=()
  if [ -n "${BASE_IMAGE:-}" ]; then
    args=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
  elif [ "$flavour" = dtk ]; then
    echo "docker/run.sh: set BASE_IMAGE to a DTK PyTorch image" >&2
    exit 2
  fi
  exec docker build "${args[@]}" -f "docker/$flavour.Dockerfile" -t "$image" docker
fi

devices=()
if [ "$what" = run ]; then
  if [ "$flavour" = cuda ]; then
    devices=(--gpus all)
  else
    devices=(--device /dev/kfd --device /dev/dri --group-add video
             --security-opt seccomp=unconfined)
    [ -e /dev/mkfd ] && devices+=(--device /dev/mkfd)
    [ "$flavour" = dtk ] && devices+=(-v /opt/hyhal:/opt/hyhal:ro)
  fi
elif [ "$what" != run-cpu ]; then
  echo "docker/run.sh: unknown command $what" >&2
  exit 2
fi
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
exec docker run --rm --ipc=host --shm-size 16g "${devices[@]}" -e "COMMIT=$commit" \
  -e CI -e GITHUB_ACTIONS -v "$PWD:/src" -w /src "$image" "$@"
