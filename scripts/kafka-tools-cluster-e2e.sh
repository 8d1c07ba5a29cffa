#!/usr/bin/env bash
# Apache Kafka's own CLI tools against a 3-node spate cluster: kafka-topics creates an RF 3
# topic through one node and --describe through another shows leaders and a full ISR; RF
# above the brokers is refused; the console producer, console consumer and
# kafka-consumer-groups each go through a different node (also a KIP-848 consumer group); then every check of
# kafka-tools-e2e.sh runs against the cluster; kafka-metadata-quorum describes the quorum. Exits non-zero on the first mismatch.
#   scripts/kafka-tools-cluster-e2e.sh     against a throw-away cluster (SPATE_BIN overrides the binary)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
[[ -n "${SPATE_BOOTSTRAP:-}" ]] || exec "$ROOT/scripts/with-spate-cluster.sh" -- "$0" "$@"
"$KAFKA_KIT/fetch.sh" >/dev/null
IFS=, read -r B1 B2 B3 <<< "$SPATE_BOOTSTRAP"
[[ -n "$B3" ]] || { echo "SPATE_BOOTSTRAP must list three nodes" >&2; exit 2; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

fail() { echo "FAIL: $*" >&2; [[ -f "${SPATE_LOG:-}" ]] && { echo "--- node 1 log" >&2; tail -50 "$SPATE_LOG" >&2; }; exit 1; }
pass() { echo "ok: $*"; }
tool() { timeout 120 "$KAFKA_KIT/tool.sh" "$@" 2>"$WORK/tool.err"; }
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
# The same with KIP-848's consumer protocol: the coordinator is the node leading the
# replicated offsets partition, found through FindCoordinator from any node.
klass org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$B2" --topic rf3 --group rf3-kip848 \
  --command-property group.protocol=consumer --from-beginning --max-messages 300 --timeout-ms 30000 \
  --formatter-property print.key=true --formatter-property key.separator=: > "$WORK/got848" \
  || fail "console consumer with group.protocol=consumer through node 2"
diff -q <(sort "$WORK/sent") <(sort "$WORK/got848") >/dev/null || fail "the KIP-848 consumer read back different records"
desc=$(klass org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "$B3" --describe --group rf3-kip848)
committed=$(echo "$desc" | awk '$1=="rf3-kip848" && $2=="rf3" {s+=$4} END{print s+0}')
[[ "$committed" == 300 ]] || { echo "$desc"; fail "KIP-848 group: committed $committed"; }
klass org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "$B1" --list --type \
  | grep -Eq "^rf3-kip848 +Consumer" || fail "--list --type does not show rf3-kip848 as Consumer"
pass "console consumer with group.protocol=consumer through node 2 read all 300; committed 300, listed as Consumer"

# Partition moves with kafka-reassign-partitions: a replication factor 2 topic placed by
# hand, a --generate plan, an --execute with a throttle that moves partition 0 from
# [1,2] to [3,1], and --verify until it completes (which also clears the throttles).
tool topics --bootstrap-server "$B1" --create --topic rf2 --replica-assignment 1:2,2:3,3:1 \
  | grep -q "Created topic rf2" || fail "kafka-topics --create --replica-assignment"
for i in $(seq 1 200); do echo "v-$i"; done | klass org.apache.kafka.tools.ConsoleProducer \
  --bootstrap-server "$B1" --topic rf2 --command-property acks=all || fail "producing to rf2"
echo '{"version":1,"topics":[{"topic":"rf2"}]}' > "$WORK/topics.json"
klass org.apache.kafka.tools.reassign.ReassignPartitionsCommand --bootstrap-server "$B2" --generate --topics-to-move-json-file "$WORK/topics.json" \
  --broker-list 1,2,3 > "$WORK/generated" || { cat "$WORK/tool.err" >&2; fail "kafka-reassign-partitions --generate"; }
grep -q "Proposed partition reassignment configuration" "$WORK/generated" || fail "--generate printed no plan"
pass "kafka-reassign-partitions --generate"
echo '{"version":1,"partitions":[{"topic":"rf2","partition":0,"replicas":[3,1]}]}' > "$WORK/plan.json"
klass org.apache.kafka.tools.reassign.ReassignPartitionsCommand --bootstrap-server "$B2" --execute --reassignment-json-file "$WORK/plan.json" \
  --throttle 50000000 > "$WORK/executed" || { cat "$WORK/executed" "$WORK/tool.err" >&2; fail "kafka-reassign-partitions --execute"; }
grep -q "Successfully started partition reassignment" "$WORK/executed" || { cat "$WORK/executed" >&2; fail "--execute did not start the move"; }
pass "kafka-reassign-partitions --execute --throttle"
done_move=""
for _ in $(seq 1 60); do
  klass org.apache.kafka.tools.reassign.ReassignPartitionsCommand --bootstrap-server "$B3" --verify --reassignment-json-file "$WORK/plan.json" > "$WORK/verified" || true
  if grep -q "Reassignment of partition rf2-0 is completed" "$WORK/verified"; then done_move=1; break; fi
  sleep 1
done
[[ -n "$done_move" ]] || { cat "$WORK/verified" "$WORK/tool.err" >&2; fail "--verify never reported the move completed"; }
grep -q "Clearing broker-level throttles" "$WORK/verified" || { cat "$WORK/verified" >&2; fail "--verify did not clear the throttles"; }
pass "kafka-reassign-partitions --verify: completed, throttles cleared"
desc=$(tool topics --bootstrap-server "$B1" --describe --topic rf2)
grep -qE "Partition: 0	Leader: [13]	Replicas: 3,1	Isr: (3,1|1,3)" <<<"$desc" || { echo "$desc"; fail "rf2-0 is not on [3,1] after the move"; }
pass "kafka-topics --describe shows rf2-0 on [3,1] in sync"
klass kafka.admin.ConfigCommand --bootstrap-server "$B1" --describe --entity-type brokers --entity-name 1 > "$WORK/brokercfg" \
  || fail "kafka-configs --describe broker 1"
grep -q "follower.replication.throttled.rate" "$WORK/brokercfg" && { cat "$WORK/brokercfg" >&2; fail "the throttle is still set on broker 1"; }
pass "the replication throttle is gone from broker 1"

# Leadership: a preferred election moves rf2-0's leadership to its first replica, 3.
klass org.apache.kafka.tools.LeaderElectionCommand --bootstrap-server "$B1" --election-type PREFERRED --topic rf2 --partition 0 \
  > "$WORK/elected" 2>&1 || grep -q "already elected" "$WORK/elected" || { cat "$WORK/elected" "$WORK/tool.err" >&2; fail "kafka-leader-election --election-type PREFERRED"; }
for _ in $(seq 1 30); do
  desc=$(tool topics --bootstrap-server "$B1" --describe --topic rf2)
  grep -qE "Partition: 0	Leader: 3	" <<<"$desc" && break
  sleep 0.5
done
grep -qE "Partition: 0	Leader: 3	" <<<"$desc" || { echo "$desc"; fail "rf2-0 is not led by its preferred replica 3"; }
pass "kafka-leader-election PREFERRED: rf2-0 led by 3"
klass org.apache.kafka.tools.LeaderElectionCommand --bootstrap-server "$B2" --election-type PREFERRED --all-topic-partitions > "$WORK/elected" 2>&1 \
  || { cat "$WORK/elected" >&2; fail "kafka-leader-election --all-topic-partitions"; }
pass "kafka-leader-election --all-topic-partitions"

# Cluster-level settings with kafka-configs: the automatic leader rebalance interval.
klass kafka.admin.ConfigCommand --bootstrap-server "$B1" --alter --entity-type brokers --entity-default \
  --add-config leader.imbalance.check.interval.seconds=30 >/dev/null || { cat "$WORK/tool.err" >&2; fail "kafka-configs --alter --entity-default"; }
klass kafka.admin.ConfigCommand --bootstrap-server "$B3" --describe --entity-type brokers --entity-default > "$WORK/defaults" || fail "kafka-configs --describe --entity-default"
grep -q "leader.imbalance.check.interval.seconds=30" "$WORK/defaults" || { cat "$WORK/defaults" >&2; fail "the cluster default is not shown"; }
klass kafka.admin.ConfigCommand --bootstrap-server "$B1" --alter --entity-type brokers --entity-default \
  --add-config no.such.setting=1 >/dev/null 2>&1 && fail "an unknown broker config was accepted"
pass "kafka-configs sets and shows a cluster-wide broker default; refuses unknown keys"

# The metadata quorum as kafka-metadata-quorum shows it: asked of a follower node, answered by
# the quorum leader (DescribeQuorum).
tool kafka-metadata-quorum --bootstrap-server "$B2" describe --status > "$WORK/quorum" || { cat "$WORK/tool.err" >&2; fail "kafka-metadata-quorum describe --status"; }
grep -qE '^LeaderId:[[:space:]]+[123]$' "$WORK/quorum" && grep -q '"id": 1,' "$WORK/quorum" && grep -q '"id": 2,' "$WORK/quorum" && grep -q '"id": 3,' "$WORK/quorum" \
  || { cat "$WORK/quorum" >&2; fail "kafka-metadata-quorum --status: no leader among three voters"; }
tool kafka-metadata-quorum --bootstrap-server "$B3" describe --replication > "$WORK/replication" || { cat "$WORK/tool.err" >&2; fail "kafka-metadata-quorum describe --replication"; }
[[ "$(grep -cE '(Leader|Follower)[[:space:]]*$' "$WORK/replication")" == 3 ]] || { cat "$WORK/replication" >&2; fail "kafka-metadata-quorum --replication: expected a leader and two followers"; }
pass "kafka-metadata-quorum describe --status and --replication: three voters, one leader"

echo "--- the single-broker tool checks, against the cluster"
"$ROOT/scripts/kafka-tools-e2e.sh"
echo "all Kafka tool checks against the cluster passed"
