#!/usr/bin/env bash
# The regression guard of issue 28: a short run (about two minutes after the build) of the
# three performance benchmarks at small sizes, printing the ratios the bars are written in, so
# a change can be compared before and after. The full-size runs are bench-floor.sh,
# bench-latency.sh and bench-scale.sh; this script only calls them with small parameters.
#   scripts/bench-quick.sh
# Env: KAFKA (1; 0 skips Kafka's latency point), OUT (target/bench-quick/<date>),
# SPATE_BIN / FLOOR_BIN / BENCH_BIN (default: built here with --release).
# Numbers of the last run are kept in docs/benchmarks.md ("Regression guard").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/target/bench-quick/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
if [[ -z "${SPATE_BIN:-}${FLOOR_BIN:-}${BENCH_BIN:-}" ]]; then
  cargo build --release -q -p spate-server -p spate-floor -p spate-bench --manifest-path "$ROOT/Cargo.toml"
fi
export SPATE_BIN="${SPATE_BIN:-$ROOT/target/release/spate}"
export FLOOR_BIN="${FLOOR_BIN:-$ROOT/target/release/spate-floor}"
export BENCH_BIN="${BENCH_BIN:-$ROOT/target/release/spate-bench}"
started=$SECONDS

echo "== floor (1 round of 2,000,000 x 256 B)"
OUT="$OUT/floor" ROUNDS=1 RECORDS=2000000 "$ROOT/scripts/bench-floor.sh" > "$OUT/floor.txt" 2>&1 \
  || { tail -20 "$OUT/floor.txt" >&2; exit 1; }
grep -E "^(produce|consume):" "$OUT/floor.txt"

echo "== tail latency (standalone, 256 B, acks=1, 50 % of saturation)"
OUT="$OUT/latency" SHAPES=standalone SIZES=256 ACKS=1 PCTS=50 DURATION=6 WARMUP=2 \
  SAT_DURATION=5 KAFKA="${KAFKA:-1}" "$ROOT/scripts/bench-latency.sh" > "$OUT/latency.txt" 2>&1 \
  || { tail -20 "$OUT/latency.txt" >&2; exit 1; }
grep -E "^standalone" "$OUT/latency.txt"

echo "== scale (1,000 partitions, 1,000 connections)"
OUT="$OUT/scale" PARTITIONS=1000 PER_TOPIC=100 CONNECTIONS=1000 PRODUCE_SECONDS=5 \
  "$ROOT/scripts/bench-scale.sh" > "$OUT/scale.txt" 2>&1 \
  || { tail -20 "$OUT/scale.txt" >&2; exit 1; }
grep -E "^(rss_per|startup_after|stop_|produce_many)" "$OUT/scale.txt"

python3 - "$OUT" $(( SECONDS - started )) <<'PYEOF' | tee "$OUT/summary.txt"
import json, re, sys
out, secs = sys.argv[1], sys.argv[2]
floor = open(f"{out}/floor.txt").read()
def ratio(name):
    m = re.search(rf"^{name}: .* per byte = ([0-9.]+)", floor, re.M)
    return m.group(1) if m else "-"
lat = [l.split("|") for l in open(f"{out}/latency.txt") if l.startswith("standalone") and " 50 " in l]
scale = {}
for l in open(f"{out}/scale.txt"):
    if l.startswith("summary "):
        scale = json.loads(l[len("summary "):])
print(f"bench-quick ({secs} s)")
print(f"| produce CPU/byte spate/floor | {ratio('produce')} | bar <= 1.5 |")
print(f"| consume CPU/byte spate/sendfile | {ratio('consume')} | bar <= 1.5 |")
if lat:
    row = lat[0]
    # Columns of bench-latency's summary: spate | client CPU | in spate | Kafka | client CPU | ratio.
    print(f"| 256 B acks=1 at 50 %: spate p50/p99/p99.9/max ms | {row[1].strip()} | bar p99 <= 1, p99.9 <= 5 |")
    print(f"| same rate, inside spate p50/p99 ms (client CPU {row[2].strip()} cores) | {row[3].strip()} | |")
    print(f"| same rate, Kafka | {row[4].strip()} | |")
    print(f"| p99 spate / Kafka | {row[6].strip()} | bar <= 0.2 |")
for k, bar in (("rss_per_idle_partition_kib", "<= 50 KiB"), ("rss_per_idle_connection_kib", "<= 20 KiB"),
               ("startup_after_clean_seconds", "1,000 partitions"), ("stop_busy_partitions_seconds", "1,000 partitions"),
               ("produce_many_over_few", "1,000 over 10 partitions, bar >= 0.70")):
    print(f"| {k} | {scale.get(k, '-')} | {bar} |")
PYEOF
echo "results in $OUT"
