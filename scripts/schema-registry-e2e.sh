#!/usr/bin/env bash
# The built-in schema registry with clients nobody on this team wrote: confluent-kafka's
# SchemaRegistryClient, AvroSerializer/AvroDeserializer, JSONSerializer/JSONDeserializer and
# ProtobufSerializer/ProtobufDeserializer producing to and consuming from a throw-away spate;
# evolution, compatibility levels, references, normalization, deletes, modes, Confluent's error
# codes for bad input, and a kill -9 and restart after which everything is as it was. See
# scripts/schema_registry_e2e.py.
#   scripts/schema-registry-e2e.sh     (target/debug/spate; SPATE_BIN overrides)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The client's schema registry extras: fastavro and avro, jsonschema, httpx, attrs, cachetools,
# protobuf and googleapis-common-protos (the Protobuf message classes are built in code).
python3 -c "from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer" 2>/dev/null \
  || pip install -q 'confluent-kafka[avro,json,protobuf]'
exec timeout "${SCHEMA_REGISTRY_E2E_TIMEOUT:-300}" python3 "$ROOT/scripts/schema_registry_e2e.py"
