#!/bin/sh
# Install flowstat's Elasticsearch templates (the JSON files beside this script) into ES_URL.
# For a server set up by hand (the compose stack's `setup` service and `flowstat stack up` install the
# same files with `flowstat provision`); idempotent. The lifecycle
# policy goes in only where the server has ILM. Indices an older flowstat made get this version's
# new fields (mapping-*.json); one whose field changed type is named. Needs curl.
set -eu
ES_URL="${ES_URL:-http://127.0.0.1:9200}"
DIR="$(cd "$(dirname "$0")" && pwd)"
put() {
  code=$(curl -s -o /tmp/flowstat-es-put.out -w '%{http_code}' -X PUT "$ES_URL/$1" \
         -H 'Content-Type: application/json' --data-binary "@$DIR/$2")
  case "$code" in
    2??) echo "installed $1" ;;
    404) if [ "${3:-}" = "no index yet" ]; then echo "no index for $1 yet"
         else echo "install.sh: PUT $ES_URL/$1: HTTP 404: $(cat /tmp/flowstat-es-put.out)" >&2; exit 1; fi ;;
    *) echo "install.sh: PUT $ES_URL/$1 failed with HTTP $code: $(cat /tmp/flowstat-es-put.out)" >&2; exit 1 ;;
  esac
}
for c in flowstat-settings flowstat-sample-mappings flowstat-run-mappings flowstat-agent-mappings \
         flowstat-node-10s-mappings flowstat-verdict-mappings flowstat-edge-mappings; do
  put "_component_template/$c" "component-$c.json"
done
ilm=""
if [ "$(curl -s -o /dev/null -w '%{http_code}' "$ES_URL/_ilm/status")" = 200 ]; then
  put "_ilm/policy/flowstat" ilm-policy-flowstat.json
  put "_component_template/flowstat-lifecycle" component-flowstat-lifecycle.json
  ilm="-ilm"
fi
put "_index_template/flowstat-samples" "index-template-flowstat-samples$ilm.json"
put "_index_template/flowstat-agents" "index-template-flowstat-agents$ilm.json"
put "_index_template/flowstat-runs" index-template-flowstat-runs.json
put "_index_template/flowstat-node-10s" "index-template-flowstat-node-10s$ilm.json"
put "_index_template/flowstat-verdicts" "index-template-flowstat-verdicts$ilm.json"
put "_index_template/flowstat-edges" "index-template-flowstat-edges$ilm.json"
for index in flowstat-samples flowstat-agents flowstat-runs flowstat-verdicts flowstat-edges; do
  put "$index*/_mapping" "mapping-$index.json" "no index yet"
done
