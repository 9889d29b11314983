# sparkgrad - make demo | make test (both install whatever is missing first).
# See docs/development.md for every target.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
CC ?= gcc
FUZZ_SECONDS ?= 20
BENCH_ARGS ?=
BENCH_ROUNDS ?= 5
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
CFLAGS_C := -std=c11 -O2 -g -Wall -Wextra -Wno-missing-field-initializers -fopenmp -fno-math-errno -D_GNU_SOURCE -Icsrc
SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer

export PYTHONPATH := $(CURDIR)/python
export PYSPARK_PYTHON := $(CURDIR)/$(PY)
export PYSPARK_DRIVER_PYTHON := $(CURDIR)/$(PY)

.PHONY: all sysdeps deps build ctest test test-faults test-matrix test-torch-matrix demo docs docs-serve asan fuzz format lint wheel wheel-smoke egg bench bench-inflate clean

all: build

sysdeps:
	@bash .ci/install-system-deps

$(DEPS_STAMP): pyproject.toml .ci/buildcfg.py | sysdeps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $$($(PYTHON) .ci/buildcfg.py requirements build runtime test dev docs)
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

# The core without its Python bindings, compiled once into an archive that every C
# test links (each test compiling all of csrc itself took 7 of make test's minutes on
# 2 cores). An object depends on every header: a header change rebuilds the core.
CORE_HDR := $(shell find csrc -name '*.h' -not -path 'csrc/py/*')
build/core/%.o: csrc/%.c $(CORE_HDR) $(DEPS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_C) $$($(PY) .ci/buildcfg.py cflags) -c -o $@ $<

build/asan/core/%.o: csrc/%.c $(CORE_HDR) $(DEPS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_C) $(SANITIZE) $$($(PY) .ci/buildcfg.py cflags) -c -o $@ $<

build/core/libsgcore.a: $(patsubst csrc/%.c,build/core/%.o,$(CORE_SRC))
	@rm -f $@
	$(AR) rcs $@ $^

build/asan/core/libsgcore.a: $(patsubst csrc/%.c,build/asan/core/%.o,$(CORE_SRC))
	@rm -f $@
	$(AR) rcs $@ $^

# C unit tests: each tests/c/test_*.c links the core (no Python) and exits
# non-zero on the first mismatch.
build/ctest/%: tests/c/%.c build/core/libsgcore.a
	@mkdir -p build/ctest
	$(CC) $(CFLAGS_C) $$($(PY) .ci/buildcfg.py cflags) -o $@ $< build/core/libsgcore.a $$($(PY) .ci/buildcfg.py libs)

ctest: deps $(CTESTS)
	@set -e; for t in $(CTESTS); do echo "== $$t"; $$t; done

test: build ctest
	$(PY) -m pytest -q --durations=30 $(PYTEST_ARGS) tests

# The fault suite: SIGKILL / SIGSTOP of nodes and executor JVMs on a standalone Spark cluster the suite starts
# (a master and three workers, one core each), links cut and delayed between network namespaces, a full
# checkpoint disk, floods. Needs root for the namespaces and tmpfs (those tests skip, saying so, without it).
# Writes tests/faults/results.json; tests/faults/render_table.py renders it into docs/guide/faults.md.
test-faults: build
	SPARKGRAD_FAULT_SUITE=1 $(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) tests/faults

# The Spark-facing tests again on the other Spark/Python pairs of the Databricks
# LTS runtimes (README, section Runtimes): each leg is a venv of its own under
# MATRIX_DIR with its own in-place build of sparkgrad._core (the .so name
# carries the interpreter's tag, cpython-310 / -312, so the builds sit side by
# side with the main leg's cpython-311 in python/sparkgrad/). No torch,
# tensorflow or tensorboard here: the tests that need them skip.
MATRIX_DIR ?= .venv-matrix
MATRIX_LEGS := py312-spark40 py310-spark34
MATRIX_TESTS := tests/test_foundation.py tests/test_cluster_spark.py tests/test_cluster_feed.py \
  tests/test_cluster_ps.py tests/test_cluster_local_cluster.py tests/test_record_spark.py tests/test_nn_spark.py \
  tests/test_examples.py tests/test_runner.py tests/test_spark_tfrecords.py tests/test_cluster_recovery.py \
  tests/test_spark_ml.py tests/test_spark_columns.py tests/test_cluster_arrow_feed.py tests/test_spark_shipping.py
