#!/usr/bin/env bash
# Drives Apache Kafka's own CLI tools (Kafka 4.3.1 from Maven Central, scripts/kafka) against a fresh spate:
# kafka-topics create/describe/list/alter/delete, kafka-configs, the console producer
# (idempotent by default) and console consumer, GetOffsetShell, and the producer perf test
# with default settings. Exits non-zero on the first mismatch.
#   scripts/kafka-tools-e2e.sh     against a throw-away spate (target/debug/spate; SPATE_BIN overrides)
#   SPATE_BOOTSTRAP=host:port scripts/kafka-tools-e2e.sh     against a running broker
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
# Without a broker given, run against a throw-away one.
[[ -n "${SPATE_BOOTSTRAP:-}" ]] || exec "$ROOT/scripts/with-spate.sh" -- "$0" "$@"
"$KAFKA_KIT/fetch.sh" >/dev/null
B="$SPATE_BOOTSTRAP"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

fail() { echo "FAIL: $*" >&2; [[ -f "${SPATE_LOG:-}" ]] && { echo "--- spate log" >&2; tail -50 "$SPATE_LOG" >&2; }; exit 1; }
pass() { echo "ok: $*"; }
tool() { timeout 120 "$KAFKA_KIT/tool.sh" "$@" 2>"$WORK/tool.err"; }
klass() { tool class "$@"; }

# kafka-topics
tool topics --bootstrap-server "$B" --create --topic cli-orders --partitions 3 | grep -q "Created topic cli-orders" \
  || fail "kafka-topics --create"
pass "kafka-topics --create"
tool topics --bootstrap-server "$B" --create --topic cli-orders --partitions 3 >/dev/null 2>&1 && fail "duplicate create succeeded"
grep -q "already exists" "$WORK/tool.err" || fail "duplicate create: no 'already exists' error"
pass "kafka-topics --create of an existing topic is refused"
tool topics --bootstrap-server "$B" --describe --topic cli-orders | grep -q "PartitionCount: 3" || fail "kafka-topics --describe"
pass "kafka-topics --describe"
tool topics --bootstrap-server "$B" --list | grep -qx "cli-orders" || fail "kafka-topics --list"
pass "kafka-topics --list"
tool topics --bootstrap-server "$B" --alter --topic cli-orders --partitions 4 >/dev/null || fail "kafka-topics --alter --partitions"
tool topics --bootstrap-server "$B" --describe --topic cli-orders | grep -q "PartitionCount: 4" || fail "partition count after --alter"
pass "kafka-topics --alter --partitions 4"

# kafka-configs (IncrementalAlterConfigs + DescribeConfigs)
klass kafka.admin.ConfigCommand --bootstrap-server "$B" --entity-type topics --entity-name cli-orders \
  --alter --add-config retention.ms=3600000,max.message.bytes=2000000 >/dev/null || fail "kafka-configs --alter"
klass kafka.admin.ConfigCommand --bootstrap-server "$B" --entity-type topics --entity-name cli-orders --describe \
  | grep -q "retention.ms=3600000" || fail "kafka-configs --describe"
pass "kafka-configs --alter / --describe"
klass kafka.admin.ConfigCommand --bootstrap-server "$B" --entity-type topics --entity-name cli-orders \
  --alter --add-config no.such.config=1 >/dev/null 2>&1 && fail "unknown config accepted"
pass "kafka-configs refuses an unknown config"

# Console producer (idempotent, acks=all by default in Kafka 4) and console consumer.
for i in $(seq 1 200); do echo "key$i:value-$i"; done > "$WORK/sent"
klass org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$B" --topic cli-orders \
  --reader-property parse.key=true --reader-property key.separator=: < "$WORK/sent" || fail "console producer"
total=$(klass org.apache.kafka.tools.GetOffsetShell --bootstrap-server "$B" --topic cli-orders | awk -F: '{s+=$3} END{print s}')
[[ "$total" == 200 ]] || fail "expected 200 records in cli-orders, GetOffsetShell says $total"
pass "console producer wrote 200 records (GetOffsetShell)"
: > "$WORK/got"
while IFS=: read -r _ p n; do
  [[ "$n" -gt 0 ]] || continue
  klass org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$B" --topic cli-orders --partition "$p" \
    --offset earliest --max-messages "$n" --timeout-ms 30000 \
    --formatter-property print.key=true --formatter-property key.separator=: >> "$WORK/got" || fail "console consumer on partition $p"
