#!/usr/bin/env bash
# KIP-932 share groups with Apache Kafka's own Java clients against spate:
#   1. kafka-console-share-consumer reads the records produced to a topic; kafka-share-groups
#      lists the group, describes its share-partition start offsets, resets them to the
#      earliest (the group reads everything again), deletes them and deletes the group;
#   2. three KafkaShareConsumer members (scripts/share/ShareWorker.java) share one partition:
#      one takes records and is killed with kill -9 while holding their locks, the two others
#      accept everything; the killed member's records come back after the lock duration (5 s
#      here) and are accepted by the others. Every produced record is accepted, each exactly
#      once (acceptances are printed only after commitSync confirms them).
#   scripts/share-groups-e2e.sh     against a throw-away spate (target/debug/spate; SPATE_BIN overrides)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
# A short lock so the killed member's records come back quickly (below the 15 s a group config
# may set, so through the environment). Where the groups start is set per group with
# kafka-configs below, as a Kafka user would.
if [[ -z "${SPATE_BOOTSTRAP:-}" ]]; then
  export SPATE_GROUP_SHARE_RECORD_LOCK_DURATION_MS=5000
  exec "$ROOT/scripts/with-spate.sh" -- "$0" "$@"
fi
"$KAFKA_KIT/fetch.sh" >/dev/null
B="$SPATE_BOOTSTRAP"
WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; [[ -f "${SPATE_LOG:-}" ]] && { echo "--- spate log" >&2; tail -30 "$SPATE_LOG" >&2; }; exit 1; }
pass() { echo "ok: $*"; }
produce() { # TOPIC FIRST LAST: values v-FIRST..v-LAST
  seq "$2" "$3" | sed 's/^/v-/' | timeout 120 "$KAFKA_KIT/tool.sh" class org.apache.kafka.tools.ConsoleProducer \
    --bootstrap-server "$B" --topic "$1" >/dev/null 2>>"$WORK/tool.err" || fail "produce to $1"
}
worker() { # MODE NAME
  "$KAFKA_KIT/tool.sh" class "$ROOT/scripts/share/ShareWorker.java" "$1" "$B" "$TOPIC" "$GROUP" "$2" "$WORK/stop" \
    >"$WORK/$2.out" 2>"$WORK/$2.err" &
  PIDS+=($!)
}

# Records produced before a group exists are read when the group starts at the earliest.
earliest() { # GROUP
  timeout 90 "$KAFKA_KIT/tool.sh" kafka-configs --bootstrap-server "$B" --alter --entity-type groups \
    --entity-name "$1" --add-config share.auto.offset.reset=earliest >/dev/null 2>>"$WORK/tool.err" \
    || fail "kafka-configs --alter --entity-type groups --entity-name $1"
  timeout 90 "$KAFKA_KIT/tool.sh" kafka-configs --bootstrap-server "$B" --describe --entity-type groups \
    --entity-name "$1" 2>>"$WORK/tool.err" | grep -q "share.auto.offset.reset=earliest" \
    || fail "kafka-configs --describe does not show share.auto.offset.reset=earliest for $1"
}

# 1. The console share consumer.
"$KAFKA_KIT/tool.sh" topics --bootstrap-server "$B" --create --topic share-console --partitions 2 >/dev/null 2>>"$WORK/tool.err" \
  || fail "create share-console"
earliest share-console-group
pass "kafka-configs --entity-type groups sets and describes share.auto.offset.reset"
produce share-console 1 100
timeout 90 "$KAFKA_KIT/tool.sh" class org.apache.kafka.tools.consumer.ConsoleShareConsumer --bootstrap-server "$B" \
  --topic share-console --group share-console-group --max-messages 100 >"$WORK/console.out" 2>"$WORK/console.err" \
  || { cat "$WORK/console.err" >&2; fail "console share consumer"; }
got=$(grep -c '^v-' "$WORK/console.out" || true)
[[ "$(grep '^v-' "$WORK/console.out" | sort -u | wc -l)" == 100 ]] || fail "console share consumer read $got records, not the 100 produced"
pass "kafka-console-share-consumer read the 100 records produced to 2 partitions"
shares() { timeout 90 "$KAFKA_KIT/tool.sh" kafka-share-groups --bootstrap-server "$B" "$@" 2>>"$WORK/tool.err"; }
shares --list | grep -qx share-console-group || fail "kafka-share-groups --list does not show share-console-group"
# Every record was acknowledged (on close at the latest): the start offsets add up to 100.
offsets=$(shares --describe --group share-console-group) || fail "kafka-share-groups --describe"
sum=$(awk '$1=="share-console-group" && $2=="share-console" {s+=$4} END {print s+0}' <<<"$offsets")
[[ "$sum" == 100 ]] || { echo "$offsets"; fail "share-partition start offsets add up to $sum, not 100"; }
pass "kafka-share-groups --list shows the group; --describe: start offsets past all 100 records"
shares --reset-offsets --group share-console-group --topic share-console --to-earliest --execute >/dev/null \
  || fail "kafka-share-groups --reset-offsets"
