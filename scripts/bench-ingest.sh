#!/usr/bin/env bash
# HTTP ingest against Kafka-protocol produce on this machine, in one session, one broker.
# Prints numbers; asserts nothing.
#   1. native: spate-bench produce (librdkafka, acks=all, 256 B values, 6 partitions) for
#      SECONDS after a 3 s warm-up;
#   2. http:   k6 (deploy/k6/ingest.js, blocking, 100 x 256 B keyless records per request,
#      acks=all, VUS virtual users) for SECONDS.
# For each: records/s (records the topic gained / seconds), request or message latency p50 and
# p95, the broker's CPU per record (utime + stime from /proc/<pid>/stat, before and after) and
# the load generator's CPU per record (/usr/bin/time).
# Env: SECONDS_EACH (20), VUS (16), PRODUCERS (4), RECORDS (100 per request), KEYED (0; 1 gives every record a key), SPATE_BIN / BENCH (default: release
# builds, built if missing), K6 (default ~/.cache/spate-k6/bin/k6, built if missing),
# SPATE_ARGS (extra broker flags).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECS="${SECONDS_EACH:-20}"
VUS="${VUS:-16}"
PRODUCERS="${PRODUCERS:-4}"
RECORDS="${RECORDS:-100}"
if [[ -z "${SPATE_BIN:-}" || -z "${BENCH:-}" ]]; then
  if [[ ! -x "$ROOT/target/release/spate" || ! -x "$ROOT/target/release/spate-bench" ]]; then
    cargo build --release --workspace --manifest-path "$ROOT/Cargo.toml"
  fi
fi
SPATE_BIN="${SPATE_BIN:-$ROOT/target/release/spate}"
BENCH="${BENCH:-$ROOT/target/release/spate-bench}"
K6="${K6:-$HOME/.cache/spate-k6/bin/k6}"
if [[ ! -x "$K6" ]]; then
  mkdir -p "$(dirname "$K6")"
  GOBIN="$(dirname "$K6")" go install go.k6.io/k6@v1.8.1
fi
command -v /usr/bin/time >/dev/null || { echo "bench-ingest: needs /usr/bin/time (apt-get install time)" >&2; exit 2; }
TCK="$(getconf CLK_TCK)"

WORK="$(mktemp -d)"
PID=""
cleanup() { [[ -n "$PID" ]] && kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
# shellcheck disable=SC2086
"$SPATE_BIN" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir "$WORK/data" ${SPATE_ARGS:-} \
  >"$WORK/stdout" 2>"$WORK/spate.log" &
PID=$!
for _ in $(seq 1 300); do [[ -s "$WORK/stdout" ]] && break; sleep 0.1; done
KAFKA="$(awk 'NR==1{print $4}' "$WORK/stdout")"
HTTP="$(sed -n 's/.*http on \([^,]*\),.*/\1/p' "$WORK/stdout")"
[[ -n "$HTTP" ]] || { echo "spate did not start" >&2; cat "$WORK/spate.log" >&2; exit 1; }

ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
create() {
  curl -sf -XPOST "http://$HTTP/admin/topics" -H 'content-type: application/json' \
    -d "{\"name\":\"$1\",\"partitions\":6}" >/dev/null
}
count() {
  curl -sf "http://$HTTP/admin/topics/$1" |
    python3 -c 'import json,sys; print(sum(p["high_watermark"]-p["log_start_offset"] for p in json.load(sys.stdin)["partition_details"]))'
}
client_cpu() { awk '{printf "%.2f", $1 + $2}' "$1"; }  # /usr/bin/time -f '%U %S' output

echo "bench-ingest: spate pid $PID ($SPATE_BIN), $SECS s per run, $(nproc) cores"

# 1. Kafka protocol. Warm-up records are counted in the topic but not in the CPU window,
# so the window starts after the warm-up: spate-bench runs warm-up + SECS, CPU is sampled at
# the warm-up's end.
create native
"$BENCH" -b "$KAFKA" -t native -p 6 -c "$PRODUCERS" -s 256 -w 3s -d "${SECS}s" --acks all \
  --no-progress --json-output "$WORK/native.json" >/dev/null 2>"$WORK/native.err" &
BPID=$!
sleep 3
c0=$(ticks); n0=$(count native); t0=$(date +%s.%N)
wait "$BPID"
c1=$(ticks); n1=$(count native); t1=$(date +%s.%N)
read -r nat_p50 nat_p95 < <(python3 -c 'import json,sys; l=json.load(open(sys.argv[1]))["produce"]["latency_us"]; print("%.2f %.2f" % (l["p50_us"]/1000, l["p95_us"]/1000))' "$WORK/native.json")
# spate-bench's own CPU for the same run, for reference (from its report when present).
nat_records=$((n1 - n0))
nat_rate=$(python3 -c "print('%.0f' % ($nat_records / ($t1 - $t0)))")
nat_cpu=$(python3 -c "print('%.2f' % (($c1 - $c0) / $TCK * 1e6 / max($nat_records, 1)))")

# 2. HTTP ingest. Keyless by default, as spate-bench's records are: each request's records are
# one batch of one partition, as a Kafka producer's batch is (KEYED=1 spreads them by key).
create http
c0=$(ticks); n0=$(count http); t0=$(date +%s.%N)
BASE_URL="http://$HTTP" TOPIC=http MODE=blocking RECORDS="$RECORDS" SIZE=256 KEYED="${KEYED:-0}" SCENARIO=steady VUS="$VUS" \
  DURATION="${SECS}s" /usr/bin/time -f '%U %S' -o "$WORK/k6.time" \
  "$K6" run --quiet --summary-export "$WORK/k6.json" "$ROOT/deploy/k6/ingest.js" >"$WORK/k6.out" 2>&1 || true
c1=$(ticks); n1=$(count http); t1=$(date +%s.%N)
http_records=$((n1 - n0))
read -r http_p50 http_p95 told < <(python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["metrics"]; d=m["http_req_duration"]; print("%.2f %.2f %d" % (d["med"], d["p(95)"], m.get("ingest_delivered_records",{}).get("count",0)))' "$WORK/k6.json")
http_rate=$(python3 -c "print('%.0f' % ($http_records / ($t1 - $t0)))")
http_cpu=$(python3 -c "print('%.2f' % (($c1 - $c0) / $TCK * 1e6 / max($http_records, 1)))")
k6_cpu=$(python3 -c "print('%.2f' % ($(client_cpu "$WORK/k6.time") * 1e6 / max($http_records, 1)))")

printf '\n%-34s %12s %9s %9s %22s %22s\n' "run" "records/s" "p50 ms" "p95 ms" "broker CPU us/record" "client CPU us/record"
printf '%-34s %12s %9s %9s %22s %22s\n' "native (spate-bench, $PRODUCERS producers)" "$nat_rate" "$nat_p50" "$nat_p95" "$nat_cpu" "-"
printf '%-34s %12s %9s %9s %22s %22s\n' "http (k6, $VUS VUs, $RECORDS x 256 B)" "$http_rate" "$http_p50" "$http_p95" "$http_cpu" "$k6_cpu (k6)"
echo
echo "native latency is per message (send to acknowledgement), http per request of $RECORDS records"
echo "k6 was told $told records delivered; the topic gained $http_records"
python3 -c "print('broker CPU per record, http / native: %.2fx' % ($http_cpu / max($nat_cpu, 1e-9)))"