# Each leg runs under one NumPy already (1.21.5 in py310-spark34): no venvs of other NumPys per leg.
MATRIX_DESELECT := --deselect tests/test_foundation.py::test_core_imports_under_numpy_1_and_2
# DBR 17.3 LTS: Spark 4.0, Python 3.12; the connect extra brings pandas, pyarrow and grpcio for Spark Connect.
py312-spark40.python = $(shell $(PYTHON) .ci/wheels.py which 3.12)
py312-spark40.pyspark := pyspark[connect]==4.0.1
py312-spark40.tests := $(wildcard tests/test_cluster_connect.py) tests/test_cluster_slots.py tests/test_data_source.py \
  $(wildcard tests/test_data_source_connect.py) $(wildcard tests/test_spark_ml_tables_connect.py)
# DBR 13.3 LTS: Spark 3.4.1 (the version it reports, and the oldest 3.4 a user meets, rather than the newest
# 3.4.4), Python 3.10, and its preinstalled NumPy 1.21.5 at run time.
py310-spark34.python = $(shell $(PYTHON) .ci/wheels.py which 3.10)
py310-spark34.pyspark := pyspark==3.4.1
py310-spark34.numpy := numpy==1.21.5
# ... and its pandas and pyarrow, which DataFrame feeding (mapInArrow) needs on Spark 3.x and tables are read with; and an MLflow 2
# client (file store without MLFLOW_ALLOW_FILE_STORE) for fit(mlflow=...), where the main leg has MLflow 3.
py310-spark34.extra := pandas==1.4.4 pyarrow==8.0.0 mlflow-skinny==2.22.5
# Under that NumPy, also the suites that hand arrays to and from the C core (30 s), and the table reader under
# pyarrow 8, which hands record batches to C through _export_to_c rather than PyCapsules (30 s).
py310-spark34.tests := tests/test_record_example.py tests/test_record_sequence.py tests/test_record_convert.py \
  tests/test_pipeline.py tests/test_nn_api.py tests/test_nn_checkpoint.py tests/test_net_ps.py tests/test_net_feed.py \
  tests/test_net_ps_optim.py tests/test_mlflow_tracking.py tests/test_mlflow_flavor.py tests/test_data_table.py

# $(1): the leg. Its venv holds the build, runtime and test requirements and
# the leg's pyspark. A leg that names its .numpy runs under that NumPy but is
# built, as the released wheels are, against the NumPy that [build-system]
# requires: installed apart in <venv>/build-env, on PYTHONPATH for the build alone.
define MATRIX_LEG
$(MATRIX_DIR)/$(1)/.sparkgrad-deps: pyproject.toml .ci/buildcfg.py | sysdeps
	@test -n "$$($(1).python)" || { echo "test-matrix: no interpreter for leg $(1) (pyenv install it)" >&2; exit 1; }
	test -x $(MATRIX_DIR)/$(1)/bin/python || $$($(1).python) -m venv $(MATRIX_DIR)/$(1)
	$(MATRIX_DIR)/$(1)/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(MATRIX_DIR)/$(1)/bin/python -m pip install -q --disable-pip-version-check "$$($(1).pyspark)" \
	  $$$$($(PYTHON) .ci/buildcfg.py requirements build runtime | grep -v '^numpy') \
	  $$$$($(PYTHON) .ci/buildcfg.py requirements test | grep '^pytest') \
	  $$(or $$($(1).numpy),$$$$($(PYTHON) .ci/buildcfg.py requirements build | grep '^numpy')) $$($(1).extra)
	$$(if $$($(1).numpy),$(MATRIX_DIR)/$(1)/bin/python -m pip install -q --disable-pip-version-check --upgrade \
	  --target $(MATRIX_DIR)/$(1)/build-env $$$$($(PYTHON) .ci/buildcfg.py requirements build | grep '^numpy'))
	touch $$@

$(MATRIX_DIR)/$(1)/.sparkgrad-core: $(CSRC) setup.py $(MATRIX_DIR)/$(1)/.sparkgrad-deps
	$$(if $$($(1).numpy),PYTHONPATH=$(CURDIR)/$(MATRIX_DIR)/$(1)/build-env) \
	  $(MATRIX_DIR)/$(1)/bin/python setup.py -q build_ext --inplace -j 2
	touch $$@

$(MATRIX_DIR)/$(1)/.sparkgrad-bytecode: $(PYSRC) $(MATRIX_DIR)/$(1)/.sparkgrad-deps
	$(MATRIX_DIR)/$(1)/bin/python -m compileall -q python/sparkgrad
	touch $$@

