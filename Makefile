# sparkgrad - make demo | make test (both install whatever is missing first).
# See README.md, section Development, for every target.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
CC ?= gcc
FUZZ_SECONDS ?= 20
BENCH_ARGS ?=
PYTEST_ARGS ?=

DEPS_STAMP := $(VENV)/.sparkgrad-deps
INSTALL_STAMP := $(VENV)/.sparkgrad-installed
ANCHORS_STAMP := $(VENV)/.sparkgrad-anchors
RELEASE_STAMP := $(VENV)/.sparkgrad-release
WHEEL_PYTHONS ?= 3.10 3.11 3.12
EGG_PYTHONS ?= 3.10 3.11
CSRC := $(shell find csrc -name '*.c' -o -name '*.h')
CORE_SRC := $(shell find csrc -name '*.c' -not -path 'csrc/py/*')
PYSRC := $(shell find python -name '*.py' -o -name '*.pyi')
CTESTS := $(patsubst tests/c/%.c,build/ctest/%,$(wildcard tests/c/test_*.c))
FUZZERS := $(patsubst tests/fuzz/%.c,build/fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))
CFLAGS_C := -std=c11 -O2 -g -Wall -Wextra -Wno-missing-field-initializers -fopenmp -D_GNU_SOURCE -Icsrc
SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer

export PYTHONPATH := $(CURDIR)/python
export PYSPARK_PYTHON := $(CURDIR)/$(PY)
export PYSPARK_DRIVER_PYTHON := $(CURDIR)/$(PY)

.PHONY: all sysdeps deps build ctest test demo asan fuzz format lint wheel wheel-smoke egg bench clean

all: build

sysdeps:
	@bash .ci/install-system-deps

$(DEPS_STAMP): pyproject.toml .ci/buildcfg.py | sysdeps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $$($(PYTHON) .ci/buildcfg.py requirements build runtime test dev)
	touch $@

deps: sysdeps $(DEPS_STAMP)

python/sparkgrad/_core.stamp: $(CSRC) setup.py $(DEPS_STAMP)
	$(PY) setup.py -q build_ext --inplace -j 2
	touch $@

# Bytecode for the in-tree package, as pip writes it when it installs the
# wheel: Spark's executors (and every test's subprocess) then load .pyc files
# instead of compiling sparkgrad from source at each start (40 ms of CPU per
# Python worker; more where PYTHONDONTWRITEBYTECODE keeps Python from caching it).
python/sparkgrad/_bytecode.stamp: $(PYSRC) $(DEPS_STAMP)
	$(PY) -m compileall -q python/sparkgrad
	touch $@

build: deps python/sparkgrad/_core.stamp python/sparkgrad/_bytecode.stamp

# C unit tests: each tests/c/test_*.c links the core (no Python) and exits
# non-zero on the first mismatch.
build/ctest/%: tests/c/%.c $(CSRC) $(DEPS_STAMP)
	@mkdir -p build/ctest
	$(CC) $(CFLAGS_C) $(CTEST_FLAGS) $$($(PY) .ci/buildcfg.py cflags) -o $@ $< $(CORE_SRC) $$($(PY) .ci/buildcfg.py libs)

ctest: deps $(CTESTS)
	@set -e; for t in $(CTESTS); do echo "== $$t"; $$t; done

test: build ctest
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

$(INSTALL_STAMP): $(CSRC) $(PYSRC) setup.py pyproject.toml $(DEPS_STAMP)
	$(PIP) install -q --no-build-isolation --no-deps .
	$(PIP) install -q $$($(PYTHON) .ci/buildcfg.py requirements spark)
	touch $@

# The main job: run from the installed package, not from the tree.
demo: deps $(INSTALL_STAMP)
	cd /tmp && env -u PYTHONPATH $(CURDIR)/$(PY) -m sparkgrad.examples.mnist_dist --mode tensorflow

# ASan + UBSan: a separate copy of the package with an instrumented core, the
# C tests rebuilt with the sanitizers, and pytest with libasan preloaded.
asan: deps
	rm -rf build/asan && mkdir -p build/asan && cp -r python build/asan/py
	SPARKGRAD_SANITIZE=1 $(PY) setup.py -q build_ext --build-lib build/asan/py --build-temp build/asan/tmp -j 2
	$(MAKE) --no-print-directory ctest CTESTS="$(patsubst build/ctest/%,build/asan/ctest/%,$(CTESTS))"
	PYTHONPATH=$(CURDIR)/build/asan/py PYTHONMALLOC=malloc \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	  $(PY) -m pytest -q -p no:cacheprovider -m "not spark and not slow" $(PYTEST_ARGS) tests

