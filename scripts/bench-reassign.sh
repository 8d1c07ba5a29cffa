#!/usr/bin/env bash
# Partition-move benchmark, spate against Apache Kafka on the same machine, one after the other.
# For each system: a 3-node cluster plus a fourth node; a topic "bulk" of 4 partitions with
# replicas on nodes 1-3 is filled with BENCH_BYTES (default 1 GiB) of 1 KiB records; then,
#   1. baseline: Kafka's ProducerPerformance (acks=all, 256 B, BENCH_RATE records/s for
#      BENCH_SECONDS) on topic "live" with nothing moving;
#   2. unthrottled move: every "bulk" replica on node 3 moves to node 4 with
#      kafka-reassign-partitions --execute (no throttle) while the same producer runs;
#   3. throttled move: the replicas move back to node 3 with --throttle BENCH_THROTTLE B/s.
# Each move is timed from --execute until --verify reports every partition completed.
# Results in $OUT (default target/bench-reassign/<date>); a summary is printed at the end.
# Env: BENCH_BYTES (1073741824), BENCH_RATE (20000), BENCH_SECONDS (30), BENCH_THROTTLE
#      (52428800), SPATE_BIN (default: builds target/release/spate), BENCH_ONLY=spate|kafka.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
OUT="${OUT:-$ROOT/target/bench-reassign/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
BYTES="${BENCH_BYTES:-1073741824}"
RATE="${BENCH_RATE:-20000}"
SECONDS_LIVE="${BENCH_SECONDS:-30}"
THROTTLE="${BENCH_THROTTLE:-52428800}"
RECORDS=$(( BYTES / 1024 ))
LIVE_RECORDS=$(( RATE * SECONDS_LIVE ))
if [[ -z "${SPATE_BIN:-}" ]]; then
  cargo build --release --bin spate --manifest-path "$ROOT/Cargo.toml"
  SPATE_BIN="$ROOT/target/release/spate"
fi
"$KAFKA_KIT/fetch.sh" >/dev/null
P="$KAFKA_KIT/tool.sh"
reassign() { "$P" class org.apache.kafka.tools.reassign.ReassignPartitionsCommand --bootstrap-server "$1" "${@:2}"; }

plan() { # plan TO: the third replica of every bulk partition goes to node TO
  local to=$1 parts=()
  for p in 0 1 2 3; do
    local r=$(( p % 2 == 0 ? 1 : 2 )) s=$(( p % 2 == 0 ? 2 : 1 ))
    parts+=("{\"topic\":\"bulk\",\"partition\":$p,\"replicas\":[$r,$s,$to]}")
  done
  local IFS=,
  echo "{\"version\":1,\"partitions\":[${parts[*]}]}"
}

# run_suite NAME BOOTSTRAP: fill, baseline, unthrottled move 3->4, throttled move 4->3.
run_suite() {
  local name=$1 bs=$2
  "$P" topics --bootstrap-server "$bs" --create --topic bulk --replica-assignment 1:2:3,2:1:3,1:2:3,2:1:3 >/dev/null
  "$P" topics --bootstrap-server "$bs" --create --topic live --partitions 3 --replication-factor 3 >/dev/null
  echo "== $name: filling bulk with $RECORDS x 1 KiB"
  "$P" producer --bootstrap-server "$bs" --topic bulk --num-records "$RECORDS" --record-size 1024 \
    --throughput -1 --command-property acks=1 --command-property linger.ms=5 --command-property batch.size=262144 \
    | tail -1 | tee "$OUT/$name-fill.txt"
  sleep 5
  echo "== $name: baseline producer ($RATE/s x 256 B, acks=all), nothing moving"
  "$P" producer --bootstrap-server "$bs" --topic live --num-records "$LIVE_RECORDS" --record-size 256 \
    --throughput "$RATE" --command-property acks=all | tail -1 | tee "$OUT/$name-baseline.txt"
  for phase in unthrottled throttled; do
    local to=4 extra=()
    [[ $phase == throttled ]] && { to=3; extra=(--throttle "$THROTTLE"); }
    plan "$to" > "$OUT/$name-$phase-plan.json"
    "$P" producer --bootstrap-server "$bs" --topic live --num-records "$LIVE_RECORDS" --record-size 256 \
      --throughput "$RATE" --command-property acks=all > "$OUT/$name-$phase-producer.txt" 2>&1 &
    local prod=$!
    local t0; t0=$(date +%s.%N)
    reassign "$bs" --execute --reassignment-json-file "$OUT/$name-$phase-plan.json" "${extra[@]}" > "$OUT/$name-$phase-execute.txt" \
      || { kill "$prod" 2>/dev/null; cat "$OUT/$name-$phase-execute.txt" >&2; return 1; }
    local done_at=""
    for _ in $(seq 1 1800); do
      if reassign "$bs" --verify --reassignment-json-file "$OUT/$name-$phase-plan.json" > "$OUT/$name-$phase-verify.txt" 2>&1 \
        && [[ $(grep -c "is completed" "$OUT/$name-$phase-verify.txt") == 4 ]]; then
        done_at=$(date +%s.%N); break
      fi
      sleep 0.5
    done
    wait "$prod" || true
    if [[ -n "$done_at" ]]; then
      echo "$name $phase move: $(awk "BEGIN{printf \"%.1f\", $done_at - $t0}") s" | tee "$OUT/$name-$phase-time.txt"
    else
      echo "$name $phase move: did not complete within 15 min" | tee "$OUT/$name-$phase-time.txt"
    fi
    tail -1 "$OUT/$name-$phase-producer.txt" | tee -a "$OUT/$name-$phase-time.txt"
  done
}