test-matrix-$(1): $(MATRIX_DIR)/$(1)/.sparkgrad-core $(MATRIX_DIR)/$(1)/.sparkgrad-bytecode
	@echo "== test-matrix $(1): Python $$$$($(MATRIX_DIR)/$(1)/bin/python -V | cut -d' ' -f2)," \
	  $$$$($(MATRIX_DIR)/$(1)/bin/python -m pip list 2>/dev/null | grep -iE '^(pyspark|numpy|pandas|pyarrow) ' | tr -s ' ')
	PYSPARK_PYTHON=$(CURDIR)/$(MATRIX_DIR)/$(1)/bin/python PYSPARK_DRIVER_PYTHON=$(CURDIR)/$(MATRIX_DIR)/$(1)/bin/python \
	  $(MATRIX_DIR)/$(1)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) $(MATRIX_DESELECT) $(MATRIX_TESTS) \
	  $$($(1).tests)
endef
$(foreach leg,$(MATRIX_LEGS),$(eval $(call MATRIX_LEG,$(leg))))

test-matrix: sysdeps $(addprefix test-matrix-,$(MATRIX_LEGS))

# The PyTorch suites again under the other torch releases that install here at a practical size
# (docs/guide/pytorch.md, "Supported versions"); the main venv has torch 2.13.0, a CPU build. Each leg is a
# venv under MATRIX_DIR on the main venv's Python, so it loads the main build of sparkgrad._core.
# py311-torch214: 2.14.1, the newest release pip takes here, a CUDA build run on the CPU (5.5 GB in its
# venv; pip takes it from this machine's disk in about 4 minutes, pyspark and the rest in about 4 more,
# and the tests take 3 to 4).
# py311-torch21: 2.1.2, the oldest release the torch extra admits (2.1), a CUDA build that PyPI serves
# (4.8 GB in its venv, 9 minutes to download and install here) with the NumPy 1 it was built for.
# `make test-torch-matrix` (which .ci/run calls: too long to add to test-matrix) runs TORCH_LEGS, by default
# the first; `make test-torch-matrix TORCH_LEGS="py311-torch21 py311-torch214"` runs both.
TORCH_LEGS ?= py311-torch214
TORCH_ALL_LEGS := py311-torch214 py311-torch21
py311-torch214.torch := torch==2.14.1
py311-torch21.torch := torch==2.1.2 numpy<2
TORCH_TESTS := tests/test_hvd_torch.py tests/test_torch_distributor.py

define TORCH_LEG
$(MATRIX_DIR)/$(1)/.sparkgrad-deps: pyproject.toml .ci/buildcfg.py | $(DEPS_STAMP)
	test -x $(MATRIX_DIR)/$(1)/bin/python || $(PYTHON) -m venv $(MATRIX_DIR)/$(1)
	$(MATRIX_DIR)/$(1)/bin/python -m pip install -q --disable-pip-version-check $$(foreach r,$$($(1).torch),"$$(r)") \
	  $$$$($(PYTHON) .ci/buildcfg.py requirements runtime) \
	  $$$$($(PYTHON) .ci/buildcfg.py requirements test | grep -E '^(pyspark|pyarrow|pandas|pytest)')
	touch $$@

test-torch-matrix-$(1): build $(MATRIX_DIR)/$(1)/.sparkgrad-deps
	@echo "== test-torch-matrix $(1):" $$$$($(MATRIX_DIR)/$(1)/bin/python -m pip list 2>/dev/null | grep -E '^torch ' | tr -s ' ')
	PYSPARK_PYTHON=$(CURDIR)/$(MATRIX_DIR)/$(1)/bin/python PYSPARK_DRIVER_PYTHON=$(CURDIR)/$(MATRIX_DIR)/$(1)/bin/python \
	  $(MATRIX_DIR)/$(1)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) $(TORCH_TESTS)
endef
$(foreach leg,$(TORCH_ALL_LEGS),$(eval $(call TORCH_LEG,$(leg))))

test-torch-matrix: $(addprefix test-torch-matrix-,$(TORCH_LEGS))

$(INSTALL_STAMP): $(CSRC) $(PYSRC) setup.py pyproject.toml $(DEPS_STAMP)
	$(PIP) install -q --no-build-isolation --no-deps .
	$(PIP) install -q $$($(PYTHON) .ci/buildcfg.py requirements spark)
	touch $@

# The documentation site (mkdocs.yml): built strictly into build/site, where a broken link or anchor, a
# missing page or a docstring mkdocstrings cannot render fails the build. The API pages are read statically
# (no import); the guide's examples run under `make test` (tests/test_docs.py). docs-serve rebuilds on change.
docs: deps
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --clean --quiet
	@echo "docs: built build/site/index.html"

docs-serve: deps
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict --dev-addr 127.0.0.1:8000

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

build/asan/ctest/%: tests/c/%.c build/asan/core/libsgcore.a
	@mkdir -p build/asan/ctest
	$(CC) $(CFLAGS_C) $(SANITIZE) $$($(PY) .ci/buildcfg.py cflags) -o $@ $< build/asan/core/libsgcore.a \
	  $$($(PY) .ci/buildcfg.py libs)

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

