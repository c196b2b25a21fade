# flowstat: the two commands a new machine needs are `make demo` and `make test`.
# Everything they need is installed here, cached under .venv/ and .cache/, and re-done only
# when its inputs change.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LAB_STAMP := $(VENV)/.lab-installed

C_AGENT := collectors/c/build/flowstat-agent
# Debian packages by purpose. DEMO_DEPS: what `make demo` builds and runs (the C agent and the node
# library: ZeroMQ, cJSON, libcurl). TEST_DEPS: what only the tests and benchmarks need: clang and its
# sanitizer runtime (fuzzers, ASan builds), clang-format, valgrind, g++ and cppzmq (the C++ example),
# docker-compose and docker.io, mmdebstrap and iproute2 (the compose stack run for real; mmdebstrap
# also makes the Debian root the packages are installed in), chromium and its driver (the report in a
# browser), Slurm and munge (runs across hosts), debhelper, lintian, zstd and systemd's
# systemd-analyze (the Debian packages built, checked, installed: tests/test_packages.py).
# DEB_DEPS: what `make deb` needs beyond DEMO_DEPS.
DEMO_DEPS := libzmq3-dev libcjson-dev libcurl4-openssl-dev libssl-dev libyaml-dev libcrypt-dev pkg-config
TEST_DEPS := clang libclang-rt-14-dev clang-format valgrind g++ cppzmq-dev \
	docker-compose chromium chromium-driver docker.io mmdebstrap iproute2 \
	slurmctld slurmd slurm-client munge debhelper lintian zstd systemd prometheus
DEB_DEPS := debhelper dpkg-dev
# Named after the list: a checkout that installed an older list installs what was added.
DEMO_DEPS_STAMP := .cache/demo-deps-$(shell echo '$(DEMO_DEPS)' | md5sum | cut -c1-8).installed
TEST_DEPS_STAMP := .cache/test-deps-$(shell echo '$(TEST_DEPS)' | md5sum | cut -c1-8).installed
DEB_DEPS_STAMP := .cache/deb-deps-$(shell echo '$(DEB_DEPS)' | md5sum | cut -c1-8).installed

.PHONY: help demo test test-ready test-stack lint bench soak mutate install clean c-agent c-agent-tests generate \
	compose-images screenshots bytecode deb dist test-cpu

help:
	@echo "make demo   local InfluxDB/Elasticsearch/Telegraf + a harness run shipping into them"
	@echo "make test   run the tests"
	@echo "make lint   the checks that read the code: import layers, ruff, mypy, clang-format (seconds; make test runs them first)"
	@echo "make bench  run the benchmarks and the campaigns at 20 s (about 100 minutes; JSON in benchmarks/results/)"
	@echo "make soak   10,000 processes into both stores for an hour, faults injected (about 90 minutes; docs/soak.md)"
	@echo "make test-cpu  the suite run as make test does, its CPU charged to each test (root; .cache/test-cpu/)"
	@echo "make mutate mutation testing of the code where a bug loses data (2 minutes; benchmarks/results/mutation.json)"
	@echo "make generate  write again every file made from another (src/flowstat/generate.py; seconds, deterministic)"
	@echo "make screenshots  the report's pictures in docs/img (records two runs; a minute)"
	@echo "make deb   Debian packages of the C agent and the node library in dist/ (docs/farm.md)"
	@echo "make dist  the Python sdist and wheel in dist/"
	@echo "make clean  remove the venv, caches and runs"

$(BIN)/python:
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "flowstat needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV) || { echo "python venv missing: installing python3-venv"; \
		apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }

# flowstat with every extra: what the demo runs.
$(STAMP): $(BIN)/python pyproject.toml requirements.lock
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements.lock -e '.[all]'
	touch $@

# The tests' and benchmarks' tools (pytest, linters, selenium...) and the laboratory (lab/: the engines
# the suite starts and the query expansion of the tools that cannot run here), in development mode.
$(LAB_STAMP): $(STAMP) lab/pyproject.toml
	$(BIN)/python -m pip install -q -c requirements.lock -e '.[all,test]' -e lab
	touch $@

# Debian packages, installed once (root, or sudo if present).
define apt_install
	@mkdir -p .cache
	@if ! dpkg -s $(1) >/dev/null 2>&1; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		echo "installing $(1)"; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(1); \
	fi
	touch $@
