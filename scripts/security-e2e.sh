#!/usr/bin/env bash
# TLS and SASL with clients nobody on this team wrote: librdkafka (confluent-kafka) over
# PLAINTEXT, SSL (with and without a client certificate), SASL_PLAINTEXT and SASL_SSL with
# PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512; Metadata per listener; refused logins, mechanisms and
# certificates (expired, from another CA, an untrusted broker, TLS on the plaintext port and
# the reverse); kafka-configs adding, describing and deleting a SCRAM user; Kafka's console
# producer and consumer over SASL_SSL. See scripts/security_e2e.py.
#   scripts/security-e2e.sh     against a throw-away spate (target/debug/spate; SPATE_BIN overrides)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka
python3 -c "import cryptography" 2>/dev/null || pip install -q cryptography
"$ROOT/scripts/kafka/fetch.sh" >/dev/null
if [[ -z "${SPATE_LISTENERS:-}" ]]; then
  CERTS="$(mktemp -d)"
  trap 'rm -rf "$CERTS"' EXIT
  python3 "$ROOT/scripts/security_e2e.py" certs "$CERTS"
  export SPATE_BOOTSTRAP_USERS="admin:admin-secret,alice:alice-secret"
  SECURITY_CERTS="$CERTS" "$ROOT/scripts/with-spate.sh" \
    --spate-arg --listeners \
    --spate-arg "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0" \
    --spate-arg --ssl-cert --spate-arg "$CERTS/server.pem" \
    --spate-arg --ssl-key --spate-arg "$CERTS/server.key" \
    --spate-arg --ssl-ca --spate-arg "$CERTS/ca.pem" \
    --spate-arg --ssl-client-auth --spate-arg requested \
    -- "$0" "$@"
  exit $?
fi
exec timeout "${SECURITY_E2E_TIMEOUT:-600}" python3 "$ROOT/scripts/security_e2e.py" check "$SECURITY_CERTS"
