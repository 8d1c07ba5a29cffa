#!/usr/bin/env bash
# The built-in schema registry on a throw-away 3-node cluster: reads on every node, writes sent
# to any node forwarded to the node leading _schemas, confluent-kafka's Avro serializers across nodes,
# a searchable topic of Avro values found by field through every node, and kill -9 of that
# node with registration going on through a surviving node, no id handed out twice, and
# records of a version registered after the kill found by field on the survivors. See scripts/schema_registry_cluster_e2e.py.
#   scripts/schema-registry-cluster-e2e.sh     (target/debug/spate; SPATE_BIN overrides)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 -c "from confluent_kafka.schema_registry.avro import AvroSerializer" 2>/dev/null \
  || pip install -q 'confluent-kafka[avro,json]'
exec timeout "${SCHEMA_REGISTRY_E2E_TIMEOUT:-300}" "$ROOT/scripts/with-spate-cluster.sh" \
  --spate-arg --schema-registry-listen --spate-arg 127.0.0.1:0 \
  -- python3 "$ROOT/scripts/schema_registry_cluster_e2e.py"
