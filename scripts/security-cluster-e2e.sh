#!/usr/bin/env bash
# A secured 3-node cluster with clients nobody on this team wrote: SASL_SSL (SCRAM, PLAIN)
# through librdkafka and Kafka's kafka-configs / kafka-acls, mutual TLS between the nodes,
# HTTPS, credentials and ACLs replicated through the quorum, Metadata per listener, and a
# leader killed with kill -9 under acks=all with every acknowledged record read back. See
# scripts/security_cluster_e2e.py.
#   scripts/security-cluster-e2e.sh     (target/debug/spate; SPATE_BIN overrides)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka
python3 -c "import cryptography" 2>/dev/null || pip install -q cryptography
"$ROOT/scripts/kafka/fetch.sh" >/dev/null
CERTS="$(mktemp -d)"
trap 'rm -rf "$CERTS"' EXIT
python3 "$ROOT/scripts/security_e2e.py" certs "$CERTS"
exec timeout "${SECURITY_E2E_TIMEOUT:-900}" python3 "$ROOT/scripts/security_cluster_e2e.py" "$CERTS"
