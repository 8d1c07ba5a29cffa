#!/usr/bin/env bash
# The built-in schema registry with security on (--http-auth basic, --authorizer acl): the same
# SASL users as the Kafka listeners and the HTTP API, HTTP Basic; confluent-kafka's
# SchemaRegistryClient with basic.auth.user.info registers and reads for a user whose ACLs on
# the subject's topic allow it, gets 401 without (or with wrong) credentials and 403 (40301)
# for a user without the ACL; a schema with references needs Describe on each referenced
# subject's topic; the global config needs AlterConfigs on the cluster. Every HTTP listener
# (the registry's and the node's) serves HTTPS only (--http-tls true), with certificates made
# for the run. See scripts/schema_registry_security_e2e.py.
#   scripts/schema-registry-security-e2e.sh     (target/debug/spate; SPATE_BIN overrides)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 -c "from confluent_kafka.schema_registry.avro import AvroSerializer" 2>/dev/null \
  || pip install -q 'confluent-kafka[avro,json]'
python3 -c "import cryptography" 2>/dev/null || pip install -q cryptography
CERTS="$(mktemp -d)"
trap 'rm -rf "$CERTS"' EXIT
python3 "$ROOT/scripts/security_e2e.py" certs "$CERTS"
export SCHEMA_REGISTRY_CA="$CERTS/ca.pem"
export SPATE_BOOTSTRAP_USERS="admin:admin-secret,alice:alice-secret,bob:bob-secret"
timeout "${SCHEMA_REGISTRY_E2E_TIMEOUT:-300}" "$ROOT/scripts/with-spate.sh" \
  --spate-arg --ssl-cert --spate-arg "$CERTS/server.pem" \
  --spate-arg --ssl-key --spate-arg "$CERTS/server.key" \
  --spate-arg --http-tls --spate-arg true \
  --spate-arg --listeners --spate-arg "SASL_PLAINTEXT://127.0.0.1:0" \
  --spate-arg --authorizer --spate-arg acl \
  --spate-arg --super-users --spate-arg User:admin \
  --spate-arg --http-auth --spate-arg basic \
  --spate-arg --schema-registry-listen --spate-arg 127.0.0.1:0 \
  -- python3 "$ROOT/scripts/schema_registry_security_e2e.py"