endef

$(DEMO_DEPS_STAMP):
	$(call apt_install,$(DEMO_DEPS))

$(TEST_DEPS_STAMP):
	$(call apt_install,$(TEST_DEPS))

$(DEB_DEPS_STAMP):
	$(call apt_install,$(DEB_DEPS))

# The C agent and the node library; the agent goes beside the venv's python too, where flowstat run
# looks for it (as pip puts console scripts there).
c-agent: $(DEMO_DEPS_STAMP) $(BIN)/python
	$(MAKE) -C collectors/c all
	ln -sf ../../$(C_AGENT) $(BIN)/flowstat-agent

# What only the tests and benchmarks run: the library's probe and benchmark programs, the ASan builds
# and the fuzzers.
c-agent-tests: c-agent $(TEST_DEPS_STAMP)
	$(MAKE) -C collectors/c tests asan fuzz

install: $(STAMP) c-agent

# The Debian packages for a farm (docs/farm.md): flowstat-agent (the agent, its systemd unit, the
# default /etc/flowstat/agent.toml), libflowstat-node0 and libflowstat-node-dev, built by debhelper
# from a copy of the sources (packaging/build-deb; packaging/debian is its debian/), then checked by
# lintian when it is installed (make test installs it; in a TMPDIR of its own: it leaves files there).
# Into dist/, with the -dbgsym packages.
deb: $(DEMO_DEPS_STAMP) $(DEB_DEPS_STAMP)
	packaging/build-deb dist
	@if command -v lintian >/dev/null; then t=$$(mktemp -d) && \
		{ TMPDIR=$$t lintian --display-info --pedantic dist/flowstat_*.changes || true; rm -rf $$t; }; fi

# The Python package's sdist and wheel (the Python agent's install: docs/farm.md), into dist/, by
# PyPA's build (pinned here) in the venv.
BUILD_VERSION := 1.6.1
dist: $(BIN)/python
	$(BIN)/python -m pip install -q build==$(BUILD_VERSION)
	$(BIN)/python -m build --outdir dist .

# Every file made from another (templates, dashboards, alert rules, schema tables, the thesis
# comparison): flowstat.generate lists them; tests/test_generated.py keeps them current. Deterministic:
# twice in a row, or on another machine, it changes nothing. The screenshots are `make screenshots`.
generate: $(STAMP)
	$(BIN)/python -m flowstat.generate .

demo: $(STAMP) c-agent
	scripts/demo

