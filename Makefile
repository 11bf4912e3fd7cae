# Two entry points: `make run` (install + serve the app) and `make test` (install + run tests).
# The install is stamped, so a second run of either starts in seconds.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BROWSER_STAMP := $(VENV)/.browser
# `make run` serves on this machine only; `make run HOST=0.0.0.0` serves to the network (then
# only allowlisted models load: see docs/serving.md). Set on the command line:
# an environment variable HOST (set by some shells to the host name) is ignored.
HOST := 127.0.0.1
PORT := 8501
# pytest-xdist workers for `make test`: one per core (`make test TEST_WORKERS=0` runs serially).
# --dist loadscope: each test module on one worker, so a module's fixtures (a served app and a
# browser, a torchrun start, an extracted corpus) are built once, not once per worker.
TEST_WORKERS ?= auto
TEST_DIST ?= loadscope
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install run test test-portable lint docs browser bench assets assets-projections assets-adapter mutation

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -r requirements-dev.txt
	$(BIN)/pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

# Debian's chromium for the real-browser tests (Playwright's own browser download is not available).
$(BROWSER_STAMP):
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq chromium chromium-driver >/dev/null; fi; \
	fi
	touch $(BROWSER_STAMP)

browser: $(STAMP) $(BROWSER_STAMP)

run: install
	$(BIN)/python -m app.serve --server.port $(PORT) --server.headless true --server.address $(HOST)

lint: install
	$(BIN)/ruff check .

# The documentation site (MkDocs Material, API pages from the docstrings): strict, so a broken
# link, a missing anchor or a docstring the reference cannot render fails the build.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

test: install browser
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(if $(filter 0,$(TEST_WORKERS)),,--dist $(TEST_DIST))

# The numerical tests (marker `numerical`: float comparisons, tolerances from tests/tolerances.py)
# again under torch's other CPU kernels: plain C++ (`default`), AVX2 and AVX-512, set by
# ATEN_CPU_CAPABILITY, with MKL's and oneDNN's instruction sets lowered to match. A tolerance
# that only one CPU's kernels meet fails here rather than on another machine. A capability
# this CPU lacks is skipped, saying so (torch would quietly run a lower one). CI runs it after
# `make test`; a few minutes on two cores.
PORTABLE_CAPABILITIES ?= default avx2 avx512
PORTABLE_PYTEST ?= $(BIN)/python -m pytest -n $(TEST_WORKERS) $(if $(filter 0,$(TEST_WORKERS)),,--dist $(TEST_DIST)) -q

test-portable: install
	@for cap in $(PORTABLE_CAPABILITIES); do \
	  case $$cap in \
	    default) mkl=SSE4_2; dnnl=SSE41;; \
	    avx2) mkl=AVX2; dnnl=AVX2;; \
	    avx512) mkl=AVX512; dnnl=AVX512_CORE;; \
	    *) echo "test-portable: unknown capability '$$cap' (default, avx2, avx512)"; exit 2;; \
	  esac; \
	  got=$$(ATEN_CPU_CAPABILITY=$$cap $(BIN)/python -c \
	    'import torch; print(torch.backends.cpu.get_cpu_capability())') || exit 1; \
	  if [ "$$got" != "$$(echo $$cap | tr a-z A-Z)" ]; then \
	    echo "test-portable: skipping $$cap: this CPU runs $$got kernels at most"; continue; \
	  fi; \
	  echo "test-portable: numerical tests under ATEN_CPU_CAPABILITY=$$cap (torch $$got kernels, MKL_ENABLE_INSTRUCTIONS=$$mkl, ONEDNN_MAX_CPU_ISA=$$dnnl)"; \
	  ATEN_CPU_CAPABILITY=$$cap MKL_ENABLE_INSTRUCTIONS=$$mkl ONEDNN_MAX_CPU_ISA=$$dnnl \
	    $(PORTABLE_PYTEST) -m numerical || exit 1; \
	done

bench: install
	$(BIN)/python benchmarks/extract.py
	$(BIN)/python benchmarks/predict.py

