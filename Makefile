# Quick start: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test test-numerics lint bench clean

install: $(STAMP)

# torch first (==2.13.0 takes the local CPU build), then mlagents-envs 1.1.0 the only way that
# works on Python >= 3.11 (no deps, its pins ignored), then the project with every extra but npu.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps --ignore-requires-python mlagents-envs==1.1.0
	$(PY) -m pip install -q -e ".[onnx,unity,serve,dev]"
	touch $(STAMP)

run: install
	$(VENV)/bin/huggy rollout --episodes 20

test: install
	RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 $(PY) -m pytest -q

# The numerics tests again under other CPU kernel paths, standing in for CPUs we don't have:
# one thread; torch's AVX2 kernels with MKL's AVX2 path; torch's scalar kernels.
KERNEL_PATHS := "OMP_NUM_THREADS=1" \
	"ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2" \
	"ATEN_CPU_CAPABILITY=default"

test-numerics: install
	@set -e; for paths in $(KERNEL_PATHS); do \
		echo "== numerics tests with $$paths"; \
		env $$paths $(PY) -m pytest -q -m numerics; \
	done

lint: install
	$(VENV)/bin/ruff check .

# Benchmarks are not part of the test suite; each prints ratios against a baseline of the same run.
bench: install
	$(VENV)/bin/huggy benchmark
	$(PY) bench/bench_envs.py
	RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 $(PY) bench/bench_evaluate.py
	RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 $(PY) bench/bench_serve.py

clean:
	rm -rf $(VENV) build *.egg-info
