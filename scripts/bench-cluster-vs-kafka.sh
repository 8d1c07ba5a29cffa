#!/usr/bin/env bash
# Cluster benchmark, same machine, same client, one after the other: Kafka's own perf suite
# (scripts/kafka/bench.sh: produce acks=1, acks=all, lz4; consume; latency) with one
# topic per run of 3 partitions, replication factor 3, against
#   1. Apache Kafka's 3-node KRaft cluster (scripts/kafka/start-cluster.sh: min.insync.replicas 2),
#   2. a 3-node spate cluster (every node broker + voter),
#   3. spate standalone (replication factor 1), for the cost of replication,
# with total broker CPU and RSS sampled over all nodes; then the failover time of both
# clusters (scripts/failover_probe.py: kill -9 of a partition leader until the first acks=all
# record after it is acknowledged). Results in $OUT (default target/bench-cluster/<date>).
# Env: BENCH_RECORDS (1000000), SPATE_BIN (default: builds target/release/spate),
#      SPATE_FSYNC (interval, spate's default; Kafka never fsyncs per ack).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
OUT="${OUT:-$ROOT/target/bench-cluster/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
export BENCH_RECORDS="${BENCH_RECORDS:-1000000}"
FSYNC="${SPATE_FSYNC:-interval}"
if [[ -z "${SPATE_BIN:-}" ]]; then
  cargo build --release --bin spate --manifest-path "$ROOT/Cargo.toml"
  SPATE_BIN="$ROOT/target/release/spate"
fi
export SPATE_BIN
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka
"$KAFKA_KIT/fetch.sh" >/dev/null

# Kafka's kit (scripts/kafka/start.sh) sets group.initial.rebalance.delay.ms=0, so spate runs
# with the same: with its default of 3 s, every ConsumerPerformance run waited 3 s more for its
# group to form, which its records/s counts.
SAME_AS_KAFKA=(--spate-arg --group-initial-rebalance-delay-ms --spate-arg 0)

# 1. Kafka's cluster.
KDIR="$(mktemp -d /tmp/kafka-cluster-bench.XXXX)"
KAFKA_CLUSTER_DIR="$KDIR" KAFKA_FRESH=1 "$KAFKA_KIT/start-cluster.sh" > "$OUT/kafka-start.log"
KB=127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094
KPIDS=(); for i in 1 2 3; do KPIDS+=("$(cat "$KDIR/node-$i/kafka.pid")"); done
echo "== kafka cluster pids ${KPIDS[*]}"
# The same page cache state before each broker's suite (see bench-vs-kafka.sh).
"$ROOT/scripts/drop-page-cache.sh"
BENCH_PARTITIONS=3 BENCH_RF=3 BENCH_PID="${KPIDS[*]}" BENCH_PREFIX=kafka "$KAFKA_KIT/bench.sh" "$KB" 2>&1 | tee "$OUT/kafka-cluster.txt"
"$KAFKA_KIT/tool.sh" topics --bootstrap-server "$KB" --create --topic failover --partitions 3 --replication-factor 3 >/dev/null
python3 "$ROOT/scripts/failover_probe.py" "$KB" failover "1=${KPIDS[0]}" "2=${KPIDS[1]}" "3=${KPIDS[2]}" 2>&1 | tee "$OUT/kafka-failover.txt"
KAFKA_CLUSTER_DIR="$KDIR" "$KAFKA_KIT/stop-cluster.sh" >/dev/null 2>&1 || true
rm -rf "$KDIR"

# 2. spate's cluster.
"$ROOT/scripts/with-spate-cluster.sh" --spate-arg --fsync --spate-arg "$FSYNC" "${SAME_AS_KAFKA[@]}" -- bash -c '
  set -euo pipefail
  pids=""; for e in $SPATE_NODE_PIDS; do pids="$pids ${e#*=}"; done
  echo "== spate cluster ('"$FSYNC"') pids$pids at $SPATE_BOOTSTRAP"
  "'"$ROOT"'/scripts/drop-page-cache.sh"
  BENCH_PARTITIONS=3 BENCH_RF=3 BENCH_PID="$pids" BENCH_PREFIX=spate "'"$KAFKA_KIT"'/bench.sh" "$SPATE_BOOTSTRAP" 2>&1 | tee "'"$OUT"'/spate-cluster.txt"
  "'"$KAFKA_KIT"'/tool.sh" topics --bootstrap-server "$SPATE_BOOTSTRAP" --create --topic failover --partitions 3 --replication-factor 3 >/dev/null
  python3 "'"$ROOT"'/scripts/failover_probe.py" "$SPATE_BOOTSTRAP" failover $SPATE_NODE_PIDS 2>&1 | tee "'"$OUT"'/spate-failover.txt"
'

# 3. spate standalone, same suite with replication factor 1.
"$ROOT/scripts/with-spate.sh" --spate-arg --fsync --spate-arg "$FSYNC" "${SAME_AS_KAFKA[@]}" -- bash -c '
  echo "== spate standalone pid $SPATE_PID at $SPATE_BOOTSTRAP"
  "'"$ROOT"'/scripts/drop-page-cache.sh"
  BENCH_PARTITIONS=3 BENCH_RF=1 BENCH_PID="$SPATE_PID" BENCH_PREFIX=standalone "'"$KAFKA_KIT"'/bench.sh" "$SPATE_BOOTSTRAP" 2>&1 | tee "'"$OUT"'/spate-standalone.txt"
'
echo
echo "== summary (records/s, avg and percentile latencies, broker CPU and RSS over all nodes)"
for f in kafka-cluster spate-cluster spate-standalone; do
  echo "-- $f"
  grep -E "records sent|records/sec|^broker during|^===" "$OUT/$f.txt" | grep -v "^=== consume" | head -40
done
echo "-- failover"; cat "$OUT/kafka-failover.txt" "$OUT/spate-failover.txt"
echo "results in $OUT"
