#!/usr/bin/env bash
# Kafka transactions through librdkafka (confluent-kafka): interleaved commits and aborts under
# read_committed and read_uncommitted, zombie fencing, consume-transform-produce with
# send_offsets_to_transaction, the broker timing out a stalled transaction, refused bad input
# (a transaction timeout above the broker's max, a missing topic) and the read_committed
# ListOffsets answer while a transaction is open. See scripts/txn_client_e2e.py.
#   scripts/txn-client-e2e.sh [CHECK...]     against a throw-away spate (target/debug/spate; SPATE_BIN overrides)
#   SPATE_BOOTSTRAP=host:port scripts/txn-client-e2e.sh [CHECK...]     against a running broker
# CHECK: part of a check's name, to run only those. The broker must abort a timed-out
# transaction within a few seconds: for Apache Kafka (scripts/kafka/start.sh) pass
#   KAFKA_EXTRA_PROPS=transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka
# Without a broker given, run against a throw-away one.
[[ -n "${SPATE_BOOTSTRAP:-}" ]] || exec "$ROOT/scripts/with-spate.sh" -- "$0" "$@"
exec timeout "${TXN_E2E_TIMEOUT:-300}" python3 "$ROOT/scripts/txn_client_e2e.py" "$@"
