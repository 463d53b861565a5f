# Two commands from a clean clone:  `make run` (the main job)  and  `make test` (the test suite).
# Both bootstrap .venv (with --system-site-packages so a preinstalled GPU torch/triton is reused).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
RESULTS_DIR ?= results

.PHONY: run test gpu clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	# torch==2.13.0 is a CPU build on local disk here; a bare `torch` would pull several GB of CUDA.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	# triton comes with ROCm/CUDA torch builds; install PyPI's only where none is importable.
	$(PY) -c "import triton" 2>/dev/null || $(PY) -m pip install -q "triton>=2.3"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

run: $(VENV)/.installed
	$(PY) -m bench run --out $(RESULTS_DIR)

test: $(VENV)/.installed
	$(PY) -m pytest -q tests

# The GPU machine: torch and triton are preinstalled and there is no network, so nothing is
# installed; the GPU test tier and the benchmarks run in one go and write under $(RESULTS_DIR).
gpu:
	mkdir -p $(RESULTS_DIR)
	PAGEDATTN_VALIDATE=1 PYTHONPATH=$(CURDIR) $(PYTHON) -m pytest -q tests \
		--junitxml=$(RESULTS_DIR)/gpu-tests.xml 2>&1 | tee $(RESULTS_DIR)/gpu-tests.log; true
	PYTHONPATH=$(CURDIR) $(PYTHON) -m bench all --out $(RESULTS_DIR) 2>&1 | tee $(RESULTS_DIR)/bench.log

clean:
	rm -rf $(VENV) build *.egg-info
