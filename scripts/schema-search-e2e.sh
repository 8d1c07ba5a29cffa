#!/usr/bin/env bash
# Searchable topics of schema'd values: confluent-kafka's AvroSerializer and ProtobufSerializer
# produce to topics with search.value.format=schema (and auto), _search finds records by their
# decoded fields with counts equal to a brute-force scan, _source is the decoded object, and
# values that cannot be decoded are indexed as text and counted; after a kill -9 right after
# producing (v1 and a just-registered v2), the restarted broker indexes them all by field. See
# scripts/schema_search_e2e.py.
#   scripts/schema-search-e2e.sh     (target/debug/spate; SPATE_BIN overrides)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 -c "from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer" 2>/dev/null \
  || pip install -q 'confluent-kafka[avro,protobuf]'
exec timeout "${SCHEMA_SEARCH_E2E_TIMEOUT:-180}" python3 "$ROOT/scripts/schema_search_e2e.py"