build/asan/ctest/%: tests/c/%.c $(CSRC) $(DEPS_STAMP)
	@mkdir -p build/asan/ctest
	$(CC) $(CFLAGS_C) $(SANITIZE) $$($(PY) .ci/buildcfg.py cflags) -o $@ $< $(CORE_SRC) $$($(PY) .ci/buildcfg.py libs)

# libFuzzer harnesses (tests/fuzz/fuzz_*.c), each run FUZZ_SECONDS over its
# seed corpus tests/fuzz/corpus/<name>/.
build/fuzz/%: tests/fuzz/%.c $(CSRC) $(DEPS_STAMP)
	@mkdir -p build/fuzz
	clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Icsrc $$($(PY) .ci/buildcfg.py cflags) \
	  -o $@ $< $(CORE_SRC) $$($(PY) .ci/buildcfg.py libs) -fopenmp=libgomp

fuzz: deps
	@bash .ci/install-system-deps clang libclang-rt-14-dev libomp-14-dev
	@$(MAKE) --no-print-directory $(FUZZERS)
	@set -e; if [ -z "$(FUZZERS)" ]; then echo "fuzz: no harnesses under tests/fuzz"; fi; \
	for f in $(FUZZERS); do n=$$(basename $$f); mkdir -p build/fuzz/work/$$n tests/fuzz/artifacts; \
	  echo "== $$n ($(FUZZ_SECONDS) s)"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=tests/fuzz/artifacts/ -print_final_stats=1 \
	    build/fuzz/work/$$n tests/fuzz/corpus/$$n; done

C_FORMAT_FILES = $(shell find csrc tests/c tests/fuzz -name '*.c' -o -name '*.h' 2>/dev/null)

format: deps
	@bash .ci/install-system-deps clang-format
	clang-format -i $(C_FORMAT_FILES)
	$(VENV)/bin/ruff format python tests bench setup.py .ci/buildcfg.py .ci/wheels.py
	$(VENV)/bin/ruff check --fix python tests bench setup.py .ci/buildcfg.py .ci/wheels.py

lint: deps
	@bash .ci/install-system-deps clang-format
	clang-format --dry-run -Werror $(C_FORMAT_FILES)
	$(VENV)/bin/ruff check python tests bench setup.py .ci/buildcfg.py .ci/wheels.py
	$(VENV)/bin/ruff format --check python tests bench setup.py .ci/buildcfg.py .ci/wheels.py

$(RELEASE_STAMP): pyproject.toml $(DEPS_STAMP)
	$(PIP) install -q $$($(PYTHON) .ci/buildcfg.py requirements release)
	touch $@

# One manylinux wheel per CPython in WHEEL_PYTHONS, each built in its own venv
# under build/release/ and repaired by auditwheel (oneDNN, OpenMP, cJSON and
# libcrypto vendored); then `auditwheel show` of each. See .ci/wheels.py.
wheel: deps $(RELEASE_STAMP)
	env -u PYTHONPATH $(PY) .ci/wheels.py wheels --out dist $(WHEEL_PYTHONS)
	env -u PYTHONPATH $(PY) .ci/wheels.py show dist

# Eggs for the runtimes that attach them (Databricks 13.3 LTS and older), made
# from the repaired wheels: they import with nothing but NumPy installed.
egg: wheel
	env -u PYTHONPATH $(PY) .ci/wheels.py eggs --out dist $(EGG_PYTHONS)

# The release artifacts as users get them: tests/test_packaging.py installs
# each wheel and egg in fresh venvs (one OpenMP runtime, pip's refusals, the
# import errors), then .ci/wheel-smoke installs the wheel for a minimal Debian
# chroot's Python (no compiler, no libcjson, no libgomp) from a local
# wheelhouse and smoke-tests it there without network. Needs root.
wheel-smoke: egg
	SPARKGRAD_DIST=$(CURDIR)/dist $(PY) -m pytest -q $(PYTEST_ARGS) tests/test_packaging.py
	PY=$(PY) bash .ci/wheel-smoke dist

$(ANCHORS_STAMP): pyproject.toml $(DEPS_STAMP)
	$(PIP) install -q $$($(PYTHON) .ci/buildcfg.py requirements anchors)
	touch $@

bench: build $(ANCHORS_STAMP)
	@mkdir -p bench/results
	@set -e; for b in bench/bench_*.py; do [ -e "$$b" ] || continue; echo "== $$b"; $(PY) $$b $(BENCH_ARGS); done
	$(PY) bench/report.py

clean:
	rm -rf build dist python/sparkgrad/_core*.so python/sparkgrad/*.stamp *.egg-info python/*.egg-info
	find python -name __pycache__ -type d -prune -exec rm -rf {} +
