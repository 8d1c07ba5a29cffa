#!/usr/bin/env bash
# HTTP ingest against Kafka-protocol produce on this machine, in one session, one broker.
# Prints numbers; asserts nothing. Each run gets its own topic (6 partitions), SECONDS long:
#   1. native:       spate-bench produce (librdkafka, acks=all, 256 B values, PRODUCERS
#                    producers) as fast as it goes, after a 3 s warm-up;
#   2. http k6:      k6 (deploy/k6/ingest.js, blocking, RECORDS x 256 B keyless records per
#                    request, acks=all, VUS virtual users);
#   3. native @ k6:  run 1 again, limited to the rate run 2 reached: the broker's CPU per
#                    record depends on its load, so this is the like-for-like native figure;
#   4. native @ k6, RECORDS per request: run 3 with librdkafka held to about RECORDS records
#                    per request (batch.num.messages, linger.ms=2), the HTTP runs' request
#                    size; librdkafka's own batching sends several times more per request;
#   5. http wrk:     the same request body over and over from wrk (WRK_CONNS connections), a
#                    client that needs a tenth of k6's CPU, so the broker is not starved of
#                    the cores k6 takes.
# For each: records/s (records the topic gained / seconds), request or message latency p50 and
# p95, the broker's CPU per record (utime + stime from /proc/<pid>/stat, before and after) and
# the load generator's CPU per record (/usr/bin/time).
# Env: SECONDS_EACH (20), VUS (16), WRK_CONNS (4), PRODUCERS (4), RECORDS (100 per request), KEYED (0; 1 gives every record a key), SPATE_BIN / BENCH (default: release
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
K6="$("$ROOT/scripts/k6.sh")"
for tool in time wrk; do
  if ! dpkg -s "$tool" >/dev/null 2>&1; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
      apt-get install -y "$tool" >/dev/null
    else
      echo "bench-ingest: needs $tool (apt-get install -y $tool)" >&2
      exit 2
    fi
  fi
done
TCK="$(getconf CLK_TCK)"

# Everything below runs against a throw-away broker that scripts/with-spate.sh starts (this
# script again, inside it) and stops.
source "$ROOT/scripts/inside-spate.sh"
PID="$SPATE_PID"
KAFKA="$SPATE_BOOTSTRAP"
HTTP="$SPATE_HTTP"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
create() {
  curl -sf -XPOST "http://$HTTP/admin/topics" -H 'content-type: application/json' \
    -d "{\"name\":\"$1\",\"partitions\":6}" >/dev/null
}
count() { "$ROOT/scripts/topic-records.sh" "$HTTP" "$1"; }
client_cpu() { awk '{printf "%.2f", $1 + $2}' "$1"; }  # /usr/bin/time -f '%U %S' output

echo "bench-ingest: spate pid $PID ($SPATE_BIN), $SECS s per run, $(nproc) cores"
# The first run too starts without another process's dirty pages being written back.
"$ROOT/scripts/drop-page-cache.sh"

# Each run starts from the same memory state: the previous run's topic deleted, its dirty
# pages written back and the page cache dropped (when allowed). A run that follows a
# multi-GiB one otherwise pays for the kernel's writeback and reclaim of the earlier data.
reset() {
  curl -sf -XDELETE "http://$HTTP/admin/topics/$1" >/dev/null || true
  sleep 1
  "$ROOT/scripts/drop-page-cache.sh"
}

# Broker CPU us per record between two tick readings.
per_record() { python3 -c "print('%.2f' % (($2 - $1) / $TCK * 1e6 / max($3, 1)))"; }
rate() { python3 -c "print('%.0f' % ($1 / ($3 - $2)))"; }

# Kafka protocol. Warm-up records are counted in the topic but not in the CPU window, so the
# window starts after the warm-up: spate-bench runs warm-up + SECS, CPU is sampled at the
# warm-up's end. Sets nat_rate nat_p50 nat_p95 nat_cpu nat_per_request. $1: topic, $2: rate
# limit (0: none), the rest: extra spate-bench flags.
produce_requests() {
  curl -s "http://$HTTP/metrics" | awk '/^spate_requests_total\{.*api="Produce"/ { s += $NF } END { printf "%.0f", s }'
}
native() {
  local topic=$1 limit=() c0 n0 t0 r0 c1 n1 t1 r1 records
  [[ "$2" != 0 ]] && limit=(--rate-limit "$2")
  shift 2
  create "$topic"
  "$BENCH" -b "$KAFKA" -t "$topic" -p 6 -c "$PRODUCERS" -s 256 -w 3s -d "${SECS}s" --acks all \
    "${limit[@]}" "$@" --no-progress --json-output "$WORK/$topic.json" >/dev/null 2>"$WORK/$topic.err" &
  local bpid=$!
  sleep 3
  c0=$(ticks); n0=$(count "$topic"); t0=$(date +%s.%N); r0=$(produce_requests)
  wait "$bpid"
  c1=$(ticks); n1=$(count "$topic"); t1=$(date +%s.%N); r1=$(produce_requests)
  read -r nat_p50 nat_p95 < <(python3 -c 'import json,sys; l=json.load(open(sys.argv[1]))["produce"]["latency_us"]; print("%.2f %.2f" % (l["p50_us"]/1000, l["p95_us"]/1000))' "$WORK/$topic.json")
  records=$((n1 - n0))
  nat_rate=$(rate "$records" "$t0" "$t1")
  nat_cpu=$(per_record "$c0" "$c1" "$records")
  nat_per_request=$((records / ((r1 - r0) > 0 ? r1 - r0 : 1)))
}

