#!/usr/bin/env bash
# Transactional produce and read_committed consume with Kafka's own Java clients
# (scripts/txn/TxnBench.java), against a real Apache Kafka (scripts/kafka/start.sh) and against
# spate, one after the other on this machine, beside the same runs with a plain idempotent
# producer. Prints numbers, no thresholds: a side-by-side table of records/s and of broker CPU
# per record (utime + stime of the broker process from /proc/PID/stat over each case), with
# spate/Kafka ratios, and the broker CPU per record of transactional over idempotent produce.
# Dirty pages are written back and the page cache dropped before every case (as root), so no
# case pays for the previous one's writeback.
# Cases (each on its own 1-partition topic, BENCH_RECORD_SIZE-byte records, acks=all,
# linger.ms=5, batch.size=131072; every produce case runs BENCH_SECONDS):
#   produce idempotent           enable.idempotence, no transactions
#   produce txn commit/100ms     a transaction committed once 100 ms of sending have passed
#   produce txn commit/1000      a transaction committed every 1,000 records
#   consume rc <topic>           isolation.level=read_committed from the start to the LSO of
#                                each produce case's topic
#   scripts/bench-txn-vs-kafka.sh
# Env: BENCH_SECONDS (15), BENCH_RECORD_SIZE (256), BENCH_MAX_RECORDS (50,000,000 per produce
#   case), BENCH_WARMUP (3 s of idempotent produce to a scratch topic first; 0: none),
#   BENCH_BROKERS ("kafka spate"; either alone), KAFKA_PORT (19092), SPATE_BIN (the spate to
#   measure; default: cargo build --release), SPATE_FSYNC (interval), OUT (default
#   target/bench-txn-vs-kafka/<date>: one result file per broker and case, and table.txt).
# A case that fails (a broker without transactions) shows as "error" and the run goes on.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
OUT="${OUT:-$ROOT/target/bench-txn-vs-kafka/$(date +%Y%m%d-%H%M%S)}"
SECS="${BENCH_SECONDS:-15}"
SIZE="${BENCH_RECORD_SIZE:-256}"
MAX="${BENCH_MAX_RECORDS:-50000000}"
WARMUP="${BENCH_WARMUP:-3}"
BROKERS="${BENCH_BROKERS:-kafka spate}"
KPORT="${KAFKA_PORT:-19092}"
HZ=$(getconf CLK_TCK)
mkdir -p "$OUT"
"$KAFKA_KIT/fetch.sh" >/dev/null
if [[ " $BROKERS " == *" spate "* && -z "${SPATE_BIN:-}" ]]; then
  cargo build --release --bin spate --manifest-path "$ROOT/Cargo.toml"
  SPATE_BIN="$ROOT/target/release/spate"
fi

KDIR=""; SDIR=""; SPID=""
cleanup() {
  if [[ -n "$KDIR" ]]; then KAFKA_DATA_DIR="$KDIR" "$KAFKA_KIT/stop.sh" >/dev/null 2>&1 || true; rm -rf "$KDIR"; fi
  if [[ -n "$SPID" ]]; then kill "$SPID" 2>/dev/null || true; wait "$SPID" 2>/dev/null || true; fi
  [[ -n "$SDIR" ]] && rm -rf "$SDIR"
  return 0
}
trap cleanup EXIT

BENCH=("$KAFKA_KIT/tool.sh" class "$ROOT/scripts/txn/TxnBench.java")
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
CASES=(idem txn100ms txn1000 rc-idem rc-txn100ms rc-txn1000)
declare -A LABEL=(
  [idem]="produce idempotent" [txn100ms]="produce txn commit/100ms" [txn1000]="produce txn commit/1000"
  [rc-idem]="consume rc (idempotent topic)" [rc-txn100ms]="consume rc (commit/100ms topic)"
  [rc-txn1000]="consume rc (commit/1000 topic)")
declare -A ARGS=(
  [idem]="produce idem idempotent" [txn100ms]="produce txn100ms txn-ms:100" [txn1000]="produce txn1000 txn-n:1000"
  [rc-idem]="consume idem" [rc-txn100ms]="consume txn100ms" [rc-txn1000]="consume txn1000")

run_cases() {  # run_cases NAME BOOTSTRAP PID: every case against one broker
  local name=$1 b=$2 pid=$3 c t0 words out
  for t in idem txn100ms txn1000 warmup; do
    timeout 120 "$KAFKA_KIT/tool.sh" topics --bootstrap-server "$b" --create --topic "txnbench-$t" \
      --partitions 1 >/dev/null 2>>"$OUT/$name-tools.err" || echo "$name: could not create txnbench-$t" >&2
  done
  if (( WARMUP > 0 )); then
    timeout $((WARMUP + 120)) "${BENCH[@]}" produce "$b" txnbench-warmup idempotent "$WARMUP" "$MAX" "$SIZE" \
      >/dev/null 2>>"$OUT/$name-tools.err" || true
  fi
  for c in "${CASES[@]}"; do
    read -r -a words <<<"${ARGS[$c]}"
    out="$OUT/$name-$c.txt"
    # Each case starts without the previous one's dirty pages: their writeback is kernel time
    # charged to the broker, which would make later cases look dearer per record.
    "$ROOT/scripts/drop-page-cache.sh"
    t0=$(ticks "$pid")
    if [[ "${words[0]}" == produce ]]; then
      timeout $((SECS + 180)) "${BENCH[@]}" produce "$b" "txnbench-${words[1]}" "${words[2]}" "$SECS" "$MAX" "$SIZE" \
        >"$out" 2>>"$OUT/$name-tools.err" || echo "failed=1" >>"$out"
    else
      timeout 300 "${BENCH[@]}" consume "$b" "txnbench-${words[1]}" read_committed 120 \
        >"$out" 2>>"$OUT/$name-tools.err" || echo "failed=1" >>"$out"
    fi
    echo "cpu_ticks=$(( $(ticks "$pid") - t0 ))" >>"$out"
    printf '%-8s %-32s %s\n' "$name" "${LABEL[$c]}" "$(tr '\n' ' ' <"$out")"
  done
}

