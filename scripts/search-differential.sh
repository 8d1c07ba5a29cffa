#!/usr/bin/env bash
# Differential test of searchable topics against a real engine: OpenSearch 2.19 (the kit in
# scripts/opensearch, jars pinned and cached in ~/.cache/spate-opensearch) and a throw-away spate
# (target/debug/spate, or SPATE_BIN) on free loopback ports, the same documents in both, the same
# Grafana-shaped requests and opensearch-py calls against both (scripts/search_differential.py;
# its KNOWN list says which differences are accepted and which are spate defects). Both are
# stopped at the end, also when a check fails. Env: DIFF_DOCS, DIFF_ONLY, DIFF_VERBOSE (see the .py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka
python3 -c "import opensearchpy" 2>/dev/null || pip install -q opensearch-py
WORK="$(mktemp -d)"
cleanup() {
  "$ROOT/scripts/opensearch/stop.sh" "$WORK/opensearch" >/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
read -r HTTP_PORT TRANSPORT_PORT < <(python3 "$ROOT/scripts/free-ports.py" 2)
"$ROOT/scripts/opensearch/start.sh" "$WORK/opensearch" "$HTTP_PORT" "$TRANSPORT_PORT" \
  || { tail -40 "$WORK/opensearch/logs/opensearch.log" >&2 2>/dev/null; exit 1; }
export OPENSEARCH_HTTP="127.0.0.1:$HTTP_PORT"
# The bound is inside with-spate.sh, so that it still stops spate when the bound is hit.
"$ROOT/scripts/with-spate.sh" -- timeout "${DIFF_TIMEOUT:-300}" python3 "$ROOT/scripts/search_differential.py"
