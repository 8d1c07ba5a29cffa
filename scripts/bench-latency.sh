#!/usr/bin/env bash
# Tail latency at fixed rates (issue 28): spate-bench (librdkafka, linger.ms=0) at 10 %, 50 %
# and 80 % of spate's measured saturated rate, against spate and then against Apache Kafka at
# the same absolute rates, for each record size and acks setting; standalone (RF 1) and a
# 3-node cluster (RF 3). Prints p50/p99/p99.9/max of enqueue-to-ack and the ratio of spate's
# p99 to Kafka's at each rate, with the client's CPU (cores) and spate's own Produce time
# from its /metrics, which tell the broker's part of the latency from the client's.
#   scripts/bench-latency.sh
# Env: SHAPES ("standalone cluster"), SIZES ("256 4096"), ACKS ("1 all"), PCTS ("10 50 80"),
# FSYNC (interval), PRODUCERS (4), PARTITIONS (3), DURATION (10 s), WARMUP (3 s),
# SAT_DURATION (8 s), KAFKA (1; 0 skips Kafka), OUT (target/bench-latency/<date>),
# SPATE_BIN (default: built here with --release), PIN (0; 1 runs every broker process on CPU 0
# and spate-bench on CPU 1, so the client cannot take the broker's core: on two cores the
# client needs more than one of them at 256 B, and an unpinned run measures CPU contention).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
SHAPES="${SHAPES:-standalone cluster}" SIZES="${SIZES:-256 4096}" ACKS_LIST="${ACKS:-1 all}"
PCTS="${PCTS:-10 50 80}" FSYNC="${FSYNC:-interval}" PRODUCERS="${PRODUCERS:-4}"
PARTITIONS="${PARTITIONS:-3}" DURATION="${DURATION:-10}" WARMUP="${WARMUP:-3}"
SAT_DURATION="${SAT_DURATION:-8}" WITH_KAFKA="${KAFKA:-1}" PIN="${PIN:-0}"
OUT="${OUT:-$ROOT/target/bench-latency/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
if [[ -z "${SPATE_BIN:-}" ]]; then
  cargo build --release -q -p spate-server -p spate-bench --manifest-path "$ROOT/Cargo.toml"
  SPATE_BIN="$ROOT/target/release/spate"
fi
export SPATE_BIN
BENCH="${BENCH_BIN:-$ROOT/target/release/spate-bench}"
[[ "$WITH_KAFKA" == 1 ]] && "$KAFKA_KIT/fetch.sh" >/dev/null
RATES="$OUT/rates.txt"    # shape size acks pct rate: spate's saturated rate and the points
POINTS="$OUT/points.txt"  # broker shape size acks pct rate achieved p50 p99 p99.9 max (ms)
: > "$RATES"; : > "$POINTS"

