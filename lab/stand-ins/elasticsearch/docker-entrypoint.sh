#!/bin/bash
# What the official image's entrypoint does that docker-compose.yml relies on: every environment
# variable named like a setting (lower case, with a dot: discovery.type, xpack.security.enabled...)
# is passed as -E NAME=VALUE, and ELASTIC_PASSWORD becomes the keystore's bootstrap.password (the
# elastic user's password until the .security index holds one). Then Elasticsearch, as PID 1.
set -euo pipefail
cd /usr/share/elasticsearch
settings=()
while IFS= read -r -d '' pair; do
  name="${pair%%=*}"
  if [[ "$name" =~ ^[a-z0-9_]+\.[a-z0-9_.]+$ ]]; then
    settings+=("-E" "$pair")
  fi
done < <(env -0)
# One run of the keystore tool (a JVM of 1-2 CPU-s), not the image's create, list and add: -f makes
# the keystore when there is none and sets the password whether it was there or not.
if [[ -n "${ELASTIC_PASSWORD:-}" ]]; then
  printf '%s' "$ELASTIC_PASSWORD" | bin/elasticsearch-keystore add -f -x bootstrap.password
fi
exec bin/elasticsearch "${settings[@]}" "$@"
