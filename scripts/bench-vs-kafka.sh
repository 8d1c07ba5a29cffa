#!/usr/bin/env bash
# The standard load suite (Kafka's own perf tools, scripts/kafka/bench.sh) against a
# real Apache Kafka and against spate, one after the other on this machine, plus the time a
# 3-member librdkafka group takes to settle when a 4th member joins. Results go to
# $OUT (default target/bench-vs-kafka/<date>), one log per broker.
#   scripts/bench-vs-kafka.sh [SPATE_FSYNC...]     default: interval always
# Env: BENCH_RECORDS (3000000), OUT, SPATE_BIN (the spate to measure), SPATE_BASELINE_BIN (an
# earlier build measured the same way right after it, for before/after comparisons).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
OUT="${OUT:-$ROOT/target/bench-vs-kafka/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
policies=("$@"); [[ ${#policies[@]} -gt 0 ]] || policies=(interval always)
# SPATE_BIN: a spate binary to measure (default: build target/release/spate).
if [[ -z "${SPATE_BIN:-}" ]]; then
  cargo build --release --bin spate --manifest-path "$ROOT/Cargo.toml"
  SPATE_BIN="$ROOT/target/release/spate"
fi
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka

settle() {  # settle BOOTSTRAP LABEL
  python3 "$ROOT/scripts/group_settle.py" "$1" > "$OUT/settle-$2.txt" 2>&1 || true
  cat "$OUT/settle-$2.txt"
}

# Apache Kafka, fresh, same group.initial.rebalance.delay.ms as spate's default (3000).
KPORT=19092
KDIR="$(mktemp -d /tmp/kafka-bench.XXXX)"
KAFKA_PORT=$KPORT KAFKA_DATA_DIR="$KDIR" KAFKA_FRESH=1 \
  KAFKA_EXTRA_PROPS="group.initial.rebalance.delay.ms=3000" "$KAFKA_KIT/start.sh" > "$OUT/kafka-start.log"
KPID=$(cat "$KDIR/kafka.pid")
echo "== kafka pid $KPID"
# Every broker starts its runs with the page cache in the same state: writing into fresh page
# cache is most of a broker's CPU per record here, and a run after a multi-GiB one would also
# pay for writing that back.
"$ROOT/scripts/drop-page-cache.sh"
BENCH_PID=$KPID BENCH_PREFIX=kafka "$KAFKA_KIT/bench.sh" 127.0.0.1:$KPORT 2>&1 | tee "$OUT/kafka.txt"
settle 127.0.0.1:$KPORT kafka
KAFKA_PORT=$KPORT KAFKA_DATA_DIR="$KDIR" "$KAFKA_KIT/stop.sh" >/dev/null || true
rm -rf "$KDIR"

bins=("current=$SPATE_BIN")
[[ -n "${SPATE_BASELINE_BIN:-}" ]] && bins+=("baseline=$SPATE_BASELINE_BIN")
for policy in "${policies[@]}"; do
for entry in "${bins[@]}"; do
  label="${entry%%=*}"; bin="${entry#*=}"
  SDIR="$(mktemp -d /tmp/spate-bench.XXXX)"
  # group.initial.rebalance.delay.ms=0, as Kafka's kit sets it (scripts/kafka/start.sh).
  "$bin" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir "$SDIR/data" --fsync "$policy" \
    --group-initial-rebalance-delay-ms 0 > "$SDIR/stdout" 2> "$SDIR/spate.log" &
  SPID=$!
  for _ in $(seq 1 100); do [[ -s "$SDIR/stdout" ]] && break; sleep 0.1; done
  SB=$(awk 'NR==1{print $4}' "$SDIR/stdout")
  echo "== spate $label ($policy) pid $SPID at $SB"
  "$ROOT/scripts/drop-page-cache.sh"
  BENCH_PID=$SPID BENCH_PREFIX=spate "$KAFKA_KIT/bench.sh" "$SB" 2>&1 | tee "$OUT/spate-$label-$policy.txt"
  settle "$SB" "spate-$label-$policy"
  kill $SPID; wait $SPID 2>/dev/null || true
  rm -rf "$SDIR"
done
done
echo "results in $OUT"
