#!/usr/bin/env bash
# Search indexing capacity and freshness on a realistic log corpus (scripts/search_corpus.py:
# JSON log lines of ~420 B with varied fields and an 8,000-word vocabulary). Prints numbers;
# asserts nothing.
#   1. Capacity: COUNT records produced to a topic with search off, then search turned on: the
#      indexers take the whole history as fast as they can. Record bytes indexed per second of
#      wall time and per second of broker CPU (MB/s per core), with positions (text fields).
#   2. Freshness: at FRESH_SHARE (0.8) of the measured wall-clock indexing rate, records are
#      produced for FRESH_SECONDS (20) into a searchable topic of 4 and of 256 partitions while
#      scripts/search_freshness.py polls for them; p50/p90/p99 time from acknowledgement to
#      searchable.
# Env: COUNT (1,000,000), PARTITIONS (4), FRESH_SHARE (0.8), FRESH_SECONDS (20),
#      SPATE_BIN (default: cargo build --release), ONLY=capacity|freshness.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export COUNT="${COUNT:-1000000}" PARTITIONS="${PARTITIONS:-4}" FRESH_SHARE="${FRESH_SHARE:-0.8}"
export FRESH_SECONDS="${FRESH_SECONDS:-20}" ONLY="${ONLY:-}" ROOT
if [[ -z "${SPATE_BIN:-}" ]]; then
  cargo build --release -q -p spate-server --manifest-path "$ROOT/Cargo.toml"
  export SPATE_BIN="$ROOT/target/release/spate"
fi
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka

"$ROOT/scripts/with-spate.sh" -- bash -c '
set -euo pipefail
ticks() { awk "{print \$14 + \$15}" "/proc/$SPATE_PID/stat"; }
hz=$(getconf CLK_TCK)
count() { curl -s "$SPATE_HTTP/$1/_count" | python3 -c "import json,sys; print(json.load(sys.stdin).get(\"count\", -1))"; }
create() { # create NAME PARTITIONS SEARCH
  curl -sf -XPOST "$SPATE_HTTP/admin/topics" -H "content-type: application/json" \
    -d "{\"name\":\"$1\",\"partitions\":$2,\"replication_factor\":1,\"configs\":{\"search.enabled\":\"$3\"}}" >/dev/null
}
rate=""
if [[ "$ONLY" != freshness ]]; then
  create corpus "$PARTITIONS" false
  read -r n bytes < <(python3 "$ROOT/scripts/search_corpus.py" produce "$SPATE_BOOTSTRAP" corpus "$PARTITIONS" "$COUNT")
  sleep 2
  t0=$(ticks); s0=$(date +%s.%N)
  curl -sf -XPATCH "$SPATE_HTTP/admin/topics/corpus/configs" -H "content-type: application/json" \
    -d "{\"search.enabled\":\"true\"}" >/dev/null
  # Bounded: at most 30 minutes.
  for _ in $(seq 1 18000); do
    [[ "$(count corpus)" == "$n" ]] && break
    sleep 0.1
  done
  t1=$(ticks); s1=$(date +%s.%N)
  python3 - "$n" "$bytes" "$t0" "$t1" "$hz" "$s0" "$s1" <<PY
import sys
n, b, t0, t1, hz = (int(x) for x in sys.argv[1:6])
s0, s1 = float(sys.argv[6]), float(sys.argv[7])
wall, cpu = s1 - s0, (t1 - t0) / hz
mb = b / 1e6
print(f"capacity: {n} records, {mb:.1f} MB of record bytes indexed in {wall:.1f} s wall, {cpu:.1f} s broker CPU")
print(f"capacity: {mb / wall:.1f} MB/s wall ({n / wall:.0f} records/s), {mb / cpu:.1f} MB/s per core of broker CPU")
PY
  rate=$(python3 -c "import sys; print(int(float(sys.argv[1]) / (float(sys.argv[3]) - float(sys.argv[2])) * float(sys.argv[4])))" "$n" "$s0" "$s1" "$FRESH_SHARE")
  du -sb "$(dirname "$SPATE_LOG")/data/search" | awk -v b="$bytes" "{printf \"index size: %.2f bytes per record byte\n\", \$1 / b}"
fi
if [[ "$ONLY" != capacity ]]; then
  rate="${FRESH_RATE:-${rate:-5000}}"
  for parts in 4 256; do
    create "fresh$parts" "$parts" true
    sleep 2
    echo "freshness, $parts partitions, $rate records/s ($FRESH_SHARE of capacity):"
    t0=$(ticks); s0=$(date +%s.%N)
    python3 "$ROOT/scripts/search_freshness.py" "$SPATE_BOOTSTRAP" "$SPATE_HTTP" "fresh$parts" "$parts" "$rate" "$FRESH_SECONDS" corpus
    t1=$(ticks); s1=$(date +%s.%N)
    # What the broker took meanwhile (produce, indexing and the polls), of the 2 cores here.
    python3 -c "import sys; t0, t1, hz, s0, s1 = map(float, sys.argv[1:]); print(f\"broker CPU: {(t1 - t0) / hz / (s1 - s0):.2f} cores\")" "$t0" "$t1" "$hz" "$s0" "$s1"
  done
fi
'