# point BROKER SHAPE BOOTSTRAP RF SIZE ACKS PCT RATE: one spate-bench run, a line in POINTS.
point() {
  local broker="$1" shape="$2" bootstrap="$3" rf="$4" size="$5" acks="$6" pct="$7" rate="$8"
  local name="$broker-$shape-$size-$acks-$pct" limit=() secs="$DURATION"
  [[ "$rate" -gt 0 ]] && limit=(--rate-limit "$rate")
  [[ "$pct" == sat ]] && secs="$SAT_DURATION"
  local client=()
  [[ "$PIN" == 1 ]] && client=(taskset -c 1)
  # spate's own view: its Produce time from arrival to response ready, from /metrics before
  # and after (every node of a cluster); Kafka's needs JMX and is left out.
  local http=""
  [[ "$broker" == spate ]] && http="${SPATE_HTTP_ALL:-${SPATE_HTTP:-}}"
  scrape "$http" > "$OUT/$name.metrics-before"
  # The client's CPU (user + system over wall time): a client that needs its whole core queues
  # records itself, and that queueing is in the latency it reports.
  /usr/bin/time -f "%e %U %S" -o "$OUT/$name.time" \
    "${client[@]}" "$BENCH" -b "$bootstrap" -t "lat-$size-$acks-$pct" --create-topic -p "$PARTITIONS" -r "$rf" \
    -c "$PRODUCERS" -s "$size" --acks "$acks" --linger-ms 0 -d "$secs" -w "$WARMUP" \
    "${limit[@]}" --no-progress --json-output "$OUT/$name.json" > "$OUT/$name.txt" 2>&1 \
    || { echo "spate-bench failed for $name:" >&2; tail -5 "$OUT/$name.txt" >&2; return 0; }
  scrape "$http" > "$OUT/$name.metrics-after"
  python3 - "$OUT/$name" "$broker $shape $size $acks $pct $rate" <<'PYEOF' | tee -a "$POINTS"
import json, re, sys
base = sys.argv[1]
p = json.load(open(base + ".json"))["produce"]
lat = p.get("latency_us") or {}
ms = lambda k: lat.get(k + "_us", float("nan")) / 1000
wall, user, system = (float(x) for x in open(base + ".time").read().split()[-3:])
client = f"{(user + system) / wall:.2f}" if wall > 0 else "-"

def buckets(path):
    out = {}
    for line in open(path):
        m = re.match(r'spate_request_duration_seconds_bucket\{le="([^"]+)",api="Produce"\} (\S+)', line)
        if m:
            le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
            out[le] = out.get(le, 0) + float(m.group(2))
    return out

before, after = buckets(base + ".metrics-before"), buckets(base + ".metrics-after")
delta = sorted((le, after[le] - before.get(le, 0)) for le in after)
total = delta[-1][1] if delta else 0

def upper(q):
    # The bucket bound under which a fraction q of the requests finished (an upper bound).
    for le, n in delta:
        if total and n >= q * total:
            return "inf" if le == float("inf") else f"{le * 1000:.2f}"
    return "-"

print(sys.argv[2], f"{p['msgs_per_sec']:.0f}", *(f"{ms(k):.2f}" for k in ("p50", "p99", "p999", "max")),
      client, upper(0.5), upper(0.99))
PYEOF
}

# scrape ADDRS: the Produce duration buckets of every comma-separated /metrics address.
scrape() {
  local addr
  IFS=, read -ra addrs <<< "$1"
  for addr in "${addrs[@]}"; do
    curl -s --max-time 5 "http://$addr/metrics" | grep '^spate_request_duration_seconds_bucket{.*api="Produce"' || true
  done
}

# series BROKER SHAPE BOOTSTRAP RF: spate measures its saturated rate per size and acks
# first; every broker then runs the fixed-rate points.
series() {
  local broker="$1" shape="$2" bootstrap="$3" rf="$4" size acks pct sat
  for size in $SIZES; do
    for acks in $ACKS_LIST; do
      if [[ "$broker" == spate ]]; then
        point spate "$shape" "$bootstrap" "$rf" "$size" "$acks" sat 0
        sat="$(awk -v s="$shape" -v z="$size" -v a="$acks" '$1 == "spate" && $2 == s && $3 == z && $4 == a && $5 == "sat" { print $7 }' "$POINTS")"
        for pct in $PCTS; do echo "$shape $size $acks $pct $(( ${sat:-0} * pct / 100 ))" >> "$RATES"; done
      fi
      for pct in $PCTS; do
        local rate
        rate="$(awk -v s="$shape" -v z="$size" -v a="$acks" -v p="$pct" '$1 == s && $2 == z && $3 == a && $4 == p { print $5 }' "$RATES")"
        [[ "${rate:-0}" -gt 0 ]] && point "$broker" "$shape" "$bootstrap" "$rf" "$size" "$acks" "$pct" "$rate"
      done
    done
  done
}
export -f point series scrape
export BENCH OUT POINTS RATES SIZES ACKS_LIST PCTS PRODUCERS PARTITIONS DURATION WARMUP SAT_DURATION PIN