if [[ "${BENCH_ONLY:-}" != spate ]]; then
  KDIR="$(mktemp -d /tmp/kafka-reassign-bench.XXXX)"
  KAFKA_CLUSTER_DIR="$KDIR" KAFKA_FRESH=1 "$KAFKA_KIT/start-cluster.sh" > "$OUT/kafka-start.log"
  # The fourth node: a broker only, joining the three controllers' quorum.
  KAFKA_NODE_ID=4 KAFKA_PORT=19095 KAFKA_CONTROLLER_PORT=29095 KAFKA_DATA_DIR="$KDIR/node-4" \
    KAFKA_VOTERS="1@127.0.0.1:29092,2@127.0.0.1:29093,3@127.0.0.1:29094" KAFKA_RF=3 \
    KAFKA_CLUSTER_ID="$(cat "$KDIR/cluster.id")" \
    KAFKA_EXTRA_PROPS="process.roles=broker listeners=PLAINTEXT://127.0.0.1:19095" \
    "$KAFKA_KIT/start.sh" >> "$OUT/kafka-start.log"
  run_suite kafka 127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094,127.0.0.1:19095 || echo "kafka suite failed" >&2
  # Wait for the broker-only node to exit: spate's node 4 takes its port next.
  k4="$(cat "$KDIR/node-4/kafka.pid")"
  kill "$k4" 2>/dev/null || true
  for _ in $(seq 1 120); do kill -0 "$k4" 2>/dev/null || break; sleep 0.5; done
  KAFKA_CLUSTER_DIR="$KDIR" "$KAFKA_KIT/stop-cluster.sh" >/dev/null 2>&1 || true
  rm -rf "$KDIR"
fi

if [[ "${BENCH_ONLY:-}" != kafka ]]; then
  SDIR="$(mktemp -d /tmp/spate-reassign-bench.XXXX)"
  PEERS="1=127.0.0.1:19601,2=127.0.0.1:19602,3=127.0.0.1:19603"
  pids=()
  for i in 1 2 3 4; do
    peers="$PEERS"; [[ $i == 4 ]] && peers="$PEERS,4=127.0.0.1:19604"
    "$SPATE_BIN" --node-id "$i" --cluster-peers "$peers" --cluster-listen "127.0.0.1:1960$i" \
      --listen "127.0.0.1:1909$((i + 1))" --http-listen "127.0.0.1:1970$i" --data-dir "$SDIR/node-$i" \
      > "$SDIR/node-$i.out" 2> "$SDIR/node-$i.log" &
    pids+=($!)
  done
  trap 'kill -9 "${pids[@]}" 2>/dev/null || true; cp "$SDIR"/node-*.log "$OUT"/ 2>/dev/null; rm -rf "$SDIR"' EXIT
  for i in 1 2 3; do
    for _ in $(seq 1 120); do curl -sf "127.0.0.1:1970$i/ready" >/dev/null && break; sleep 0.5; done
  done
  "$SPATE_BIN" cluster add-node --http 127.0.0.1:19701 --node-id 4 --addr 127.0.0.1:19604
  ready=""
  for _ in $(seq 1 120); do curl -sf 127.0.0.1:19704/ready >/dev/null && { ready=1; break; }; sleep 0.5; done
  [[ -n "$ready" ]] || { echo "node 4 did not become ready; its log is in $OUT/node-4.log" >&2; exit 1; }
  run_suite spate 127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094,127.0.0.1:19095
fi

echo
echo "== summary ($BYTES bytes moved per phase; producer $RATE/s x 256 B acks=all)"
for f in "$OUT"/*-baseline.txt "$OUT"/*-time.txt; do echo "-- $(basename "$f" .txt)"; cat "$f"; done