sum=$(shares --describe --group share-console-group | awk '$1=="share-console-group" && $2=="share-console" {s+=$4} END {print s+0}')
[[ "$sum" == 0 ]] || fail "start offsets add up to $sum after --reset-offsets --to-earliest"
timeout 90 "$KAFKA_KIT/tool.sh" class org.apache.kafka.tools.consumer.ConsoleShareConsumer --bootstrap-server "$B" \
  --topic share-console --group share-console-group --max-messages 100 >"$WORK/console2.out" 2>"$WORK/console2.err" \
  || { cat "$WORK/console2.err" >&2; fail "console share consumer after the reset"; }
[[ "$(grep '^v-' "$WORK/console2.out" | sort -u | wc -l)" == 100 ]] || fail "the reset group did not read the 100 records again"
pass "kafka-share-groups --reset-offsets --to-earliest: the group reads the 100 records again"
shares --delete-offsets --group share-console-group --topic share-console >/dev/null || fail "kafka-share-groups --delete-offsets"
d=$(shares --describe --group share-console-group) || fail "kafka-share-groups --describe after --delete-offsets"
awk '$1=="share-console-group" && $2=="share-console"' <<<"$d" | grep -q . \
  && fail "share-console still has share-partition state after --delete-offsets"
pass "kafka-share-groups --delete-offsets forgot the topic's share-partition state"
shares --delete --group share-console-group >/dev/null || fail "kafka-share-groups --delete"
shares --list | grep -qx share-console-group && fail "share-console-group still listed after --delete"
pass "kafka-share-groups --delete removed the Empty group"

# 2. Three members on one partition, one killed while holding locks.
TOPIC=share-work
GROUP=share-workers
RECORDS=3000
earliest "$GROUP"
"$KAFKA_KIT/tool.sh" topics --bootstrap-server "$B" --create --topic "$TOPIC" --partitions 1 >/dev/null 2>>"$WORK/tool.err" \
  || fail "create $TOPIC"
produce "$TOPIC" 1 1000
worker hold hog; HOG=$!
for _ in $(seq 1 90); do grep -q '^holding' "$WORK/hog.out" 2>/dev/null && break; sleep 1; done
grep -q '^holding' "$WORK/hog.out" || { cat "$WORK/hog.err" >&2; fail "the holding member never got records"; }
held=$(grep -c '^held ' "$WORK/hog.out")
pass "member 'hog' holds $held records under acquisition locks"
worker work w1
worker work w2
members() { shares --describe --group "$GROUP" --members 2>/dev/null | awk -v g="$GROUP" '$1==g' | wc -l; }
for _ in $(seq 1 60); do [[ "$(members)" == 3 ]] && break; sleep 1; done
[[ "$(members)" == 3 ]] || fail "three members never joined"
pass "three KafkaShareConsumer members share the one partition ($(shares --describe --group "$GROUP" --members | awk -v g="$GROUP" '$1==g {print $6}' | sort | uniq -c | xargs))"
kill -9 "$HOG"
wait "$HOG" 2>/dev/null || true
pass "member 'hog' killed (kill -9) while holding its locks"
# The rest is produced while the two others consume.
seq 1001 "$RECORDS" | while read -r i; do echo "v-$i"; (( i % 200 == 0 )) && sleep 0.3; done \
  | timeout 120 "$KAFKA_KIT/tool.sh" class org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$B" --topic "$TOPIC" \
    >/dev/null 2>>"$WORK/tool.err" || fail "produce to $TOPIC"

accepted() { cat "$WORK"/w1.out "$WORK"/w2.out 2>/dev/null | awk '$1=="accepted"{print $2}'; }
for _ in $(seq 1 120); do [[ "$(accepted | sort -u | wc -l)" -ge "$RECORDS" ]] && break; sleep 1; done
touch "$WORK/stop"
n=$(accepted | sort -u | wc -l)
[[ "$n" == "$RECORDS" ]] || fail "$n of $RECORDS records accepted"
pass "every one of the $RECORDS records was accepted"
dups=$(accepted | sort | uniq -d | wc -l)
[[ "$dups" == 0 ]] || fail "$dups records were accepted more than once"
pass "each record was accepted by exactly one member (w1: $(grep -c '^accepted' "$WORK/w1.out" || true), w2: $(grep -c '^accepted' "$WORK/w2.out" || true))"
# The killed member's records were delivered a second time.
redelivered=$(grep '^held ' "$WORK/hog.out" | awk '{print $2}' | sort > "$WORK/held"; \
  cat "$WORK"/w1.out "$WORK"/w2.out | awk '$1=="accepted" && $3>=2 {print $2}' | sort | comm -12 - "$WORK/held" | wc -l)
[[ "$redelivered" == "$held" ]] || fail "only $redelivered of the $held held records came back with a delivery count of 2+"
pass "the $held records the killed member held were redelivered (delivery count 2) and accepted by the others"
for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
PIDS=()
