#!/usr/bin/env bash
# Apache Kafka's own CLI tools against a 3-node spate cluster: kafka-topics creates an RF 3
# topic through one node and --describe through another shows leaders and a full ISR; RF
# above the brokers is refused; the console producer, console consumer and
# kafka-consumer-groups each go through a different node; then every check of
# kafka-tools-e2e.sh runs against the cluster. Exits non-zero on the first mismatch.
#   scripts/kafka-tools-cluster-e2e.sh     against a throw-away cluster (SPATE_BIN overrides the binary)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/anchor.sh"
[[ -n "$ANCHOR" ]] || { echo "Kafka anchor not found (set SPATE_KAFKA_ANCHOR to shared/anchors/kafka)" >&2; exit 2; }
[[ -n "${SPATE_BOOTSTRAP:-}" ]] || exec "$ROOT/scripts/with-spate-cluster.sh" -- "$0" "$@"
"$ANCHOR/install.sh" >/dev/null
IFS=, read -r B1 B2 B3 <<< "$SPATE_BOOTSTRAP"
[[ -n "$B3" ]] || { echo "SPATE_BOOTSTRAP must list three nodes" >&2; exit 2; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

fail() { echo "FAIL: $*" >&2; [[ -f "${SPATE_LOG:-}" ]] && { echo "--- node 1 log" >&2; tail -50 "$SPATE_LOG" >&2; }; exit 1; }
pass() { echo "ok: $*"; }
tool() { timeout 120 "$ANCHOR/perf.sh" "$@" 2>"$WORK/tool.err"; }
klass() { tool class "$@"; }

tool topics --bootstrap-server "$B1" --create --topic rf3 --partitions 3 --replication-factor 3 \
  --config min.insync.replicas=2 | grep -q "Created topic rf3" || fail "kafka-topics --create --replication-factor 3"
pass "kafka-topics --create --replication-factor 3 (through node 1)"
desc=$(tool topics --bootstrap-server "$B2" --describe --topic rf3)
echo "$desc"
full=$(echo "$desc" | grep -cE "Leader: [123]	Replicas: [123],[123],[123]	Isr: [123],[123],[123]" || true)
[[ "$full" == 3 ]] || fail "--describe: expected 3 partitions with a leader, 3 replicas and 3 in sync"
leaders=$(echo "$desc" | sed -n 's/.*Leader: \([0-9]*\).*/\1/p' | sort -u | wc -l)
[[ "$leaders" == 3 ]] || fail "--describe: leaders not spread over the three nodes"
pass "kafka-topics --describe (through node 2): leaders spread, full ISR"
tool topics --bootstrap-server "$B3" --create --topic rf4 --partitions 1 --replication-factor 4 >/dev/null 2>&1 \
  && fail "replication factor 4 on 3 brokers was accepted"
grep -qi "replication factor" "$WORK/tool.err" || { cat "$WORK/tool.err" >&2; fail "RF 4: no replication factor error"; }
pass "kafka-topics refuses replication factor 4 on three brokers"

for i in $(seq 1 300); do echo "k$i:v-$i"; done > "$WORK/sent"
klass org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$B2" --topic rf3 \
  --command-property acks=all --reader-property parse.key=true --reader-property key.separator=: \
  < "$WORK/sent" || fail "console producer through node 2"
pass "console producer, acks=all, through node 2"
klass org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$B3" --topic rf3 --group rf3-group \
  --from-beginning --max-messages 300 --timeout-ms 30000 \
  --formatter-property print.key=true --formatter-property key.separator=: > "$WORK/got" || fail "console consumer through node 3"
diff -q <(sort "$WORK/sent") <(sort "$WORK/got") >/dev/null || fail "console consumer read back different records"
pass "console consumer --group through node 3 read all 300 records"
desc=$(klass org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "$B1" --describe --group rf3-group)
committed=$(echo "$desc" | awk '$1=="rf3-group" && $2=="rf3" {s+=$4} END{print s+0}')
lag=$(echo "$desc" | awk '$1=="rf3-group" && $2=="rf3" {s+=$6} END{print s+0}')
[[ "$committed" == 300 && "$lag" == 0 ]] || { echo "$desc"; fail "kafka-consumer-groups --describe: committed $committed, lag $lag"; }
pass "kafka-consumer-groups --describe through node 1: 300 committed, lag 0"

echo "--- the single-broker tool checks, against the cluster"
"$ROOT/scripts/kafka-tools-e2e.sh"
echo "all Kafka tool checks against the cluster passed"
