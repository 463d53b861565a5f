# Two commands from a clean clone:  `make run` (the main job)  and  `make test` (the test suite).
# Both bootstrap .venv (with --system-site-packages so a preinstalled GPU torch/triton is reused).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
RESULTS_DIR ?= results

.PHONY: run test test-gpu-triton gpu clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	# torch==2.13.0 is a CPU build on local disk here; a bare `torch` would pull several GB of CUDA.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	# triton comes with ROCm/CUDA torch builds; install PyPI's only where none is importable.
	$(PY) -c "import triton" 2>/dev/null || $(PY) -m pip install -q "triton>=2.3"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

run: $(VENV)/.installed
	$(PY) -m pagedattn.bench run --out $(RESULTS_DIR)

test: $(VENV)/.installed
	$(PY) -m pytest -q tests

# The offline sm_90 compile checks again under the GPU machine's triton (the H200 runs 3.6):
# compilers differ (3.6 did not pipeline a loop that 3.9 did: docs/performance.md). A venv
# holding only that triton; everything else comes from .venv through a .pth file.
GPU_TRITON ?= 3.6.0
VENV_GT    := .venv-triton-$(GPU_TRITON)
$(VENV_GT)/.installed: $(VENV)/.installed
	$(PYTHON) -m venv $(VENV_GT)
	$(VENV_GT)/bin/python -m pip install -q --no-deps triton==$(GPU_TRITON)
	$(PY) -c "import sys; print('\n'.join(p for p in sys.path if p.endswith('-packages')))" \
		> "$$($(VENV_GT)/bin/python -c 'import site; print(site.getsitepackages()[0])')/zz_main_venv.pth"
	touch $@

test-gpu-triton: $(VENV_GT)/.installed
	$(VENV_GT)/bin/python -c "import triton; assert triton.__version__ == '$(GPU_TRITON)'"
	$(VENV_GT)/bin/python -m pytest -q tests/test_triton_decode_compile.py \
		tests/test_triton_extend_compile.py tests/test_triton_store_copy.py -k "compile"

# A GPU machine (NVIDIA, AMD or Hygon): torch and triton are preinstalled, so nothing is
# installed (FlashInfer wheels carried in .whl/ are unpacked to /tmp/site); the self-check, the
# GPU test tier and the tables of record run in one go and write under $(RESULTS_DIR).
gpu:
	bash scripts/gpu_run.sh $(RESULTS_DIR)

clean:
	rm -rf $(VENV) build *.egg-info