done < <(klass org.apache.kafka.tools.GetOffsetShell --bootstrap-server "$B" --topic cli-orders)
diff <(sort "$WORK/sent") <(sort "$WORK/got") | head -5 >&2; diff -q <(sort "$WORK/sent") <(sort "$WORK/got") >/dev/null || fail "console consumer read back different records"
pass "console consumer read back all 200 records, keys and values intact"

# Console consumer in a group, then kafka-consumer-groups.
groups() { klass org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "$B" "$@"; }
klass org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$B" --topic cli-orders --group cli-group \
  --from-beginning --max-messages 200 --timeout-ms 30000 > "$WORK/group-got" || fail "console consumer --group"
[[ $(wc -l < "$WORK/group-got") == 200 ]] || fail "console consumer --group read $(wc -l < "$WORK/group-got") records"
pass "console consumer --group read all 200 records"
groups --list | grep -qx cli-group || fail "kafka-consumer-groups --list"
desc=$(groups --describe --group cli-group)
lag=$(echo "$desc" | awk '$1=="cli-group" && $2=="cli-orders" {s+=$6} END{print s+0}')
committed=$(echo "$desc" | awk '$1=="cli-group" && $2=="cli-orders" {s+=$4} END{print s+0}')
[[ "$committed" == 200 && "$lag" == 0 ]] || { echo "$desc"; fail "describe: committed $committed, lag $lag"; }
pass "kafka-consumer-groups --describe: 200 committed, lag 0"
groups --reset-offsets --to-earliest --execute --group cli-group --topic cli-orders >/dev/null || fail "--reset-offsets"
lag=$(groups --describe --group cli-group | awk '$1=="cli-group" && $2=="cli-orders" {s+=$6} END{print s+0}')
[[ "$lag" == 200 ]] || fail "lag after --reset-offsets --to-earliest is $lag, expected 200"
pass "kafka-consumer-groups --reset-offsets --to-earliest --execute: lag back to 200"
# __consumer_offsets is a real internal topic: Kafka's offsets formatter reads the group's
# commits from it; --exclude-internal leaves it out of the listing; clients cannot delete it.
# (Read before the group is deleted, which writes tombstones.)
offsets=$(tool kafka-console-consumer --bootstrap-server "$B" --topic __consumer_offsets --from-beginning \
  --formatter org.apache.kafka.tools.consumer.OffsetsMessageFormatter --timeout-ms 10000 || true)
echo "$offsets" | tr '}' '\n' | grep -q '"group":"cli-group","topic":"cli-orders"' \
  || { echo "$offsets" | head -c 2000; fail "the offsets formatter found no commit of cli-group"; }
tool topics --bootstrap-server "$B" --list | grep -qx "__consumer_offsets" || fail "__consumer_offsets not listed"
tool topics --bootstrap-server "$B" --list --exclude-internal | grep -qx "__consumer_offsets" \
  && fail "--exclude-internal listed __consumer_offsets"
tool topics --bootstrap-server "$B" --describe --topic __consumer_offsets | grep -q "PartitionCount: 50" \
  || fail "__consumer_offsets does not have 50 partitions"
tool topics --bootstrap-server "$B" --delete --topic __consumer_offsets >/dev/null 2>&1 \
  && fail "deleting __consumer_offsets succeeded"
pass "__consumer_offsets: 50 partitions, internal, read by Kafka's offsets formatter, not deletable"
groups --delete --group cli-group | grep -q "successful" || fail "kafka-consumer-groups --delete"
groups --list | grep -qx cli-group && fail "group still listed after --delete"
pass "kafka-consumer-groups --delete"

# Producer perf test with default settings.
out=$(tool producer --bootstrap-server "$B" --topic cli-perf --num-records 100000 --record-size 256 --throughput -1)
echo "$out" | tail -1
grep -q "^100000 records sent" <<<"$out" || fail "producer perf test"
n=$(klass org.apache.kafka.tools.GetOffsetShell --bootstrap-server "$B" --topic cli-perf | awk -F: '{s+=$3} END{print s}')
[[ "$n" == 100000 ]] || fail "perf topic holds $n records, expected 100000"
pass "producer perf test: 100000 records acknowledged and stored"

# kafka-delete-records (DeleteRecords), then ListOffsets earliest sees the new start.
cat > "$WORK/delete.json" <<'JSON'
{"version": 1, "partitions": [{"topic": "cli-perf", "partition": 0, "offset": 1000}]}
JSON
klass org.apache.kafka.tools.DeleteRecordsCommand --bootstrap-server "$B" --offset-json-file "$WORK/delete.json" \
  | grep -q "partition: cli-perf-0.*low_watermark: 1000" || fail "kafka-delete-records"