for broker in $BROKERS; do
  "$ROOT/scripts/drop-page-cache.sh"
  case "$broker" in
    kafka)
      KDIR="$(mktemp -d /tmp/kafka-txnbench.XXXX)"
      KAFKA_PORT=$KPORT KAFKA_DATA_DIR="$KDIR" KAFKA_FRESH=1 "$KAFKA_KIT/start.sh" >"$OUT/kafka-start.log"
      echo "== kafka pid $(cat "$KDIR/kafka.pid") at 127.0.0.1:$KPORT"
      run_cases kafka "127.0.0.1:$KPORT" "$(cat "$KDIR/kafka.pid")"
      KAFKA_DATA_DIR="$KDIR" "$KAFKA_KIT/stop.sh" >/dev/null || true
      rm -rf "$KDIR"; KDIR=""
      ;;
    spate)
      [[ -x "$SPATE_BIN" ]] || { echo "no spate binary at $SPATE_BIN" >&2; exit 2; }
      SDIR="$(mktemp -d /tmp/spate-txnbench.XXXX)"
      "$SPATE_BIN" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir "$SDIR/data" \
        --fsync "${SPATE_FSYNC:-interval}" >"$SDIR/stdout" 2>"$OUT/spate.log" &
      SPID=$!
      for _ in $(seq 1 300); do [[ -s "$SDIR/stdout" ]] && break; kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
      SB=$(awk 'NR==1{print $4}' "$SDIR/stdout")
      [[ -n "$SB" ]] || { echo "spate did not start:" >&2; tail -20 "$OUT/spate.log" >&2; exit 1; }
      echo "== spate pid $SPID at $SB (fsync ${SPATE_FSYNC:-interval})"
      run_cases spate "$SB" "$SPID"
      kill "$SPID"; wait "$SPID" 2>/dev/null || true; SPID=""
      rm -rf "$SDIR"; SDIR=""
      ;;
    *) echo "unknown broker '$broker' in BENCH_BROKERS" >&2; exit 2 ;;
  esac
done

# The table: records/s and broker CPU microseconds per record, per broker, with spate/Kafka.
field() { [[ -f "$1" ]] && sed -n "s/.*\b$2=\([0-9.]*\).*/\1/p" "$1" | head -1; }
cell() {  # cell BROKER CASE -> "rate us_per_record", or "error"/"-" (no run)
  local f="$OUT/$1-$2.txt" r n t
  [[ -f "$f" ]] || { echo "- -"; return; }
  r=$(field "$f" rate); n=$(field "$f" records); t=$(field "$f" cpu_ticks)
  if grep -q "^failed=1" "$f" || [[ -z "$n" || "$n" == 0 ]]; then echo "error error"; return; fi
  awk -v r="$r" -v n="$n" -v t="$t" -v hz="$HZ" 'BEGIN { printf "%.0f %.2f\n", r, t / hz * 1e6 / n }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", b / a; else print "-" }'; }
{
  echo "Transactions, Kafka $(awk -F: '/kafka-clients/ {print $3}' "$KAFKA_KIT/jars.lock" | cut -d' ' -f1) Java clients, ${SIZE}-byte records, ${SECS} s per produce case ($(date -u +%Y-%m-%dT%H:%MZ))"
  printf '%-32s %12s %12s %8s   %14s %14s %8s\n' case "kafka rec/s" "spate rec/s" ratio "kafka cpu us/r" "spate cpu us/r" ratio
  for c in "${CASES[@]}"; do
    read -r kr kc <<<"$(cell kafka "$c")"
    read -r sr sc <<<"$(cell spate "$c")"
    printf '%-32s %12s %12s %8s   %14s %14s %8s\n' "${LABEL[$c]}" "$kr" "$sr" "$(ratio "$kr" "$sr")" "$kc" "$sc" "$(ratio "$kc" "$sc")"
  done
  for b in kafka spate; do
    read -r _ i <<<"$(cell "$b" idem)"; read -r _ a <<<"$(cell "$b" txn100ms)"; read -r _ n <<<"$(cell "$b" txn1000)"
    [[ "$i" == "-" ]] && continue
    echo "$b broker CPU per record, transactional / idempotent produce: commit/100ms $(ratio "$i" "$a"), commit/1000 $(ratio "$i" "$n")"
  done
  for b in kafka spate; do
    for c in txn100ms txn1000; do
      f="$OUT/$b-$c.txt"; [[ -f "$f" ]] || continue
      n=$(field "$f" records); x=$(field "$f" transactions)
      [[ -n "$x" && "$x" != 0 ]] && echo "$b ${LABEL[$c]}: $x transactions, $(( n / x )) records each on average"
    done
  done
  echo "ratio = spate / kafka (records/s: above 1 is faster; cpu: below 1 is cheaper)"
} | tee "$OUT/table.txt"
echo "results in $OUT"
