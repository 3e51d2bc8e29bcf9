# Two commands: `make serve` starts the service on http://127.0.0.1:8000,
# `make test` runs the static checks (`make check`) and the whole test suite. Both create .venv and install into it.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

LOCK   := requirements.lock
# pip-compile (pip-tools) writes the locks: exact versions with every file's sha256.
PIP_COMPILE := $(BIN)/pip-compile --quiet --generate-hashes --strip-extras --no-emit-index-url --no-emit-find-links

.PHONY: serve check format unasync test test-floors docs screenshots bench bench-engines bench-sample bench-http load-test export-models image smoke-podman lock lock-upgrade clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The runtime set exactly as locked (what the image runs), then the package and its extras around it.
$(VENV)/.installed: pyproject.toml $(LOCK) | $(BIN)/python
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps -r $(LOCK)
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# The client is its own distribution (clients/python, not on PyPI): installed from the checkout before the
# server's `client` extra (part of `test`) asks for it, so that pip finds it installed.
$(VENV)/.installed-test: pyproject.toml clients/python/pyproject.toml $(LOCK) | $(BIN)/python
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps -r $(LOCK)
	$(BIN)/python -m pip install --quiet -e ./clients/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(VENV)/.installed $@

serve: $(VENV)/.installed
	$(BIN)/python -m service serve

# Static checks (configured in pyproject.toml): lint, formatting left as `ruff format` writes it, strict types.
check: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python clients/python/scripts/unasync.py --check

# Rewrite the sync client modules (clients/python/attention_client/client.py, attention.py, logits.py, analysis.py,
# session.py) from the async ones after editing them.
unasync:
	$(PYTHON) clients/python/scripts/unasync.py

# Apply ruff's safe fixes and the formatter (then `make check` shows what is left to fix by hand).
format: $(VENV)/.installed-test
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The suite on pytest-xdist workers, one test file at a time each (--dist loadfile: a file's module-scoped servers
# start once). Most tests wait on live servers and subprocesses rather than compute, so three workers fit two cores
# (docs/development/testing.md has the timings); TEST_WORKERS=0 runs it in this process, one test at a time.
# Bytecode is written (into the git-ignored __pycache__ folders) even where the environment sets
# PYTHONDONTWRITEBYTECODE: the suite starts over a hundred server and command-line processes, each of which would
# compile the service again, and pytest would rewrite every test module's asserts on every run.
TEST_WORKERS ?= 3
test: check $(VENV)/.installed-test
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

# Every direct dependency at its declared minimum (pyproject.toml's >= floors, with the client and export
# extras; tests/packaging/floors.py derives the constraints and checks the venv holds exactly them), in a venv
# of its own: the smoke with ONNX required, the end-to-end tests, ONNX parity, the export and uvicorn protocol
# tests. A floor that stopped working (an import, uvicorn loading our protocol, ONNX Runtime loading the graphs,
# which would silently leave numpy serving) fails here, not in a user's install. About two minutes.
FLOORS_VENV ?= build/venv-floors
FLOORS_EXTRAS := --extra client --extra export
FLOORS_TESTS := tests/packaging/test_floors.py tests/e2e tests/engines/test_onnx_parity.py \
	tests/engines/test_backward_parity.py tests/export tests/hardening/test_protocol_writes.py
test-floors:
	rm -rf $(FLOORS_VENV)
	$(PYTHON) -m venv $(FLOORS_VENV)
	$(FLOORS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PYTHON) tests/packaging/floors.py $(FLOORS_EXTRAS) > $(FLOORS_VENV)/floors.txt
	$(FLOORS_VENV)/bin/python -m pip install --quiet -c $(FLOORS_VENV)/floors.txt -e ./clients/python -e '.[export]' \
		'pytest>=8,<10' 'hypothesis>=6.100,<7' 'tritonclient[http]>=2.50,<3'
	$(FLOORS_VENV)/bin/python tests/packaging/floors.py $(FLOORS_EXTRAS) --check
	ATTN_ONNX_REQUIRED=true $(FLOORS_VENV)/bin/python -m pytest -p no:cacheprovider -q $(FLOORS_TESTS)

# The documentation site into build/site (mkdocs.yml; `$(BIN)/mkdocs serve` for a live preview). Strict: a broken
# link or anchor, a page left out of the navigation or an unreadable docstring fails it. Needs no network.
docs: $(VENV)/.installed-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Refresh the playground screenshots docs/guides/playground.md shows (needs Debian's chromium: apt-get install -y chromium).
screenshots: $(VENV)/.installed-test
	PLAYGROUND_SCREENSHOTS_DIR=docs/screenshots $(BIN)/python -m pytest tests/playground -q

# Benchmarks (bench/README.md; not timed tests, the suite never runs them): `make bench` lists them, `make bench
# NAME=http ARGS='--quick'` runs one (`python -m bench NAME ARGS`: the machine header, then its tables). NAME is read
# from the command line only (WSL's environment sets a NAME of its own). http, tail and load need wrk
# (apt-get install -y wrk); the test extras bring tritonclient, httpx and the client that others use.
bench: $(VENV)/.installed-test
	$(BIN)/python -m bench $(if $(filter command line,$(origin NAME)),$(NAME)) $(ARGS)

# The targets of before, each one benchmark: make bench NAME=http, NAME=engines, NAME=sample, NAME=load.
bench-http bench-engines bench-sample load-test: $(VENV)/.installed-test
	$(BIN)/python -m bench $(patsubst load-test,load,$(patsubst bench-%,%,$@)) $(ARGS)

export-models: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e '.[export]'
	$(BIN)/python -m service export-models

# The lock files from pyproject.toml's runtime dependencies: requirements.lock (CPU) and requirements-gpu.lock
# (onnxruntime-gpu in place of onnxruntime). `make lock` keeps the pins already there and adds what a
# changed pyproject.toml needs; `make lock-upgrade` re-resolves everything to the newest versions in range.
# Commit both files (and the README's "Locked versions" line); the image and `make test` install them.
lock: | $(BIN)/python
	$(BIN)/python -m pip install --quiet 'pip-tools>=7.4,<8'
	$(PIP_COMPILE) $(LOCK_FLAGS) --output-file $(LOCK) pyproject.toml
	$(PIP_COMPILE) $(LOCK_FLAGS) --extra gpu --unsafe-package onnxruntime --output-file requirements-gpu.lock pyproject.toml

lock-upgrade:
	$(MAKE) lock LOCK_FLAGS=--upgrade

image:
	docker build -t attention-service .

smoke-podman:
	deploy/podman/build-and-smoke.sh

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