earliest=$(klass org.apache.kafka.tools.GetOffsetShell --bootstrap-server "$B" --topic cli-perf --partitions 0 --time -2)
[[ "$earliest" == "cli-perf:0:1000" ]] || fail "earliest offset after delete-records is '$earliest'"
echo '{"version": 1, "partitions": [{"topic": "cli-perf", "partition": 0, "offset": 999999999}]}' > "$WORK/delete.json"
klass org.apache.kafka.tools.DeleteRecordsCommand --bootstrap-server "$B" --offset-json-file "$WORK/delete.json" 2>&1 \
  | grep -q "OffsetOutOfRange" || fail "kafka-delete-records past the high watermark was not refused"
pass "kafka-delete-records moves the log start; past the high watermark is OFFSET_OUT_OF_RANGE"

# kafka-log-dirs (DescribeLogDirs): one log dir holding the perf topic.
klass org.apache.kafka.tools.LogDirsCommand --bootstrap-server "$B" --describe --topic-list cli-perf \
  | grep -q '"partition":"cli-perf-0","size":[1-9]' || fail "kafka-log-dirs"
pass "kafka-log-dirs --describe"

# kafka-topics --describe in Kafka 4 goes through DescribeTopicPartitions; kafka-configs
# --describe without a name lists resources with ListConfigResources.
tool topics --bootstrap-server "$B" --describe --topic cli-perf | grep -q "Partition: 0.*Leader: .*Elr:" \
  || fail "kafka-topics --describe (DescribeTopicPartitions)"
klass kafka.admin.ConfigCommand --bootstrap-server "$B" --entity-type topics --describe \
  | grep -q "configs for topic cli-perf are" || fail "kafka-configs --describe of every topic"
pass "DescribeTopicPartitions and ListConfigResources through kafka-topics and kafka-configs"

# kafka-configs for client quotas (AlterClientQuotas / DescribeClientQuotas).
klass kafka.admin.ConfigCommand --bootstrap-server "$B" --alter --entity-type clients --entity-name cli-app \
  --add-config producer_byte_rate=1048576,consumer_byte_rate=2097152 >/dev/null || fail "kafka-configs --alter clients"
klass kafka.admin.ConfigCommand --bootstrap-server "$B" --alter --entity-type users --entity-default \
  --add-config request_percentage=200 >/dev/null || fail "kafka-configs --alter users --entity-default"
klass kafka.admin.ConfigCommand --bootstrap-server "$B" --describe --entity-type clients --entity-name cli-app \
  | grep -q "consumer_byte_rate=2097152.0, producer_byte_rate=1048576.0" || fail "kafka-configs --describe clients"
klass kafka.admin.ConfigCommand --bootstrap-server "$B" --describe --entity-type users \
  | grep -q "default user-principal are request_percentage=200.0" || fail "kafka-configs --describe users"
klass kafka.admin.ConfigCommand --bootstrap-server "$B" --alter --entity-type clients --entity-name cli-app \
  --add-config producer_byte_rate=-5 >/dev/null 2>&1 && fail "a negative quota was accepted"
klass kafka.admin.ConfigCommand --bootstrap-server "$B" --alter --entity-type clients --entity-name cli-app \
  --delete-config producer_byte_rate,consumer_byte_rate >/dev/null || fail "kafka-configs --delete-config clients"
klass kafka.admin.ConfigCommand --bootstrap-server "$B" --describe --entity-type clients --entity-name cli-app \
  | grep -q "byte_rate" && fail "deleted quotas still described"
klass kafka.admin.ConfigCommand --bootstrap-server "$B" --alter --entity-type users --entity-default \
  --delete-config request_percentage >/dev/null || fail "kafka-configs --delete-config users"
pass "kafka-configs --entity-type clients|users: quotas set, described, refused when negative, deleted"

# kafka-features (ApiVersions v3+ features): metadata.version finalized at Kafka 4.3's level,
# group.version at 1 (KIP-848 consumer groups).
features=$(klass org.apache.kafka.tools.FeatureCommand --bootstrap-server "$B" describe)
grep -q "metadata.version.*FinalizedVersionLevel: 4.3-IV0" <<<"$features" || fail "kafka-features describe"
grep -Eq "Feature: group.version.*FinalizedVersionLevel: 1" <<<"$features" || { echo "$features"; fail "group.version not finalized at 1"; }
pass "kafka-features describe: metadata.version 4.3-IV0, group.version 1"

# Delete
tool topics --bootstrap-server "$B" --delete --topic cli-orders >/dev/null || fail "kafka-topics --delete"
tool topics --bootstrap-server "$B" --list | grep -qx "cli-orders" && fail "topic still listed after delete"
pass "kafka-topics --delete"
echo "all Kafka tool checks passed"
