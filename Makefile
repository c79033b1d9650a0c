# textserve — the commands the README shows. Each target is a few lines; the work is in Python.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
HOST ?= 127.0.0.1
PORT ?= 50051
METRICS_PORT ?= 8000
MODEL ?= default
REPOSITORY ?= models
BENCH_ARGS ?=
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export NO_MKDOCS_2_WARNING := 1  # MkDocs' banner about its 2.0 on every build

.PHONY: venv serve test lint typecheck pytest protos bench mutate system-deps docs docs-serve clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[train,test,dev,bench,docs]'
	touch $@

venv: $(VENV)/.installed

# Debian packages the system tests use: the real Prometheus server (and promtool), and
# docker-compose to validate docker-compose.yml (no engine needed); podman (runc runtime, the CNI
# dnsname plugin so compose services find each other by name) and mmdebstrap to build and run
# the images and the compose stack (tests/system/test_images.py, test_compose_stack.py; no
# registry needed). Skipped when present.
SYSTEM_PACKAGES := prometheus docker-compose libb64-0d podman runc mmdebstrap \
  golang-github-containernetworking-plugin-dnsname uidmap slirp4netns fuse-overlayfs
system-deps:
	@( for c in prometheus docker-compose podman runc mmdebstrap; do \
	  command -v $$c >/dev/null 2>&1 || exit 1; done ) \
	  && ldconfig -p | grep -q libb64.so.0d && test -x /usr/lib/cni/dnsname || { \
	  SUDO=$$(command -v sudo >/dev/null 2>&1 && [ "$$(id -u)" != 0 ] && echo sudo); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends \
	    $(SYSTEM_PACKAGES) >/dev/null; }

## serve: set up, fetch the default data, train + export the default model if none exists, serve it
serve: venv
	$(PY) -m textserve.cli setup-default --repository $(REPOSITORY) --name $(MODEL)
	$(PY) -m textserve.cli serve --repository $(REPOSITORY) --model $(MODEL) \
	  --listen $(HOST):$(PORT) --http-port $(METRICS_PORT)

## test: lint (ruff, import directions), type-check, every test tier
test: venv system-deps lint typecheck pytest

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

typecheck: venv
	$(VENV)/bin/mypy

# TEXTSERVE_REQUIRE_CONTAINERS: system-deps installed podman, so the container tests never skip.
pytest: venv
	TEXTSERVE_REQUIRE_CONTAINERS=1 $(VENV)/bin/pytest -q

## protos: regenerate the committed gRPC code (with .pyi stubs) from protos/
protos: venv
	$(PY) -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. --grpc_python_out=. \
	  protos/textserve/v1/*.proto protos/textserve/oip/*.proto

## soak: steady load (70 % of the measured peak) on `serve --workers 2` for SOAK_MINUTES (8) with a
## hot reload every minute, a stream and a worker kill halfway; RSS/threads/fds once a second
## -> bench/results/soak/soak.json + soak.png and the RSS slope per hour (not part of make test)
SOAK_MINUTES ?= 8
SOAK_ARGS ?=
soak: venv
	$(PY) -m textserve.cli setup-default --repository $(REPOSITORY) --name $(MODEL)
	$(PY) -m textserve.bench.soak --repository $(REPOSITORY) --model $(MODEL) \
	  --minutes $(SOAK_MINUTES) --output bench/results/soak $(SOAK_ARGS)

## bench: the standard benchmark sweep against servers it starts on the default model (a few
## minutes); BENCH_ARGS adds `textserve bench` flags, e.g. BENCH_ARGS="--api oip"
## BENCH_WORKERS: the `--workers` counts perf_analyzer compares in `make bench` (a server each)
## and perf_analyzer -i http vs -i grpc on one server at 1 and 128 callers -> bench/results/http
BENCH_WORKERS ?= 1,2
bench: venv
	$(PY) -m textserve.cli setup-default --repository $(REPOSITORY) --name $(MODEL)
	$(PY) -m textserve.cli bench --repository $(REPOSITORY) --model $(MODEL) --output bench/results \
	  $(BENCH_ARGS)
	$(PY) -m textserve.cli bench --repository $(REPOSITORY) --model $(MODEL) --api stream \
	  --concurrency 128,512 --multi-texts-per-request 0 --batching-off-concurrency 0 \
	  --workers off --no-torch --output bench/results/stream
	$(PY) -m textserve.bench.perf_analyzer --repository $(REPOSITORY) --model $(MODEL) --output bench/results \
	  --concurrency 1,4,16,64,128 --request-rates half-peak --floor
	$(PY) -m textserve.bench.perf_analyzer --repository $(REPOSITORY) --model $(MODEL) \
	  --output bench/results/workers --workers $(BENCH_WORKERS) --concurrency 64,128
	$(PY) -m textserve.bench.perf_analyzer --repository $(REPOSITORY) --model $(MODEL) \
	  --output bench/results/http --http --concurrency 1,128
	$(PY) -m textserve.export.bench runs/$(MODEL) --repository $(REPOSITORY) --name $(MODEL) \
	  --json bench/results/export_bench.json
	$(PY) -m textserve.bench.cache --repository $(REPOSITORY) --model $(MODEL) --texts runs/$(MODEL) \
	  --concurrency 128 --duration 15 --rounds 5 --cache-size 64MiB --output bench/results/cache.json
	$(PY) -m textserve.bench.field --texts runs/$(MODEL) --output bench/results/field
	$(PY) -m textserve.bench.tagging --texts runs/$(MODEL) --output bench/results/tagging
	$(PY) -m textserve.bench.overload --repository $(REPOSITORY) --model $(MODEL) \
	  --workers 1,2 --apis v1,http --load 1.5 --duration 20 --output bench/results/overload
	$(PY) -m textserve.export.bench --bert-shaped --json bench/results/export_bench_bert.json

## mutate: mutation testing (mutmut) of the core modules, one group at a time against the unit
## tests that cover it; not part of `make test` (minutes per group). GROUPS="batcher status"
## runs some; the report is build/mutation/report.md, equivalent survivors tests/mutation/README.md
GROUPS ?=
mutate: venv
	nice -n 10 $(PY) tests/mutation/run.py $(GROUPS)

## docs: build the documentation site into build/site (--strict: broken links fail; `make test`
## builds it too, tests/unit/docs/); docs-serve: preview it on http://127.0.0.1:8008, rebuilt on save
docs: venv
	$(VENV)/bin/mkdocs build --strict

docs-serve: venv
	$(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8008

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
