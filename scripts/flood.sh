#!/usr/bin/env bash
# Flood test (not part of the quick test run): many more producers than the broker can absorb,
# under the smallest produce profile, for a bounded time. Checks that RSS stays within the
# memory limit plus a constant, that producers see throttling rather than errors, and that no
# acknowledged record is lost (spate-bench --validate reads everything back). Writes a CSV of
# RSS and throughput over time and a plot (docs/flood.png when matplotlib is available).
#   scripts/flood.sh [SECONDS] [PRODUCERS]        default 60 s, 16 producers
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECS="${1:-60}"; PRODUCERS="${2:-16}"
OUT="${OUT:-$ROOT/target/flood}"; mkdir -p "$OUT"
PROFILE=low-latency; LIMIT=$((16 << 20))
# What a broker holds beyond the request budget: runtime, buffers, indexes, page tables.
CONSTANT=$((64 << 20))
cargo build --release --bin spate --bin spate-bench --manifest-path "$ROOT/Cargo.toml" >&2
DIR="$(mktemp -d)"
"$ROOT/target/release/spate" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir "$DIR/data" \
  --produce-profile "$PROFILE" > "$DIR/stdout" 2> "$DIR/spate.log" &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 1 100); do [[ -s "$DIR/stdout" ]] && break; sleep 0.1; done
B=$(awk 'NR==1{print $4}' "$DIR/stdout"); H=$(sed -n 's/.*http on \([^,]*\),.*/\1/p' "$DIR/stdout")
echo "spate pid $PID at $B (http $H), profile $PROFILE, limit $LIMIT bytes"
metric() { curl -s "http://$H/metrics" | awk -v m="$1" '$1==m {print $2}'; }
echo "t_s,rss_bytes,memory_in_use_bytes,records_in_total,throttled_requests_total" > "$OUT/flood.csv"
( t0=$(date +%s.%N)
  while kill -0 $PID 2>/dev/null; do
    rss=$(( $(awk '/^VmRSS/{print $2}' /proc/$PID/status) * 1024 ))
    body=$(curl -s "http://$H/metrics")
    inuse=$(echo "$body" | awk '$1=="spate_memory_in_use_bytes"{print $2}')
    recs=$(echo "$body" | awk '$1=="spate_topic_records_in_total{topic=\"flood\"}"{print $2}')
    thr=$(echo "$body" | awk '$1=="spate_throttled_requests_total"{print $2}')
    echo "$(echo "$(date +%s.%N) - $t0" | bc),$rss,${inuse:-0},${recs:-0},${thr:-0}" >> "$OUT/flood.csv"
    sleep 0.5
  done ) &
SAMPLER=$!
set +e
"$ROOT/target/release/spate-bench" -b "$B" -t flood --create-topic -p 4 -c "$PRODUCERS" -s 1024 \
  -d "${SECS}s" --acks all --linger-ms 5 --batch-size 1000000 --validate --no-progress \
  --json-output "$OUT/flood.json" | tee "$OUT/flood.txt"
rc=$?
set -e
kill $SAMPLER 2>/dev/null || true
peak=$(awk -F, 'NR>1 && $2>m {m=$2} END{print m+0}' "$OUT/flood.csv")
throttled=$(awk -F, 'NR>1 {t=$5} END{print t+0}' "$OUT/flood.csv")
echo "peak RSS $((peak >> 20)) MiB (limit $((LIMIT >> 20)) MiB + constant $((CONSTANT >> 20)) MiB); throttled requests $throttled; spate-bench exit $rc"
python3 - "$OUT/flood.csv" "$ROOT/docs/flood.png" <<'PY' || echo "(no plot: matplotlib missing; pip install matplotlib)"
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = list(csv.DictReader(open(sys.argv[1])))
t = [float(r["t_s"]) for r in rows]
rss = [int(r["rss_bytes"]) / 2**20 for r in rows]
inuse = [float(r["memory_in_use_bytes"]) / 2**20 for r in rows]
recs = [float(r["records_in_total"]) for r in rows]
rate = [0] + [(recs[i] - recs[i - 1]) / max(t[i] - t[i - 1], 1e-3) for i in range(1, len(t))]
fig, ax = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
ax[0].plot(t, rss, label="broker RSS (MiB)"); ax[0].plot(t, inuse, label="in-flight budget used (MiB)")
ax[0].axhline(16, color="red", linestyle="--", label="budget limit (16 MiB)"); ax[0].legend(); ax[0].set_ylabel("MiB")
ax[1].plot(t, rate, color="green"); ax[1].set_ylabel("records/s appended"); ax[1].set_xlabel("seconds")
fig.suptitle("spate flood test: low-latency profile")
fig.tight_layout(); fig.savefig(sys.argv[2], dpi=90)
print("plot:", sys.argv[2])
PY
[[ $rc -eq 0 ]] || { echo "FAIL: spate-bench reported errors or validation failures"; exit 1; }
(( peak <= LIMIT + CONSTANT )) || { echo "FAIL: RSS peak above limit + constant"; exit 1; }
(( $(printf '%.0f' "$throttled") > 0 )) || echo "note: the broker never had to throttle (producers did not outrun it)"
echo "flood test passed"
