#!/usr/bin/env bash
# The standard load suite, with Kafka's own perf tools, against any Kafka-compatible broker:
#   bench.sh BOOTSTRAP
# Four topics (BENCH_PARTITIONS, BENCH_RF: 1, 1); ProducerPerformance BENCH_RECORDS (3,000,000)
# x 256 B unthrottled with acks=1, acks=all and acks=1 + lz4 (linger.ms=5, batch.size=131072);
# ConsumerPerformance over each; a latency run of 20,000 x 1 KiB at 2,000/s (acks=1,
# linger.ms=0). With BENCH_PID="pid ..." each step also reports the broker processes' CPU
# seconds (from /proc/PID/stat) and peak RSS (sampled every 0.5 s). BENCH_PREFIX names topics.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
B="${1:?usage: bench.sh BOOTSTRAP}"
N="${BENCH_RECORDS:-3000000}"
PARTS="${BENCH_PARTITIONS:-1}"
RF="${BENCH_RF:-1}"
PREFIX="${BENCH_PREFIX:-bench-$(date +%s)}"
PIDS="${BENCH_PID:-}"
HZ=$(getconf CLK_TCK)
ticks() { local sum=0 p; for p in $PIDS; do sum=$((sum + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$sum"; }
rss_kib() { local sum=0 p; for p in $PIDS; do sum=$((sum + $(awk '/^VmRSS/ {print $2}' "/proc/$p/status"))); done; echo "$sum"; }
measured() {  # measured NAME COMMAND...: runs it and, with BENCH_PID, prints the broker's cost
  local name=$1; shift
  echo "=== $name"
  if [[ -z "$PIDS" ]]; then "$@"; return; fi
  local t0 r0 w0 peak sampler
  t0=$(ticks); r0=$(rss_kib); w0=$EPOCHREALTIME; peak=$(mktemp)
  ( top=0; while :; do r=$(rss_kib); (( r > top )) && { top=$r; echo "$top" > "$peak"; }; sleep 0.5; done ) &
  sampler=$!
  "$@"
  kill "$sampler"; wait "$sampler" 2>/dev/null || true
  awk -v n="$name" -v c="$(( $(ticks) - t0 ))" -v hz="$HZ" -v a="$w0" -v b="$EPOCHREALTIME" \
    -v r0="$r0" -v rp="$(cat "$peak" 2>/dev/null || echo 0)" -v r1="$(rss_kib)" 'BEGIN {
      w = b - a; printf "broker during %s: cpu %.1fs in %.1fs wall = %.2f cores; RSS start %d MiB, peak %d MiB, end %d MiB\n",
        n, c / hz, w, c / hz / w, r0 / 1024, rp / 1024, r1 / 1024 }'
  rm -f "$peak"
}
for t in acks1 acksall lz4 lat; do
  "$KIT_DIR/tool.sh" topics --bootstrap-server "$B" --create --topic "$PREFIX-$t" --partitions "$PARTS" --replication-factor "$RF"
done
LOAD=(--record-size 256 --throughput -1 --command-property linger.ms=5 batch.size=131072)
measured "produce acks=1" "$KIT_DIR/tool.sh" producer --bootstrap-server "$B" --topic "$PREFIX-acks1" --num-records "$N" "${LOAD[@]}" acks=1
measured "produce acks=all" "$KIT_DIR/tool.sh" producer --bootstrap-server "$B" --topic "$PREFIX-acksall" --num-records "$N" "${LOAD[@]}" acks=all
measured "produce acks=1 lz4" "$KIT_DIR/tool.sh" producer --bootstrap-server "$B" --topic "$PREFIX-lz4" --num-records "$N" "${LOAD[@]}" acks=1 compression.type=lz4
for t in acks1 acksall lz4; do
  measured "consume $t" "$KIT_DIR/tool.sh" consumer --bootstrap-server "$B" --topic "$PREFIX-$t" --num-records "$N"
done
measured "latency 1KiB@2000/s" "$KIT_DIR/tool.sh" producer --bootstrap-server "$B" --topic "$PREFIX-lat" \
  --num-records 20000 --record-size 1024 --throughput 2000 --command-property acks=1 linger.ms=0