# pin PID...: every thread of each process on CPU 0 (threads started later inherit it).
pin() {
  [[ "$PIN" == 1 ]] || return 0
  local p
  for p in "$@"; do taskset -a -p -c 0 "$p" > /dev/null; done
}
export -f pin

for shape in $SHAPES; do
  echo "== spate $shape (fsync $FSYNC)"
  if [[ "$shape" == standalone ]]; then
    "$ROOT/scripts/with-spate.sh" --spate-arg --fsync --spate-arg "$FSYNC" -- \
      bash -c 'pin "$SPATE_PID" && series spate standalone "$SPATE_BOOTSTRAP" 1'
  else
    "$ROOT/scripts/with-spate-cluster.sh" --spate-arg --fsync --spate-arg "$FSYNC" -- \
      bash -c 'pin $(echo "$SPATE_NODE_PIDS" | sed "s/[0-9]*=//g") && series spate cluster "$SPATE_BOOTSTRAP" 3'
  fi
  [[ "$WITH_KAFKA" == 1 ]] || continue
  echo "== kafka $shape"
  KDIR="$(mktemp -d /tmp/kafka-latency.XXXX)"
  if [[ "$shape" == standalone ]]; then
    KAFKA_PORT=19092 KAFKA_DATA_DIR="$KDIR" KAFKA_FRESH=1 "$KAFKA_KIT/start.sh" > "$OUT/kafka-start.log"
    pin $(pgrep -f -- "$KDIR" || true)
    series kafka standalone 127.0.0.1:19092 1 || true
    KAFKA_PORT=19092 KAFKA_DATA_DIR="$KDIR" "$KAFKA_KIT/stop.sh" >/dev/null 2>&1 || true
  else
    KAFKA_CLUSTER_DIR="$KDIR" KAFKA_FRESH=1 "$KAFKA_KIT/start-cluster.sh" > "$OUT/kafka-start.log"
    pin $(pgrep -f -- "$KDIR" || true)
    series kafka cluster 127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094 3 || true
    KAFKA_CLUSTER_DIR="$KDIR" "$KAFKA_KIT/stop-cluster.sh" >/dev/null 2>&1 || true
  fi
  rm -rf "$KDIR"
done

python3 - "$POINTS" <<'PYEOF' | tee "$OUT/summary.txt"
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
by = {(r[0], r[1], r[2], r[3], r[4]): r for r in rows}
# "client" is spate-bench's CPU in cores (on two cores, near 1.0 means the client queues);
# "in spate" is spate's own Produce time, arrival to response ready, as p50/p99 upper bounds
# of its /metrics histogram buckets.
print(f"{'shape':10} {'size':>5} {'acks':>4} {'pct':>4} {'rate':>9} | {'spate p50/p99/p99.9/max ms':>30} | {'client':>6} | {'in spate p50/p99':>16} | {'kafka p50/p99/p99.9/max ms':>30} | {'client':>6} | p99 spate/kafka")
extra = lambda r: (r[11] if len(r) > 11 else "-", "/".join(r[12:14]) if len(r) > 13 else "-")
for r in rows:
    broker, shape, size, acks, pct = r[:5]
    if broker != "spate":
        continue
    s = "/".join(r[7:11])
    cpu, inside = extra(r)
    if pct == "sat":
        print(f"{shape:10} {size:>5} {acks:>4} {'sat':>4} {r[6]:>9} | {s:>30} | {cpu:>6} | {inside:>16} | (saturated: spate's capacity)")
        continue
    k = by.get(("kafka", shape, size, acks, pct))
    ks = "/".join(k[7:11]) if k else "-"
    kcpu = extra(k)[0] if k else "-"
    ratio = f"{float(r[8]) / float(k[8]):.2f}" if k and float(k[8]) > 0 else "-"
    print(f"{shape:10} {size:>5} {acks:>4} {pct:>4} {r[5]:>9} | {s:>30} | {cpu:>6} | {inside:>16} | {ks:>30} | {kcpu:>6} | {ratio}")
PYEOF
echo "results in $OUT"