native native 0
reset native
row_native=("native (spate-bench, $PRODUCERS producers, ~$nat_per_request rec/req)" "$nat_rate" "$nat_p50" "$nat_p95" "$nat_cpu" "-")
native_cpu=$nat_cpu

# HTTP ingest with k6. Keyless by default, as spate-bench's records are: each request's
# records are one batch of one partition, as a Kafka producer's batch is (KEYED=1 spreads
# them by key).
create http
c0=$(ticks); n0=$(count http); t0=$(date +%s.%N)
BASE_URL="http://$HTTP" TOPIC=http MODE=blocking RECORDS="$RECORDS" SIZE=256 KEYED="${KEYED:-0}" SCENARIO=steady VUS="$VUS" \
  DURATION="${SECS}s" /usr/bin/time -f '%U %S' -o "$WORK/k6.time" \
  "$K6" run --quiet --summary-export "$WORK/k6.json" "$ROOT/deploy/k6/ingest.js" >"$WORK/k6.out" 2>&1 || true
c1=$(ticks); n1=$(count http); t1=$(date +%s.%N)
http_records=$((n1 - n0))
read -r http_p50 http_p95 told < <(python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["metrics"]; d=m["http_req_duration"]; print("%.2f %.2f %d" % (d["med"], d["p(95)"], m.get("ingest_delivered_records",{}).get("count",0)))' "$WORK/k6.json")
http_rate=$(rate "$http_records" "$t0" "$t1")
http_cpu=$(per_record "$c0" "$c1" "$http_records")
k6_cpu=$(python3 -c "print('%.2f' % ($(client_cpu "$WORK/k6.time") * 1e6 / max($http_records, 1)))")
reset http
row_k6=("http (k6, $VUS VUs, $RECORDS x 256 B)" "$http_rate" "$http_p50" "$http_p95" "$http_cpu" "$k6_cpu (k6)")

native native_at_k6 "$http_rate"
row_matched=("native at the k6 rate, ~$nat_per_request rec/req" "$nat_rate" "$nat_p50" "$nat_p95" "$nat_cpu" "-")
matched_cpu=$nat_cpu
reset native_at_k6

native native_small "$http_rate" -X "batch.num.messages=$RECORDS" -X linger.ms=2
row_small=("native at the k6 rate, ~$nat_per_request rec/req" "$nat_rate" "$nat_p50" "$nat_p95" "$nat_cpu" "-")
small_cpu=$nat_cpu
reset native_small

# HTTP ingest with wrk: one body of RECORDS x 256 B keyless records, distinct values.
"$ROOT/scripts/wrk-ingest-body.sh" "$WORK" "$RECORDS"
create wrk
c0=$(ticks); n0=$(count wrk); t0=$(date +%s.%N)
/usr/bin/time -f '%U %S' -o "$WORK/wrk.time" wrk -t1 -c"${WRK_CONNS:-4}" -d"${SECS}s" --latency \
  -s "$WORK/post.lua" "http://$HTTP/topics/wrk?acks=all" >"$WORK/wrk.out"
c1=$(ticks); n1=$(count wrk); t1=$(date +%s.%N)
wrk_records=$((n1 - n0))
wrk_rate=$(rate "$wrk_records" "$t0" "$t1")
wrk_cpu=$(per_record "$c0" "$c1" "$wrk_records")
wrk_client=$(python3 -c "print('%.2f' % ($(client_cpu "$WORK/wrk.time") * 1e6 / max($wrk_records, 1)))")
read -r wrk_p50 wrk_p95 < <(python3 - "$WORK/wrk.out" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
def ms(p):
    m = re.search(r"^\s+%s%%\s+([\d.]+)(us|ms|s)\s*$" % p, text, re.M)
    if not m:
        return "-"
    v, u = float(m.group(1)), m.group(2)
    return "%.2f" % (v / 1000 if u == "us" else v * 1000 if u == "s" else v)
print(ms(50), ms(90))
PY
)
bad=$(sed -n 's/.*Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p' "$WORK/wrk.out")
row_wrk=("http (wrk, ${WRK_CONNS:-4} connections)" "$wrk_rate" "$wrk_p50" "${wrk_p95} (p90)" "$wrk_cpu" "$wrk_client (wrk)")

printf '\n%-48s %12s %9s %12s %22s %22s\n' "run" "records/s" "p50 ms" "p95 ms" "broker CPU us/record" "client CPU us/record"
for r in row_native row_k6 row_matched row_small row_wrk; do
  declare -n row=$r
  printf '%-48s %12s %9s %12s %22s %22s\n' "${row[@]}"
done
echo
echo "native latency is per message (send to acknowledgement), http per request of $RECORDS records"
echo "k6 was told $told records delivered; the topic gained $http_records; wrk saw ${bad:-0} answers other than 2xx"
python3 -c "
k6, wrk, nat, matched, small = $http_cpu, $wrk_cpu, $native_cpu, $matched_cpu, $small_cpu
print('broker CPU per record, http (k6) / native:                                %.2fx' % (k6 / max(nat, 1e-9)))
print('broker CPU per record, http (k6) / native at its rate:                    %.2fx' % (k6 / max(matched, 1e-9)))
print('broker CPU per record, http (k6) / native at its rate and request size:   %.2fx' % (k6 / max(small, 1e-9)))
print('broker CPU per record, http (wrk) / native:                               %.2fx' % (wrk / max(nat, 1e-9)))"
