# Raylane: everything installs into .venv in the repo root.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-e2e test-all test-fast bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch that lies on this disk; a plain `torch` pulls a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,examples]'
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

# Test modules run TEST_WORKERS at a time (pytest-xdist; a module's tests stay together on one worker, as its Ray
# cluster is shared by them): 2 fits a 2-core machine, whose Ray tests spend much of their time waiting on
# processes. `make test TEST_WORKERS=1` runs them one after another.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile

# promtool (from Debian's prometheus package) checks and unit-tests the alerting rules in deploy/prometheus.
# Chromium (from Debian's chromium package) runs the web console's browser tests.
TEST_TOOLS := bash deploy/prometheus/install_promtool.sh && bash deploy/console/install_chromium.sh

test: $(STAMP)
	$(TEST_TOOLS)
	$(BIN)/python -m pytest -q -ra --durations=10 -m "not e2e" $(XDIST)

# The long end-to-end scenarios (marker e2e, 42 tests): each feature again through the entry a user comes by (the
# README's commands, Ray's own examples, Lightning and Transformers, datasets), and the scenarios that need several
# Train gangs one after another (crash and retry budgets, a Serve burst reclaiming training's GPUs, elastic resizes,
# a killed node, PBT). .ci/run runs them after `make test`; docs/testing.md lists them. One module at a time by
# default: every one of them starts Train gangs, and two side by side on 2 cores load the machine to an average of
# 20 and more, where each takes three to four times as long as alone (docs/testing.md).
E2E_WORKERS ?= 1
test-e2e: $(STAMP)
	$(BIN)/python -m pytest -q -ra --durations=10 -m e2e -n $(E2E_WORKERS) --dist loadfile

# Both tiers in one pytest run.
test-all: $(STAMP)
	$(TEST_TOOLS)
	$(BIN)/python -m pytest -q -ra --durations=10 $(XDIST)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m "not ray and not slow" $(XDIST)

bench: $(STAMP)
	$(BIN)/python -m tests.bench.run_all

clean:
	rm -rf $(VENV) .raylane build *.egg-info
