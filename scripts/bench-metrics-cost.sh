#!/usr/bin/env bash
# What observability costs: Kafka's perf tool's 3M x 256 B acks=1 producer run against spate built with
# metrics (default) and with them compiled out (--no-default-features), interleaved ROUNDS
# times; prints records/s and broker CPU seconds for each run.
#   scripts/bench-metrics-cost.sh [ROUNDS]       default 2
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
ROUNDS="${1:-2}"; N="${BENCH_RECORDS:-3000000}"
OUT="$(mktemp -d)"
cargo build --release --bin spate -p spate-server --manifest-path "$ROOT/Cargo.toml" >&2
cp "$ROOT/target/release/spate" "$OUT/spate-metrics-on"
cargo build --release --bin spate -p spate-server --no-default-features --manifest-path "$ROOT/Cargo.toml" >&2
cp "$ROOT/target/release/spate" "$OUT/spate-metrics-off"
TCK=$(getconf CLK_TCK)
run() {  # run BINARY LABEL
  local dir; dir="$(mktemp -d)"
  "$1" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir "$dir/data" > "$dir/out" 2>/dev/null &
  local pid=$!
  for _ in $(seq 1 100); do [[ -s "$dir/out" ]] && break; sleep 0.1; done
  local b; b=$(awk 'NR==1{print $4}' "$dir/out")
  "$KAFKA_KIT/tool.sh" topics --bootstrap-server "$b" --create --topic cost --partitions 1 >/dev/null
  local c0; c0=$(awk '{print $14+$15}' /proc/$pid/stat)
  local line; line=$("$KAFKA_KIT/tool.sh" producer --bootstrap-server "$b" --topic cost --num-records "$N" --record-size 256 \
    --throughput -1 --command-property acks=1 linger.ms=5 batch.size=131072 | tail -1)
  local c1; c1=$(awk '{print $14+$15}' /proc/$pid/stat)
  kill $pid; wait $pid 2>/dev/null || true; rm -rf "$dir"
  local rate; rate=$(echo "$line" | awk '{print $4}')
  awk -v l="$2" -v r="$rate" -v c="$((c1 - c0))" -v t="$TCK" -v n="$N" \
    'BEGIN{printf "%-12s %12.0f records/s   broker CPU %5.2f s   %6.0f ns CPU/record\n", l, r, c/t, c/t/n*1e9}'
}
# Alternate which goes first, so warm-up effects do not favour one build.
for i in $(seq 1 "$ROUNDS"); do
  if (( i % 2 )); then
    run "$OUT/spate-metrics-on" "metrics-on"; run "$OUT/spate-metrics-off" "metrics-off"
  else
    run "$OUT/spate-metrics-off" "metrics-off"; run "$OUT/spate-metrics-on" "metrics-on"
  fi
done
rm -rf "$OUT"
