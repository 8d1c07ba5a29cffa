#!/usr/bin/env bash
# Rebalance time: a 4th member joining a group of 3 until every partition is owned once by the
# 4 (the group Stable again), measured by scripts/kip848/GroupWatch.java with Kafka's own Java
# consumer and Admin client, on a 12-partition topic:
#   spate, classic protocol (group.protocol=classic)
#   spate, KIP-848 (group.protocol=consumer)
#   Apache Kafka 4.3 (scripts/kafka, 127.0.0.1:19092), KIP-848, and classic for reference
# Every broker and client runs with default group settings (consumer heartbeat interval 5 s,
# classic heartbeat.interval.ms 3 s). Kafka is stopped afterwards.
#   scripts/bench-rebalance.sh [ROUNDS]     (default 5; SPATE_BIN picks the spate binary)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
ROUNDS="${1:-5}"
TOPIC=rebalance-bench
"$KAFKA_KIT/fetch.sh" >/dev/null
BENCH_DIR="$(mktemp -d)"
KAFKA_STARTED=0
cleanup() {
  [[ "$KAFKA_STARTED" == 1 ]] && "$KAFKA_KIT/stop.sh" >/dev/null 2>&1 || true
  rm -rf "$BENCH_DIR"
}
trap cleanup EXIT

# Runs ROUNDS measurements against $1 with group.protocol=$2; appends "label ms" lines.
measure() {
  local bootstrap="$1" protocol="$2" label="$3"
  timeout 1200 "$KAFKA_KIT/tool.sh" class "$ROOT/scripts/kip848/GroupWatch.java" rebalance \
    "$bootstrap" "bench-$protocol-$RANDOM" "$TOPIC" "$protocol" "$ROUNDS" 2>"$BENCH_DIR/$label.err" \
    | sed -n "s/^rebalance_ms=/$label /p" | tee -a "$BENCH_DIR/results"
}

create_topic() {
  "$KAFKA_KIT/tool.sh" topics --bootstrap-server "$1" --create --topic "$TOPIC" --partitions 12 >/dev/null
}

spate_side() {
  create_topic "$SPATE_BOOTSTRAP"
  measure "$SPATE_BOOTSTRAP" classic spate-classic
  measure "$SPATE_BOOTSTRAP" consumer spate-kip848
}
export -f spate_side measure create_topic
export KAFKA_KIT ROOT TOPIC ROUNDS BENCH_DIR
"$ROOT/scripts/with-spate.sh" -- bash -c spate_side

KAFKA_FRESH=1 "$KAFKA_KIT/start.sh" >/dev/null
KAFKA_STARTED=1
create_topic 127.0.0.1:19092
measure 127.0.0.1:19092 consumer kafka-kip848
measure 127.0.0.1:19092 classic kafka-classic
"$KAFKA_KIT/stop.sh" >/dev/null
KAFKA_STARTED=0

echo
echo "| broker, protocol | rounds | median ms | min ms | max ms |"
echo "|---|---|---|---|---|"
for label in spate-classic spate-kip848 kafka-kip848 kafka-classic; do
  awk -v l="$label" '$1==l {print $2}' "$BENCH_DIR/results" | sort -n > "$BENCH_DIR/$label.sorted"
  n=$(wc -l < "$BENCH_DIR/$label.sorted")
  [[ "$n" -gt 0 ]] || { echo "| $label | 0 | - | - | - |"; continue; }
  median=$(awk -v n="$n" 'NR==int((n+1)/2)' "$BENCH_DIR/$label.sorted")
  echo "| $label | $n | $median | $(head -1 "$BENCH_DIR/$label.sorted") | $(tail -1 "$BENCH_DIR/$label.sorted") |"
done