# Mutation testing of the core modules (mutmut, each module judged by the tests that mirror
# it; not part of `make test`): last line `killed=K survived=S score=K/(K+S)`. CPU heavy:
# about half an hour on two cores; survivors with diffs go to build/mutation/survivors.txt.
mutation: install
	OMP_NUM_THREADS=1 $(BIN)/python tools/mutation.py

# The calibration table is fitted for the best projections (r = 8, lowrank-mass: the low-rank
# logistic refinement with each gold edge weighted by its entmax probability), which the app
# then loads for the calibrated methods. Every assets*
# target ends by rewriting the manifests (assets/default/bundle.json: sizes, sha256, the
# model each file was built for; tests/test_bundle.py fails on a stale one).
assets: install assets-projections
	$(BIN)/sparsefinder train --model default --corpus default --out assets/default
	$(BIN)/sparsefinder fit-codebooks --model default --corpus default --out assets/default/key_codebooks.pt
	$(BIN)/sparsefinder fit-hash-codes --model default --corpus default --out assets/default/hash_codes.pt
	for b in 16 32; do $(BIN)/sparsefinder fit-block-projections --model default \
	  --corpus default --block $$b --out assets/default/block_projections-b$$b.pt \
	  || exit 1; done
	$(BIN)/sparsefinder train --model default --corpus default --out assets/default \
	  --objective lowrank-mass --rank 8 --filename projections-r8-lowrank-mass.pt
	$(BIN)/sparsefinder calibrate --model default \
	  --projections assets/default/projections-r8-lowrank-mass.pt \
	  --out assets/default/calibration.pt
	$(BIN)/python -m sparsefinder.bundle_manifest --write

# The alternative projections of issue 10 (r = 4 and 8; lowrank, logistic, lowrank-logistic),
# written next to the default file, which stays as it is.
assets-projections: install
	for r in 4 8; do for o in lowrank logistic lowrank-logistic; do \
	  $(BIN)/sparsefinder train --model default --corpus default --out assets/default \
	    --objective $$o --rank $$r --filename projections-r$$r-$$o.pt || exit 1; \
	done; done
	$(BIN)/python -m sparsefinder.bundle_manifest --write

# The entmax adapter of the default model: LoRA distillation of MiniLM's softmax self into its
# 1.5-entmax self on the default corpus' train split plus 500 paragraphs of Jane Austen's novels
# (public domain; Debian's r-cran-janeaustenr, MIT, read without R by tools/austen_corpus.py)
# and 64 Reuters news articles (Reuters-21578, shipped by Debian's r-cran-tm, GPL-3; read by
# tools/news_corpus.py), in chunks of up to 512 tokens, every 10th train passage held out to
# compare settings; then measured on the validation split and the bundled narrative hold-out.
# Resumable: an interrupted run continues from build/adapter.
# Then rebuild what depends on the model: `make assets` (it runs assets-projections too).
build/austen.txt:
	mkdir -p build
	cd build && (apt-get download r-cran-janeaustenr || (apt-get update && apt-get download r-cran-janeaustenr))
	$(BIN)/python tools/austen_corpus.py build/r-cran-janeaustenr_*.deb --out build/austen.txt \
	  --max-passages 500

build/news.txt:
	mkdir -p build
	cd build && (apt-get download r-cran-tm || (apt-get update && apt-get download r-cran-tm))
	$(BIN)/python tools/news_corpus.py build/r-cran-tm_*.deb --out build/news.txt

assets-adapter: install build/austen.txt build/news.txt
	$(BIN)/sparsefinder adapt --model default --corpus build/austen.txt --corpus build/news.txt \
	  --out build/adapter --resume --steps 1000 --lr 2e-3 --w-sparse 0.5 --rank 16 \
	  --max-tokens 512 --batch-size 4 --measure-every 250 \
	  --eval-corpus narrative $(ADAPT_ARGS)
	cp build/adapter/entmax_adapter.safetensors assets/default/
	$(BIN)/python -m sparsefinder.bundle_manifest --write
