#!/usr/bin/env bash
# Runs the k6 ingest suite (deploy/k6/ingest.js) against a throw-away local spate, then counts
# the records in the topic and compares that with what k6 was told was delivered (blocking) or
# accepted (fire-and-forget, after the queue drained). Exits 1 when they differ.
#
#   scripts/k6-ingest.sh [SCENARIO] [MODE] [RECORDS] [SIZE]     # default: smoke blocking 10 1024
#   scripts/k6-ingest.sh suite                                  # every mode x records x size, smoke length
#   SCENARIO=standard scripts/k6-ingest.sh standard fire 100 256
#
# k6 is built once from the Go module proxy by scripts/k6.sh into ~/.cache/spate-k6/bin (K6
# overrides the binary). SPATE_BIN picks the broker (default: the
# release build if there is one, else the debug build). PARTITIONS (6), SPATE_ARGS (extra
# broker flags) and K6_ARGS (extra k6 flags) tune the run; VUS, DURATION, MAX_VUS, ACKS pass
# through to the script.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

spate_bin() {
  if [[ -n "${SPATE_BIN:-}" ]]; then echo "$SPATE_BIN"; return; fi
  if [[ -x "$ROOT/target/release/spate" ]]; then echo "$ROOT/target/release/spate"; return; fi
  [[ -x "$ROOT/target/debug/spate" ]] || (cd "$ROOT" && cargo build --bin spate >&2)
  echo "$ROOT/target/debug/spate"
}

if [[ "${1:-}" == "suite" ]]; then
  fails=0
  for mode in blocking fire; do
    for records in 10 100; do
      for size in 1024 256; do
        "$0" "${SCENARIO:-smoke}" "$mode" "$records" "$size" || fails=$((fails + 1))
      done
    done
  done
  echo "k6-ingest suite: $fails failed run(s)"
  exit $(( fails > 0 ))
fi

SCEN="${1:-${SCENARIO:-smoke}}"
MODE="${2:-${MODE:-blocking}}"
RECORDS="${3:-${RECORDS:-10}}"
SIZE="${4:-${SIZE:-1024}}"
PARTITIONS="${PARTITIONS:-6}"
K6="$("$ROOT/scripts/k6.sh")"
BIN="$(spate_bin)"
TOPIC="k6-$MODE-$RECORDS-$SIZE"

# Everything below runs against a throw-away broker that scripts/with-spate.sh starts (this
# script again, inside it) and stops.
SPATE_BIN="$BIN"
source "$ROOT/scripts/inside-spate.sh"
PID="$SPATE_PID"
HTTP="$SPATE_HTTP"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
curl -sf -X POST "http://$HTTP/admin/topics" -H 'content-type: application/json' \
  -d "{\"name\": \"$TOPIC\", \"partitions\": $PARTITIONS}" >/dev/null

echo "k6-ingest: $SCEN $MODE, $RECORDS records x $SIZE B per request, spate pid $PID at $HTTP"
rc=0
# shellcheck disable=SC2086
BASE_URL="http://$HTTP" TOPIC="$TOPIC" MODE="$MODE" RECORDS="$RECORDS" SIZE="$SIZE" SCENARIO="$SCEN" \
  "$K6" run --quiet --summary-export "$WORK/summary.json" ${K6_ARGS:-} "$ROOT/deploy/k6/ingest.js" || rc=$?

metric() {  # the count of a k6 counter in the summary, 0 when absent
  python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["metrics"]; print(int(m.get(sys.argv[2],{}).get("count",0)))' \
    "$WORK/summary.json" "$1"
}
topic_count() { "$ROOT/scripts/topic-records.sh" "$HTTP" "$TOPIC"; }
if [[ "$MODE" == "fire" ]]; then
  told="$(metric ingest_accepted_records)"
  for _ in $(seq 1 600); do  # at most 60 s for the queue to drain
    q="$(curl -sf "http://$HTTP/produce/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["queue"]["records"])')"
    [[ "$q" == "0" ]] && break; sleep 0.1
  done
  failed="$(curl -sf "http://$HTTP/produce/stats" | python3 -c "import json,sys; print(json.load(sys.stdin)['topics'].get('$TOPIC',{}).get('failed',0))")"
else
  told="$(metric ingest_delivered_records)"
  failed="$(metric ingest_failed_records)"
fi
have="$(topic_count)"
busy="$(metric ingest_busy_answers)"
echo "k6-ingest: k6 was told $told records $( [[ $MODE == fire ]] && echo accepted || echo delivered ), $failed failed, $busy answers 429; the topic holds $have"
# Blocking: a record answered with an error may still have been written (a timeout), so the
# topic holds from `told` to `told + failed`. Fire: accepted records end delivered or failed,
# so it holds from `told - failed` to `told`. Anything outside is a lost or phantom record.
if [[ "$MODE" == "fire" ]]; then lo=$((told - failed)); hi=$told; else lo=$told; hi=$((told + failed)); fi
if (( have < lo || have > hi )); then
  echo "k6-ingest: MISMATCH: topic holds $have, expected $lo..$hi" >&2
  exit 1
fi
exit "$rc"