C_FORMAT_FILES = $(shell find csrc tests/c tests/fuzz bench -name '*.c' -o -name '*.h' 2>/dev/null)

format: deps
	@bash .ci/install-system-deps clang-format
	clang-format -i $(C_FORMAT_FILES)
	$(VENV)/bin/ruff format python tests bench notebooks setup.py .ci/buildcfg.py .ci/wheels.py
	$(VENV)/bin/ruff check --fix python tests bench notebooks setup.py .ci/buildcfg.py .ci/wheels.py

lint: deps
	@bash .ci/install-system-deps clang-format
	clang-format --dry-run -Werror $(C_FORMAT_FILES)
	$(VENV)/bin/ruff check python tests bench notebooks setup.py .ci/buildcfg.py .ci/wheels.py
	$(VENV)/bin/ruff format --check python tests bench notebooks setup.py .ci/buildcfg.py .ci/wheels.py

$(RELEASE_STAMP): pyproject.toml $(DEPS_STAMP)
	$(PIP) install -q $$($(PYTHON) .ci/buildcfg.py requirements release)
	touch $@

# One manylinux wheel per CPython in WHEEL_PYTHONS, each built in its own venv
# under build/release/ and repaired by auditwheel (oneDNN, OpenMP, cJSON,
# libcrypto and libfarmhash vendored); then `auditwheel show` of each. See .ci/wheels.py.
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

# make bench BENCH_ARGS=--quick: every bench once, a smoke run (its figures are not comparable). make bench passes
# --update: the benches write bench/results/ (run alone, a bench writes build/bench-results/), then report.py renders
# README.md's summary, docs/guide/performance.md and the charts from them.
# From a fresh clone on 2 quiet cores (2026-12-03, AMD EPYC): 15 min 58 s in all, of which the venv,
# build and anchors took 2 min 6 s (system packages present, pip's cache warm; 4 min 56 s on
# 2026-12-02 with nothing installed) and the benches 13 min 49 s. bench_train is the longest (5.0 min:
# about 20 subprocesses, two torch.compile and four XLA compiles; measured before its binary and regression
# rows, two more MLP-sized models: 2.3 of its 7.3 min with --quick on a loaded machine), then bench_feed (2.1 min) and
# bench_cluster (1.6 min; TensorFlowOnSpark's shutdown() alone sleeps 5 s per poll). bench_tabular (added after
# that count) took 8.2 min with --quick on a loaded machine (load 2.8 to 6; about 40 subprocesses, 3 seeds per
# system for its AUC and R2) before sparkgrad had Embedding; its full run (2M-row tables, 1 and 2 threads) is
# longer: every configuration of a dense 2M-row table steps at about 0.1 to 0.4 s.
bench: build $(ANCHORS_STAMP) build/bench/gemm_peak
	@mkdir -p bench/results
	@set -e; for b in bench/bench_*.py bench/accuracy_cnn.py; do [ -e "$$b" ] || continue; echo "== $$b"; $(PY) $$b --update $(BENCH_ARGS); done
	$(PY) bench/report.py

# Where the time of reading GZIP TFRecords goes, per inflate backend (the inflater alone, the
# reader with and without CRCs), on bench_records.py's files: see bench/inflate_breakdown.c.
build/bench/inflate_breakdown: bench/inflate_breakdown.c $(CSRC) $(DEPS_STAMP)
	@mkdir -p build/bench
	$(CC) $(CFLAGS_C) -O3 $$($(PY) .ci/buildcfg.py cflags) -o $@ $< $(CORE_SRC) $$($(PY) .ci/buildcfg.py libs)

# oneDNN's matmul rate, one of the GEMM bounds bench_train.py measures (see bench/gemm_peak.c).
build/bench/gemm_peak: bench/gemm_peak.c $(DEPS_STAMP)
	@mkdir -p build/bench
	$(CC) $(CFLAGS_C) $$($(PY) .ci/buildcfg.py cflags) -o $@ $< $$($(PY) .ci/buildcfg.py libs)

bench-inflate: build build/bench/inflate_breakdown
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	  $(PY) -c 'import sys; sys.path.insert(0, "bench"); from bench_records import prepare; prepare(sys.argv[1])' "$$d" && \
	  build/bench/inflate_breakdown "$$d/train.tfrecords" "$$d/train.tfrecords.gz" $(BENCH_ROUNDS)

clean:
	rm -rf build dist $(MATRIX_DIR)/*/.sparkgrad-core python/sparkgrad/_core*.so python/sparkgrad/*.stamp *.egg-info python/*.egg-info
	find python -name __pycache__ -type d -prune -exec rm -rf {} +
