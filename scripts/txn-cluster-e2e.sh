#!/usr/bin/env bash
# Transactions on a throw-away 3-node spate cluster (replication factor 3): the librdkafka
# checks of scripts/txn_client_e2e.py, then exactly-once Kafka Streams
# (scripts/txn-streams-e2e.sh) with the transaction coordinator's node killed (kill -9) while
# the app runs: the node that coordinates the app's transactional id (kafka-transactions list
# names it) dies, another leader of its __transaction_state partition rebuilds the state, aborts
# or completes what was in flight, and the checker still finds every input counted exactly once.
#   scripts/txn-cluster-e2e.sh     (target/debug/spate; SPATE_BIN overrides)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${SPATE_NODE_PIDS:-}" ]]; then
  exec "$ROOT/scripts/with-spate-cluster.sh" -- "$0" "$@"
fi
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka
timeout 300 python3 "$ROOT/scripts/txn_client_e2e.py"
# The hook: find the coordinator of the Streams app's transactional id and kill its node.
export SPATE_NODE_PIDS
MID_RUN_HOOK='
  coord=""
  for _ in $(seq 1 60); do
    coord="$("'"$ROOT"'/scripts/kafka/tool.sh" class org.apache.kafka.tools.TransactionsCommand \
      --bootstrap-server "$SPATE_BOOTSTRAP" list 2>/dev/null \
      | awk -v app="$TXN_APP_ID" "index(\$1, app) == 1 { print \$2; exit }")"
    [[ -n "$coord" ]] && break
    sleep 0.5
  done
  [[ -n "$coord" ]] || { echo "no coordinator found for $TXN_APP_ID" >&2; exit 1; }
  pid="$(tr " " "\n" <<<"$SPATE_NODE_PIDS" | awk -F= -v n="$coord" "\$1 == n { print \$2 }")"
  echo "killing node $coord (pid $pid), the transaction coordinator of $TXN_APP_ID"
  kill -9 "$pid"
' TXN_RECORDS="${TXN_RECORDS:-200000}" exec "$ROOT/scripts/txn-streams-e2e.sh"