# The checks that read the code (a few seconds): layers import downward only and flowstat never
# imports the laboratory (import-linter), ruff's lint and format, mypy (strict on the bottom layers,
# pyproject says which), clang-format on the C (in TEST_DEPS).
lint: $(LAB_STAMP) $(TEST_DEPS_STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(MAKE) -C collectors/c format-check

# The servers the tests use are downloaded and built first, on a quiet machine: timing tests beside a
# Telegraf build would only measure the build. What comes before the tests goes two at a time (mypy
# keeps one core busy for half a minute, the C builds the other), its output kept together a step at
# a time. Four workers: the suite is CPU-bound on two cores, and a fourth fills what three leave idle
# (docs/testing.md: 84% busy with four, 73% with three; five were no faster).
PYTEST_WORKERS ?= 4
test:
	$(MAKE) --jobs=2 --output-sync=target test-ready
	$(BIN)/python -m pytest -q -ra -n $(PYTEST_WORKERS) --durations=15

test-ready: lint c-agent-tests compose-images test-stack bytecode

# Every module's bytecode, written once: with PYTHONDONTWRITEBYTECODE set (as on these machines) each of
# the suite's ~1,500 Python processes would otherwise compile what it imports of the checkout again.
# The test modules' too as pytest rewrites their asserts (its own .pyc, which it reads even when it may
# not write): each of the five pytest processes took 4.4 CPU-s to collect, 1.3 with them written.
bytecode: $(LAB_STAMP)
	$(BIN)/python -m compileall -q src lab/src tests examples > /dev/null
	mkdir -p .cache && env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest --collect-only -q -p no:cacheprovider \
	  > .cache/collect.log || { tail -40 .cache/collect.log; exit 1; }

test-stack: $(STAMP)
	$(BIN)/flowstat stack install --cache .cache/test-stack

# The compose stack's images, built here (no image registry is reachable): Compose v2 from the Go
# module proxy, Debian bases made with mmdebstrap, flowstat's from the Dockerfile, and the stand-ins
# of lab/stand-ins/, each rebuilt only when its inputs change (about 6 minutes the first time on a
# machine, a few seconds after: kept in /var/lib/flowstat/compose). Needs root.
compose-images: $(LAB_STAMP) $(TEST_DEPS_STAMP)
	$(BIN)/python -m flowstat_lab.compose images

# Raw series go to benchmarks/results/raw/ (ignored by git); the small summaries the docs quote stay.
bench: $(LAB_STAMP) c-agent-tests
	$(BIN)/python benchmarks/run_benchmarks.py --full
	cd benchmarks && ../$(BIN)/python bench_agents.py
	cd benchmarks && ../$(BIN)/python bench_agent_mem.py
	cd benchmarks && ../$(BIN)/python bench_topn.py
	cd benchmarks && ../$(BIN)/python bench_scrape.py
	cd benchmarks && ../$(BIN)/python bench_flow.py
	cd benchmarks && ../$(BIN)/python bench_ingest.py
	cd benchmarks && ../$(BIN)/python bench_report.py
	cd benchmarks && ../$(BIN)/python bench_views.py
	cd benchmarks && ../$(BIN)/python bench_node.py --repeats 5
	cd benchmarks && ../$(BIN)/python bench_node_c.py
	cd benchmarks && ../$(BIN)/python bench_curve.py
	cd benchmarks && ../$(BIN)/python bench_slurm.py
	$(BIN)/python benchmarks/run_campaigns.py --duration 20
	$(BIN)/python benchmarks/thesis_comparison.py
	@echo "long fuzzing of the C agent's parsers (5 minutes each):"
	for f in stat reply endpoints sink_url credentials config; do mkdir -p .cache/fuzz/$$f && cp collectors/c/fuzz/corpus/$$f/* .cache/fuzz/$$f/ && \
		collectors/c/build/fuzz_$$f -max_total_time=300 -timeout=5 .cache/fuzz/$$f || exit 1; done
	$(BIN)/python benchmarks/buffer_one.py

# The soak (issue 28): 10,000 processes watched at 1 Hz into both stores for an hour, after a scale
# ladder, with faults (benchmarks/bench_soak.py says what and when). About 90 minutes; needs root
# and about 6 GB of memory. Writes its raw series to benchmarks/results/raw/ (not tracked), its summary
# to benchmarks/results/soak.json, and docs/soak.md and docs/img/soak.svg from the summary.
# `SOAK_ARGS=--quick make soak` tries it out in about 20 minutes.
soak: $(LAB_STAMP) c-agent
	cd benchmarks && ../$(BIN)/python bench_soak.py --doc $(SOAK_ARGS)

# The report's screenshots in docs/img/, made by the code the browser tests use (flowstat_lab.screenshots:
# records the demo's two runs, makes a 500-producer run from the first, writes and pictures their reports).
screenshots: $(LAB_STAMP) c-agent $(TEST_DEPS_STAMP)
	$(BIN)/python -m flowstat_lab.screenshots

# Mutation testing (mutmut, pinned in requirements.lock): not part of make test, as each of about a
# thousand small changes to the code runs the unit tests that call it. flowstat_lab.mutate says what is
# judged and writes the score; it fails below 90% caught in any part.
MUTATE_STAMP := $(VENV)/.mutate-installed
$(MUTATE_STAMP): $(LAB_STAMP)
	$(BIN)/python -m pip install -q -c requirements.lock -e '.[all,test,mutate]' -e lab
	touch $@

# The suite as make test runs it, with the kernel's process accounting on: the CPU of every process
# it started, charged to the test that started it (docs/testing.md, "Where the CPU goes").
test-cpu: test-ready
	$(BIN)/python -m flowstat_lab.suite_cpu --out .cache/test-cpu -- -q -n $(PYTEST_WORKERS)

mutate: $(MUTATE_STAMP) c-agent-tests
	$(BIN)/python -m flowstat_lab.mutate

clean:
	rm -rf $(VENV) .cache runs .pytest_cache mutants
	$(MAKE) -C collectors/c clean
