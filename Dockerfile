# The flowstat image: the flowstat CLI (the wheel, with the versions of requirements.lock) and the C
# agent, run as an unprivileged user. docker-compose.yml builds it for its one-shot `setup` services
# and its `harness` profile; alone:
#     docker build --build-arg FLOWSTAT_VERSION=0.1.0 -t flowstat:0.1.0 .
#     docker run --rm flowstat:0.1.0 run /usr/local/share/flowstat/topologies/smoke.yaml
# FLOWSTAT_VERSION must be the package's version (src/flowstat/__init__.py): the build checks it.
# What is in it and why: docs/compose.md, "The flowstat image". tests/test_dockerfile.py checks this
# file against the checkout (no Docker needed).

# The base of every stage: the official Python image, pinned. PYTHON_IMAGE names another one with
# Python 3.11 as `python` on the PATH and Debian bookworm's apt (the compose tests build on one made
# from Debian's packages: no image registry is reachable there).
ARG PYTHON_IMAGE=python:3.11.17-slim-bookworm

# -- the wheel, built as tests/test_wheel.py builds it: from src/, pyproject.toml and README.md only
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /source
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m pip wheel -q --no-deps -w /dist /source

# -- the C agent: collectors/c/Makefile (make's default compiler, cc: gcc on Debian), its schema
# headers generated from the package's schemas (python3 is this image's), its version from __init__.py
FROM ${PYTHON_IMAGE} AS agent
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       gcc libc6-dev make pkg-config libzmq3-dev libcjson-dev libcurl4-openssl-dev libssl-dev libyaml-dev libcrypt-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /build
COPY src/flowstat/schema ./src/flowstat/schema
COPY src/flowstat/__init__.py ./src/flowstat/__init__.py
COPY collectors/c ./collectors/c
RUN make -C collectors/c all

# -- the image: Python 3.11 (what requirements.lock was made for), the shared libraries the C
# agent links (the runtime packages of the -dev ones above), flowstat and nothing to build with
FROM ${PYTHON_IMAGE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libzmq5 libcjson1 libcurl4 libssl3 libyaml-0-2 libcrypt1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 flowstat \
    && useradd --system --uid 10001 --gid flowstat --home-dir /var/lib/flowstat --shell /usr/sbin/nologin flowstat \
    && install -d -o flowstat -g flowstat -m 0755 /var/lib/flowstat /var/lib/flowstat/runs /var/lib/flowstat/alerts

# Every dependency comes as a binary wheel (no compiler here): --only-binary makes sure of it.
COPY requirements.lock /tmp/flowstat/requirements.lock
COPY --from=wheel /dist/ /tmp/flowstat/dist/
# flowstat[all]: the harness, the report and the stack beside the agent (pyproject.toml's extras).
RUN python -m pip install -q --only-binary=:all: -c /tmp/flowstat/requirements.lock "$(ls /tmp/flowstat/dist/flowstat-*.whl)[all]" \
    && rm -rf /tmp/flowstat

# Beside the Python that runs flowstat, where `flowstat run` looks for it first (and on the PATH).
COPY --from=agent /build/collectors/c/build/flowstat-agent /usr/local/bin/flowstat-agent
# The topologies of benchmark-harness/topologies; live.yaml is what the harness profile runs.
COPY benchmark-harness/topologies /usr/local/share/flowstat/topologies

ARG FLOWSTAT_VERSION
# The tag names what is inside; the C agent loads (its libraries are all here) and is the one
# `flowstat run` starts.
RUN if [ "$(flowstat --version)" != "flowstat ${FLOWSTAT_VERSION}" ]; then \
        echo "FLOWSTAT_VERSION is '${FLOWSTAT_VERSION}' but the package is $(flowstat --version):" \
             "build with --build-arg FLOWSTAT_VERSION=<the package's version> (compose passes .env's)" >&2; \
        exit 1; \
    fi \
    && flowstat-agent --help > /dev/null \
    && python -c "from flowstat.harness.agents import find_c_agent as f; assert str(f()) == '/usr/local/bin/flowstat-agent', f()"

ARG FLOWSTAT_SOURCE=""
ARG FLOWSTAT_REVISION=""
LABEL org.opencontainers.image.title="flowstat" \
      org.opencontainers.image.description="Monitoring for ZeroMQ pipelines: the flowstat CLI, its load harness and both agents" \
      org.opencontainers.image.version="${FLOWSTAT_VERSION}" \
      org.opencontainers.image.source="${FLOWSTAT_SOURCE}" \
      org.opencontainers.image.revision="${FLOWSTAT_REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# Runs go to ./runs: /var/lib/flowstat/runs, the user's; the harness profile mounts a volume there,
# and the alerts service one at /var/lib/flowstat/alerts (a new named volume takes the owner of the
# image's folder: a folder the image lacks is made root's, and the inbox could not write its log).
USER 10001:10001
WORKDIR /var/lib/flowstat
ENV HOME=/var/lib/flowstat
ENTRYPOINT ["flowstat"]
CMD ["--help"]
