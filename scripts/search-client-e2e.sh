#!/usr/bin/env bash
# A real search client (opensearch-py) against a throw-away spate: search(), count(),
# search_after paging, aggregations and errors, checked against a brute-force scan.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka
python3 -c "import opensearchpy" 2>/dev/null || pip install -q opensearch-py
exec "$ROOT/scripts/with-spate.sh" -- python3 "$ROOT/scripts/search_client_e2e.py"
