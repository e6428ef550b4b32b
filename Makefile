# make dev   — .venv with the core, every plugin and example in editable mode, and test deps
# make test  — ruff check, then the whole suite inside .venv (two xdist workers, then the serial tests)
# make test-install — the README's board install lines in fresh venvs (needs the package index; minutes)
# make test-aarch64 — the own ops' tests on AArch64 under qemu-user (scripts/test_aarch64.sh; apt-get the first time)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
PROJECTS := . $(sort $(dir $(wildcard plugins/*/pyproject.toml examples/*/pyproject.toml)))
STAMP := $(VENV)/.edgeinfer-dev

# llama.cpp for plugins/llamacpp: llama-cpp-python built from its source distribution (pip caches the wheel it
# builds, so only the first make dev compiles: minutes on 2 cores), then the llama.cpp source of that version
# (its convert_hf_to_gguf.py) fetched into the edgeinfer cache for the converter
LLAMACPP_VERSION := 0.3.36
LLAMACPP_CMAKE := -DLLAVA_BUILD=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF

.PHONY: dev test test-install test-aarch64 lint bench clean prometheus

dev: $(STAMP)

$(STAMP): Makefile requirements-dev.txt requirements-nodeps.txt pyproject.toml $(wildcard plugins/*/pyproject.toml examples/*/pyproject.toml)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip 'setuptools>=77,<81' wheel
	$(PIP) install -r requirements-dev.txt
	$(PIP) install --no-deps rknn-toolkit2==2.5.0
	$(PIP) install --no-deps -r requirements-nodeps.txt
	# a torchvision left by an earlier install (optimum-intel's metadata) breaks model imports: remove it
	! $(PY) -m pip show -q torchvision 2>/dev/null || $(PIP) uninstall -y torchvision
	CMAKE_ARGS="$(LLAMACPP_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=2 \
		$(PIP) install --no-binary llama-cpp-python llama-cpp-python==$(LLAMACPP_VERSION) 'sentencepiece>=0.1.98,<0.3.0'
	$(PIP) install --no-build-isolation $(foreach p,$(PROJECTS),-e $(p))
	$(PY) -c "from edgeinfer_llamacpp.convert import source_tree; print('llama.cpp source:', source_tree())"
	$(MAKE) --no-print-directory prometheus
	touch $(STAMP)

# Prometheus for tests/test_prometheus_scrape.py: Debian's package, where apt-get exists and we are root or have
# password-less sudo. Never fatal: the test skips without the binary.
prometheus:
	@command -v prometheus >/dev/null && exit 0; \
	command -v apt-get >/dev/null || { echo "make dev: no apt-get; install prometheus to run tests/test_prometheus_scrape.py"; exit 0; }; \
	SUDO=; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; APT="$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -q -y"; \
	echo "make dev: apt-get install prometheus"; \
	$$APT install --no-install-recommends prometheus >/dev/null 2>&1 || \
	{ $$APT update >/dev/null 2>&1 && $$APT install --no-install-recommends prometheus >/dev/null 2>&1; } || \
	echo "make dev: could not install prometheus (tests/test_prometheus_scrape.py will skip)"

PYTEST_ARGS ?= --durations=30  # the slowest tests, so the suite's time stays watched
XDIST_ARGS ?= -n 2 --dist loadgroup  # -n 0: the first pass in one process too

# two passes (docs/architecture.md#tests): the suite on two pytest-xdist workers, then the tests marked `serial`
# (they cannot share the machine with another worker) alone. pytest exits 5 when a pass selects no tests: that
# pass is fine if the other one ran tests (PYTEST_ARGS naming serial tests only, say); every other failure of
# either pass fails the target, after both have run
test: dev lint
	@rc1=0; rc2=0; \
	$(PY) -m pytest $(XDIST_ARGS) -m "not serial" $(PYTEST_ARGS) || rc1=$$?; \
	$(PY) -m pytest -m serial $(PYTEST_ARGS) || rc2=$$?; \
	echo "make test: parallel pass exit $$rc1, serial pass exit $$rc2"; \
	if [ $$rc1 = 5 ] && [ $$rc2 = 5 ]; then exit 5; fi; \
	for rc in $$rc1 $$rc2; do [ $$rc = 0 ] || [ $$rc = 5 ] || exit $$rc; done

# opt-in (tests/test_board_install.py skips these without EDGEINFER_INSTALL_TESTS=1): the decoder line runs a decoder
# bundle, the encoder line alone answers one with exit 3 naming the extra
test-install: dev
	EDGEINFER_INSTALL_TESTS=1 $(PY) -m pytest tests/test_board_install.py -q

test-aarch64: dev
	PY=$(PY) scripts/test_aarch64.sh

lint: dev
	$(VENV)/bin/ruff check .

# every benchmark that runs without arguments; not the helpers (bench/_*.py), nor the three that measure what you
# name: int8_block.py and serve_processes.py a bundle, planner_v2_baseline.py an old checkout (see their --help)
BENCH_BY_HAND := bench/int8_block.py bench/serve_processes.py bench/planner_v2_baseline.py
bench: dev
	for b in $(filter-out bench/_% $(BENCH_BY_HAND),$(sort $(wildcard bench/*.py))); do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
