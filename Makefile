# flowstat: the two commands a new machine needs are `make demo` and `make test`.
# Everything they need is installed here, cached under .venv/ and .cache/, and re-done only
# when its inputs change.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

C_AGENT := collectors/c/build/flowstat-agent
C_DEPS := libzmq3-dev libcjson-dev libcurl4-openssl-dev pkg-config clang libclang-rt-14-dev clang-format valgrind g++ cppzmq-dev \
	docker-compose chromium chromium-driver docker.io mmdebstrap iproute2 \
	slurmctld slurmd slurm-client munge
# Named after the list: a checkout that installed an older list installs what was added.
C_STAMP := .cache/c-deps-$(shell echo '$(C_DEPS)' | md5sum | cut -c1-8).installed

.PHONY: help demo test test-ready test-stack lint bench soak mutate install clean c-agent generate compose-images screenshots

help:
	@echo "make demo   local InfluxDB/Elasticsearch/Telegraf + a harness run shipping into them"
	@echo "make test   run the tests"
	@echo "make lint   the checks that read the code: import layers, ruff, mypy, clang-format (seconds; make test runs them first)"
	@echo "make bench  run the benchmarks and the campaigns at 20 s (about 100 minutes; JSON in benchmarks/results/)"
	@echo "make soak   10,000 processes into both stores for an hour, faults injected (about 90 minutes; docs/soak.md)"
	@echo "make mutate mutation testing of the code where a bug loses data (2 minutes; benchmarks/results/mutation.json)"
	@echo "make generate  write again every generated file (src/flowstat/generate.py), the report's screenshots too (a minute)"
	@echo "make clean  remove the venv, caches and runs"

$(BIN)/python:
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "flowstat needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV) || { echo "python venv missing: installing python3-venv"; \
		apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }

$(STAMP): $(BIN)/python pyproject.toml requirements.lock
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements.lock -e '.[all,test]'
	touch $@

# Debian packages: the C agent's build dependencies (clang-format for its format check),
# docker-compose to validate docker-compose.yml offline, chromium with its chromedriver, in which the
# tests open flowstat report's pages, and docker.io (dockerd, containerd, runc, the docker client),
# mmdebstrap and iproute2 (ip netns), with which the tests run docker-compose.yml for real
# (tests/test_compose_up.py).
# Installed once (root, or sudo if present).
$(C_STAMP):
	@mkdir -p .cache
	@if ! dpkg -s $(C_DEPS) >/dev/null 2>&1; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		echo "installing $(C_DEPS)"; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(C_DEPS); \
	fi
	touch $@

# The C agent goes beside the venv's python too, where flowstat run looks for it (as pip puts
# console scripts there).
c-agent: $(C_STAMP) $(BIN)/python
	$(MAKE) -C collectors/c all asan fuzz
	ln -sf ../../$(C_AGENT) $(BIN)/flowstat-agent

install: $(STAMP) c-agent

# Every file made from another (templates, dashboards, alert rules, schema tables, the thesis
# comparison): flowstat.generate lists them; tests/test_generated.py keeps them current.
generate: $(STAMP) c-agent
	$(BIN)/python -m flowstat.generate .
	$(BIN)/python -m flowstat.report.screenshots

demo: $(STAMP) c-agent
	scripts/demo

# The checks that read the code (a few seconds): layers import downward only (import-linter), ruff's
# lint and format, mypy (strict on the bottom layers, pyproject says which), clang-format on the C.
lint: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(MAKE) -C collectors/c format-check

# The servers the tests use are downloaded and built first, on a quiet machine: the tests run on
# three workers, and timing tests beside a Telegraf build would only measure the build. What comes
# before the tests goes two at a time (mypy keeps one core busy for half a minute, the C builds the
# other), its output kept together a step at a time.
test:
	$(MAKE) --jobs=2 --output-sync=target test-ready
	$(BIN)/python -m pytest -q -ra -n 3

test-ready: lint c-agent compose-images test-stack

test-stack: $(STAMP)
	$(BIN)/flowstat stack install --cache .cache/test-stack

# The compose stack's images, built here (no image registry is reachable): Compose v2 from the Go
# module proxy, Debian bases made with mmdebstrap, flowstat's from the Dockerfile, and the stand-ins
# of scripts/compose-stand-ins/, each rebuilt only when its inputs change (about 6 minutes the first
# time on a machine, a few seconds after: kept in /var/lib/flowstat/compose). Needs root.
compose-images: $(STAMP) $(C_STAMP)
	$(BIN)/python scripts/composeengine.py images

bench: $(STAMP) c-agent
	$(BIN)/python benchmarks/run_benchmarks.py --full
	cd benchmarks && ../$(BIN)/python bench_agents.py
	cd benchmarks && ../$(BIN)/python bench_agent_mem.py
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
	for f in stat reply endpoints sink_url credentials; do mkdir -p .cache/fuzz/$$f && cp collectors/c/fuzz/corpus/$$f/* .cache/fuzz/$$f/ && \
		collectors/c/build/fuzz_$$f -max_total_time=300 -timeout=5 .cache/fuzz/$$f || exit 1; done
	$(BIN)/python benchmarks/buffer_one.py

# The soak (issue 28): 10,000 processes watched at 1 Hz into both stores for an hour, after a scale
# ladder, with faults (benchmarks/bench_soak.py says what and when). About 90 minutes; needs root
# and about 6 GB of memory. Writes benchmarks/results/soak-*.json, docs/soak.md and docs/img/soak.svg.
# `SOAK_ARGS=--quick make soak` tries it out in about 20 minutes.
soak: $(STAMP) c-agent
	cd benchmarks && ../$(BIN)/python bench_soak.py --doc $(SOAK_ARGS)

# The report's screenshots in docs/img/, made by the code the browser tests use (flowstat.report.screenshots:
# records the demo's two runs, makes a 500-producer run from the first, writes and pictures their reports).
# make generate makes them too.
screenshots: $(STAMP) c-agent
	$(BIN)/python -m flowstat.report.screenshots

# Mutation testing (mutmut, pinned in requirements.lock): not part of make test, as each of about a
# thousand small changes to the code runs the unit tests that call it. scripts/mutate.py says what
# is judged and writes the score; it fails below 90% caught in any part.
MUTATE_STAMP := $(VENV)/.mutate-installed
$(MUTATE_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -c requirements.lock -e '.[all,test,mutate]'
	touch $@

mutate: $(MUTATE_STAMP) c-agent
	$(BIN)/python scripts/mutate.py

clean:
	rm -rf $(VENV) .cache runs .pytest_cache mutants
	$(MAKE) -C collectors/c clean
