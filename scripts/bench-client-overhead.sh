#!/usr/bin/env bash
# Is the harness the bottleneck? Runs the same produce workload through Kafka's own
# ProducerPerformance (Java client) and through spate-bench (librdkafka), alternating, against
# one broker, and prints msgs/s and the CPU seconds each client process used.
#
# Env: BOOTSTRAP (127.0.0.1:19092)  RECORDS (3000000)  SIZE (256)  ACKS (1)  LINGER_MS (5)
#      BATCH_SIZE (131072)  PARTITIONS (1)  ROUNDS (2)  SPATE_BENCH (binary)
# Needs a running broker; scripts/kafka/start.sh gives a Kafka on 127.0.0.1:19092.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
B="${BOOTSTRAP:-127.0.0.1:19092}"
N="${RECORDS:-3000000}"; SIZE="${SIZE:-256}"; ACKS="${ACKS:-1}"
LINGER="${LINGER_MS:-5}"; BATCH="${BATCH_SIZE:-131072}"; PARTS="${PARTITIONS:-1}"; ROUNDS="${ROUNDS:-2}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
BIN="${SPATE_BENCH:-$TARGET_DIR/release/spate-bench}"
if [[ -z "${SPATE_BENCH:-}" ]]; then
  (cd "$ROOT" && cargo build -q --release -p spate-bench)
fi
WORK="$(mktemp -d /tmp/spate-bench-overhead.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

# CPU seconds (user+sys) and wall seconds of a command, via bash's `time` (includes children).
timed() { local out="$1"; shift; local TIMEFORMAT='%U %S %R'; { time "$@" > "$out" 2>&1; } 2> "$out.time"; }
cpu_of() { awk '{printf "%.2f", $1 + $2}' "$1.time"; }

echo "workload: $N records x $SIZE B, acks=$ACKS linger.ms=$LINGER batch.size=$BATCH, $PARTS partition(s), bootstrap $B"
printf '%-6s %-22s %14s %10s %10s\n' round client "msgs/s" "CPU s" "wall s"
for r in $(seq 1 "$ROUNDS"); do
  t="overhead-java-$r-$$"
  "$KAFKA_KIT/tool.sh" topics --bootstrap-server "$B" --create --topic "$t" --partitions "$PARTS" --replication-factor 1 >/dev/null
  timed "$WORK/java.$r" "$KAFKA_KIT/tool.sh" producer --bootstrap-server "$B" --topic "$t" --num-records "$N" \
    --record-size "$SIZE" --throughput -1 --command-property acks="$ACKS" linger.ms="$LINGER" batch.size="$BATCH"
  java_rate="$(grep -E 'records sent' "$WORK/java.$r" | tail -1 | sed -E 's/.*records sent, ([0-9.]+) records\/sec.*/\1/')"
  printf '%-6s %-22s %14.0f %10s %10s\n' "$r" "ProducerPerformance" "$java_rate" "$(cpu_of "$WORK/java.$r")" "$(awk '{print $3}' "$WORK/java.$r.time")"
  "$KAFKA_KIT/tool.sh" topics --bootstrap-server "$B" --delete --topic "$t" >/dev/null

  t="overhead-rust-$r-$$"
  timed "$WORK/rust.$r" "$BIN" -b "$B" -t "$t" --create-topic --delete-topic-after -p "$PARTS" -n "$N" -s "$SIZE" \
    --acks "$ACKS" --linger-ms "$LINGER" --batch-size "$BATCH" --no-progress --json-output "$WORK/rust.$r.json"
  rust_rate="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["produce"]["msgs_per_sec"])' "$WORK/rust.$r.json")"
  printf '%-6s %-22s %14.0f %10s %10s\n' "$r" "spate-bench" "$rust_rate" "$(cpu_of "$WORK/rust.$r")" "$(awk '{print $3}' "$WORK/rust.$r.time")"
done
