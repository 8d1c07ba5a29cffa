#!/usr/bin/env bash
# Log compaction (the log cleaner) of spate against a real Apache Kafka (scripts/kafka/start.sh)
# on the same keyed data set, one broker after the other on this machine. Prints numbers, no
# thresholds: a side-by-side table with spate/Kafka ratios.
# The data set: BENCH_MB MiB of BENCH_VALUE_SIZE-byte incompressible values over BENCH_KEYS keys
# (spate-bench --key-space: key = sequence % BENCH_KEYS, so most records are superseded),
# produced by spate-bench (librdkafka; acks=all, linger.ms=5, batch.size=131072, no
# compression) into 1-partition topics with segment.bytes=BENCH_SEGMENT_BYTES,
# min.cleanable.dirty.ratio=0.5, min.compaction.lag.ms=0. Both brokers run one cleaner thread
# with a BENCH_DEDUPE_BUFFER-byte key map (Kafka: log.cleaner.threads=1,
# log.cleaner.dedupe.buffer.size; spate: --log-cleaner-dedupe-buffer-size) and a 1 s backoff
# (log.cleaner.backoff.ms=1000 / --log-cleaner-backoff-ms 1000); "cleaner off" is
# log.cleaner.enable=false on Kafka and --log-cleaner-backoff-ms 1000000000 on spate.
# Each broker is started twice: cleaner off, then cleaner on. Cases, in order:
#   produce compact, cleaner off   BENCH_PRODUCE_MB MiB of the same keys into a compacted topic
#                                  nobody cleans
#   produce compact, cleaner on    the same into a compacted topic while the cleaner runs (with
#                                  min.cleanable.dirty.ratio 0.5 it cleans again and again); then
#                                  the run waits, unmeasured, until the cleaner thread has used no
#                                  CPU for 3 s (on Kafka this also warms the cleaner's JIT)
#   produce delete                 the data set into a cleanup.policy=delete, retention.ms=-1
#                                  topic (the cleaner cannot touch it yet)
#   clean                          dirty pages written back and the page cache dropped, then the
#                                  delete topic is altered to cleanup.policy=compact
#                                  (kafka-configs, IncrementalAlterConfigs) and the cleaner is
#                                  timed until it has cleaned everything below the active segment
# "Done" for the clean, polled every 0.2 s for at most BENCH_CLEAN_TIMEOUT s:
#   spate  its /metrics show spate_partition_cleaner_dirty_bytes{topic,partition="0"} = 0 and
#          spate_log_cleaner_passes_total grew
#   kafka  cleaner-offset-checkpoint in its log dir holds an offset for the partition at least
#          the base offset of the active segment (the newest *.log file)
# Clean time is the broker's own account of the clean: spate's
# spate_log_cleaner_duration_seconds_sum (microseconds), Kafka's server.log timestamps (ms)
# from "Beginning cleaning of log" to its "Log cleaner thread 0 cleaned log" stats line, summed
# over the cleans of the topic; "wall" is from the alter's response to "done" as polled (it
# includes up to one backoff). Bytes read: spate's
# spate_log_cleaner_read_bytes_total, Kafka's "MB of log processed" (0.1 MB resolution).
# MB/s = bytes read / clean time. Cleaner CPU: utime + stime of the threads named spate-cleaner
# / kafka-log-clean* (Kafka's kafka-log-cleaner-thread-0, truncated by the kernel) from
# /proc/PID/task/*/stat over the clean; broker CPU is the whole process over the same window
# (GC, the kafka-configs request, everything). Log size before/after: the *.log files of the
# partition on disk.
#   scripts/bench-cleaner-vs-kafka.sh
#   BENCH_MB=32 BENCH_KEYS=5000 BENCH_SEGMENT_BYTES=4194304 scripts/bench-cleaner-vs-kafka.sh
# Env: BENCH_MB (256), BENCH_PRODUCE_MB (4 x BENCH_MB), BENCH_VALUE_SIZE (1024), BENCH_KEYS
#   (50,000), BENCH_SEGMENT_BYTES
#   (16,777,216), BENCH_DEDUPE_BUFFER (134,217,728), BENCH_WARMUP (10 s of unkeyed produce to a
#   scratch topic after each broker start, for Kafka's JIT; 0: none), BENCH_PRODUCE_TIMEOUT (300 s per produce
#   case), BENCH_CLEAN_TIMEOUT (600 s per wait for the cleaner), BENCH_BROKERS ("kafka spate";
#   either alone), KAFKA_PORT (19092), SPATE_BIN / SPATE_BENCH (the binaries; default: cargo
#   build --release), SPATE_FSYNC (interval), OUT (default
#   target/bench-cleaner-vs-kafka/<date>: logs, spate-bench JSON, one result file per broker,
#   table.txt).
# A case that fails shows as "-" or "error" and the run goes on.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
OUT="${OUT:-$ROOT/target/bench-cleaner-vs-kafka/$(date +%Y%m%d-%H%M%S)}"
MB="${BENCH_MB:-256}"
VSIZE="${BENCH_VALUE_SIZE:-1024}"
KEYS="${BENCH_KEYS:-50000}"
SEG="${BENCH_SEGMENT_BYTES:-16777216}"
BUF="${BENCH_DEDUPE_BUFFER:-134217728}"
WARMUP="${BENCH_WARMUP:-10}"
PTIMEOUT="${BENCH_PRODUCE_TIMEOUT:-300}"
CTIMEOUT="${BENCH_CLEAN_TIMEOUT:-600}"
BROKERS="${BENCH_BROKERS:-kafka spate}"
KPORT="${KAFKA_PORT:-19092}"
PMB="${BENCH_PRODUCE_MB:-$(( MB * 4 ))}"
RECORDS=$(( MB * 1048576 / VSIZE ))
PRECORDS=$(( PMB * 1048576 / VSIZE ))
HZ=$(getconf CLK_TCK)
(( RECORDS > 0 && PRECORDS > 0 && KEYS > 0 )) || { echo "BENCH_MB, BENCH_VALUE_SIZE and BENCH_KEYS must be positive" >&2; exit 2; }
mkdir -p "$OUT"
"$KAFKA_KIT/fetch.sh" >/dev/null
bins=()
[[ " $BROKERS " == *" spate "* && -z "${SPATE_BIN:-}" ]] && bins+=(--bin spate)
[[ -z "${SPATE_BENCH:-}" ]] && bins+=(--bin spate-bench)
if (( ${#bins[@]} )); then cargo build --release "${bins[@]}" --manifest-path "$ROOT/Cargo.toml"; fi
SPATE_BIN="${SPATE_BIN:-$ROOT/target/release/spate}"
BENCH="${SPATE_BENCH:-$ROOT/target/release/spate-bench}"
[[ -x "$BENCH" ]] || { echo "no spate-bench at $BENCH" >&2; exit 2; }

KDIR=""; SDIR=""; SPID=""; SB=""; SHTTP=""
cleanup() {
  # A client or tool still running (the run was interrupted): its `timeout` passes the signal on.
  local kids; kids=$(ps -o pid= --ppid $$ 2>/dev/null || true)
  for k in $kids; do [[ "$k" == "$BASHPID" ]] || kill "$k" 2>/dev/null || true; done
  if [[ -n "$KDIR" ]]; then KAFKA_DATA_DIR="$KDIR" "$KAFKA_KIT/stop.sh" >>"$OUT/stop.log" 2>&1 || true; rm -rf "$KDIR"; fi
  if [[ -n "$SPID" ]]; then kill "$SPID" 2>/dev/null || true; wait "$SPID" 2>/dev/null || true; fi
  [[ -n "$SDIR" ]] && rm -rf "$SDIR"
  return 0
}
trap cleanup EXIT

TOOL=("$KAFKA_KIT/tool.sh")
now() { date +%s.%N; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
thread_ticks() {  # thread_ticks PID COMM_PREFIX: utime + stime of the process's threads so named
  local t c s sum=0 f
  for t in /proc/"$1"/task/*; do
    c=$(cat "$t/comm" 2>/dev/null) || continue
    [[ "$c" == "$2"* ]] || continue
    s=$(cat "$t/stat" 2>/dev/null) || continue
    read -r -a f <<<"${s##*) }"   # fields from the 3rd (state) on: utime is 14th, stime 15th
    sum=$(( sum + f[11] + f[12] ))
  done
  echo "$sum"
}
thread_count() { local n=0 t; for t in /proc/"$1"/task/*; do [[ "$(cat "$t/comm" 2>/dev/null)" == "$2"* ]] && n=$((n + 1)); done; echo "$n"; }
log_bytes() {  # log_bytes DIR: bytes of the segment files (*.log) of one partition directory
  [[ -n "$1" && -d "$1" ]] || { echo 0; return; }
  find "$1" -maxdepth 1 -name '*.log' -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }'
}
record() { echo "$1=$2" >>"$RES"; }
json_field() {  # json_field FILE KEY: the first number under KEY in spate-bench's JSON report
  sed -n "s/^ *\"$2\": *\([0-9.]*\).*/\1/p" "$1" 2>/dev/null | head -1
}

create_topic() {  # create_topic BOOTSTRAP TOPIC POLICY
  timeout 120 "${TOOL[@]}" kafka-topics --bootstrap-server "$1" --create --topic "$2" --partitions 1 \
    --replication-factor 1 --config cleanup.policy="$3" --config retention.ms=-1 \
    --config retention.bytes=-1 --config segment.bytes="$SEG" --config min.cleanable.dirty.ratio=0.5 \
    --config min.compaction.lag.ms=0 >/dev/null 2>>"$OUT/$NAME-tools.err" \
    || { echo "$NAME: could not create $2" >&2; return 1; }
}
produce() {  # produce BOOTSTRAP TOPIC CASE RECORDS: keyed records into TOPIC; records/s into the result file
  local out="$OUT/$NAME-$3" rate n
  "$ROOT/scripts/drop-page-cache.sh"
  if timeout $((PTIMEOUT + 120)) "$BENCH" -b "$1" -t "$2" -n "$4" -d "${PTIMEOUT}s" -s "$VSIZE" \
      --key-space "$KEYS" --acks all --linger-ms 5 --batch-size 131072 --compression none \
      --payload-pattern random -X queue.buffering.max.kbytes=32768 --no-progress \
      --json-output "$out.json" >"$out.log" 2>&1; then
    rate=$(json_field "$out.json" msgs_per_sec); n=$(json_field "$out.json" delivered)
    if [[ -n "$rate" ]] && (( ${n:-0} == $4 )); then record "$3" "$rate"; else record "$3" error; fi
  else
    record "$3" error
  fi
}
warmup() {  # warmup BOOTSTRAP: unmeasured, unkeyed produce to a scratch topic
  (( WARMUP > 0 )) || return 0
  timeout $((WARMUP + 120)) "$BENCH" -b "$1" -t cleanbench-warmup --create-topic -d "${WARMUP}s" -s "$VSIZE" \
    --acks all --linger-ms 5 --batch-size 131072 -X queue.buffering.max.kbytes=32768 --no-progress \
    >"$OUT/$NAME-warmup.log" 2>&1 || true
}

# --- per-broker probes: partition directory, cleaner "done", clean time and bytes read ---
pdir() {  # pdir TOPIC: the partition-0 directory of TOPIC on the running broker
  case "$NAME" in
    kafka) echo "$KDIR/data/$1-0" ;;
    spate) find "$SDIR/data" -maxdepth 4 -type d -path "*/topics/$1/0" 2>/dev/null | head -1 ;;
  esac
}
metric() {  # metric NAME [LABELS]: one sample from spate's /metrics (empty when absent)
  curl -sf --max-time 5 "http://$SHTTP/metrics" 2>/dev/null \
    | awk -v n="$1" -v l="${2:-}" '$1 == n || $1 == n "{" l "}" { print $2; exit }'
}
kafka_done() {  # kafka_done TOPIC: the cleaner's checkpoint has reached the active segment
  local active point
  active=$(find "$KDIR/data/$1-0" -maxdepth 1 -name '*.log' -printf '%f\n' 2>/dev/null | sort | tail -1)
  [[ -n "$active" ]] || return 1
  active=$((10#${active%.log}))
  point=$(awk -v t="$1" 'NF == 3 && $1 == t && $2 == 0 { print $3 }' "$KDIR/data/cleaner-offset-checkpoint" 2>/dev/null)
  [[ -n "$point" ]] && (( point >= active && active > 0 ))
}
spate_done() {  # spate_done TOPIC PASSES_BEFORE
  local dirty passes
  dirty=$(metric spate_partition_cleaner_dirty_bytes "topic=\"$1\",partition=\"0\"")
  passes=$(metric spate_log_cleaner_passes_total)
  [[ -n "$dirty" && -n "$passes" ]] && awk -v d="$dirty" -v p="$passes" -v b="$2" 'BEGIN { exit !(d == 0 && p > b) }'
}
wait_quiet() {  # wait_quiet PID THREAD_PREFIX: until the cleaner thread used no CPU for 3 s
  local deadline=$((SECONDS + CTIMEOUT)) last now
  last=$(thread_ticks "$1" "$2")
  while (( SECONDS < deadline )); do
    sleep 3
    now=$(thread_ticks "$1" "$2")
    (( now == last )) && return 0
    last=$now
  done
  return 1
}
wait_clean() {  # wait_clean TOPIC PASSES_BEFORE: 0 once the cleaner is done with TOPIC, 1 on timeout
  local deadline=$((SECONDS + CTIMEOUT))
  while (( SECONDS < deadline )); do
    case "$NAME" in
      kafka) kafka_done "$1" && return 0 ;;
      spate) spate_done "$1" "$2" && return 0 ;;
    esac
    sleep 0.2
  done
  return 1
}
kafka_clean_stats() {  # kafka_clean_stats TOPIC FROM_LINE: "seconds MiB passes" of TOPIC's cleans in server.log
  tail -n +"$2" "$KDIR/logs/server.log" | awk -v lg="$1-0" '
    function ms(line,   d, t) {   # [2026-11-02 23:01:02,345] INFO ...
      d = substr(line, 2, 23); gsub(/[-:,]/, " ", d); split(d, t, " ")
      return mktime(t[1] " " t[2] " " t[3] " " t[4] " " t[5] " " t[6]) * 1000 + t[7]
    }
    /^\[20/ { last = ms($0) }   # the stats block: a stamped line, then tab-indented lines
    index($0, "Beginning cleaning of log " lg) { start = last }
    index($0, "cleaned log " lg " ") && start != "" { total += last - start; start = ""; passes++; grab = 1; next }
    grab && /MB of log processed/ { v = $1; gsub(/,/, "", v); mb += v; grab = 0 }
    END { if (passes) printf "%.3f %.1f %d\n", total / 1000, mb, passes; else print "" }'
}

run_cleaner_off() {  # run_cleaner_off BOOTSTRAP
  record load_off "$(cut -d' ' -f1-3 /proc/loadavg)"
  warmup "$1"
  create_topic "$1" cleanbench-off compact && produce "$1" cleanbench-off produce_off "$PRECORDS"
  record off_log_mb "$(awk -v b="$(log_bytes "$(pdir cleanbench-off)")" 'BEGIN { printf "%.1f", b / 1048576 }')"
}

run_cleaner_on() {  # run_cleaner_on BOOTSTRAP PID CLEANER_THREAD_PREFIX
  local b=$1 pid=$2 th=$3 t0 c0 p0 passes0 d0 r0 from t1 c1 p1 dir before after secs mb passes
  record load_on "$(cut -d' ' -f1-3 /proc/loadavg)"
  warmup "$b"
  record cleaner_threads "$(thread_count "$pid" "$th")"
  # Produce into a compacted topic while the cleaner runs.
  if create_topic "$b" cleanbench-live compact; then
    c0=$(thread_ticks "$pid" "$th"); passes0=$(spate_passes); from=$(klog_lines)
    produce "$b" cleanbench-live produce_on "$PRECORDS"
    record produce_on_cleaner_cpu_s "$(awk -v t=$(( $(thread_ticks "$pid" "$th") - c0 )) -v hz="$HZ" 'BEGIN { printf "%.2f", t / hz }')"
    record produce_on_cleans "$(cleans_since "$passes0" "$from" cleanbench-live)"
    # Whatever clean the produce left running finishes before the next case.
    wait_quiet "$pid" "$th" || echo "$NAME: the cleaner was still busy after $CTIMEOUT s" >&2
    record on_log_mb "$(awk -v b="$(log_bytes "$(pdir cleanbench-live)")" 'BEGIN { printf "%.1f", b / 1048576 }')"
  fi
  # The clean: a delete topic full of superseded records turns compacted.
  create_topic "$b" cleanbench-clean delete || return 0
  produce "$b" cleanbench-clean produce_delete "$RECORDS"
  dir=$(pdir cleanbench-clean)
  "$ROOT/scripts/drop-page-cache.sh"
  before=$(log_bytes "$dir")
  passes0=$(spate_passes); from=$(klog_lines)
  d0=$(spate_metric_or0 spate_log_cleaner_duration_seconds_sum)
  r0=$(spate_metric_or0 spate_log_cleaner_read_bytes_total)
  c0=$(thread_ticks "$pid" "$th"); p0=$(ticks "$pid")
  if ! timeout 120 "${TOOL[@]}" kafka-configs --bootstrap-server "$b" --entity-type topics \
      --entity-name cleanbench-clean --alter --add-config cleanup.policy=compact \
      >/dev/null 2>>"$OUT/$NAME-tools.err"; then
    echo "$NAME: could not alter cleanbench-clean to compact" >&2; record clean error; return 0
  fi
  t0=$(now)
  if ! wait_clean cleanbench-clean "$passes0"; then
    echo "$NAME: cleaner not done with cleanbench-clean after $CTIMEOUT s" >&2; record clean error
  fi
  t1=$(now); c1=$(thread_ticks "$pid" "$th"); p1=$(ticks "$pid")
  sleep 1  # let the last log lines reach server.log
  after=$(log_bytes "$dir")
  case "$NAME" in
    spate)
      secs=$(awk -v a="$d0" -v b="$(spate_metric_or0 spate_log_cleaner_duration_seconds_sum)" 'BEGIN { printf "%.3f", b - a }')
      mb=$(awk -v a="$r0" -v b="$(spate_metric_or0 spate_log_cleaner_read_bytes_total)" 'BEGIN { printf "%.1f", (b - a) / 1048576 }')
      record clean_passes "$(awk -v a="$passes0" -v b="$(spate_passes)" 'BEGIN { print b - a }')" ;;
    kafka)
      read -r secs mb passes <<<"$(kafka_clean_stats cleanbench-clean "$from")"
      record clean_passes "${passes:-0}" ;;
  esac
  record before_mb "$(awk -v b="$before" 'BEGIN { printf "%.1f", b / 1048576 }')"
  record after_mb "$(awk -v b="$after" 'BEGIN { printf "%.1f", b / 1048576 }')"
  record read_mb "${mb:-}"
  record clean_s "${secs:-}"
  record wall_s "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')"
  record cleaner_cpu_s "$(awk -v t=$((c1 - c0)) -v hz="$HZ" 'BEGIN { printf "%.2f", t / hz }')"
  record broker_cpu_s "$(awk -v t=$((p1 - p0)) -v hz="$HZ" 'BEGIN { printf "%.2f", t / hz }')"
}
spate_passes() { [[ "$NAME" == spate ]] && spate_metric_or0 spate_log_cleaner_passes_total || echo 0; }
spate_metric_or0() { local v=""; [[ "$NAME" == spate ]] && v=$(metric "$1"); echo "${v:-0}"; }
klog_lines() { if [[ "$NAME" == kafka ]]; then echo $(( $(wc -l <"$KDIR/logs/server.log") + 1 )); else echo 0; fi; }
cleans_since() {  # cleans_since PASSES_BEFORE FROM_LINE TOPIC: cleans of TOPIC since then
  case "$NAME" in
    spate) awk -v a="$1" -v b="$(spate_passes)" 'BEGIN { print b - a }' ;;
    kafka) tail -n +"$2" "$KDIR/logs/server.log" | grep -c "cleaned log $3-0 " || true ;;
  esac
}

start_kafka() {  # start_kafka CLEANER(on|off)
  local props="log.cleaner.enable=false"
  [[ "$1" == on ]] && props="log.cleaner.enable=true log.cleaner.threads=1 log.cleaner.backoff.ms=1000 log.cleaner.dedupe.buffer.size=$BUF"
  KDIR="$(mktemp -d /tmp/kafka-cleanbench.XXXX)"
  KAFKA_PORT=$KPORT KAFKA_DATA_DIR="$KDIR" KAFKA_FRESH=1 KAFKA_EXTRA_PROPS="$props" \
    "$KAFKA_KIT/start.sh" >"$OUT/kafka-$1-start.log"
  echo "== kafka (cleaner $1) pid $(cat "$KDIR/kafka.pid") at 127.0.0.1:$KPORT"
}
stop_kafka() {
  cp "$KDIR/logs/server.log" "$OUT/kafka-$1-server.log" 2>/dev/null || true
  KAFKA_DATA_DIR="$KDIR" "$KAFKA_KIT/stop.sh" >/dev/null || true
  rm -rf "$KDIR"; KDIR=""
}
start_spate() {  # start_spate CLEANER(on|off)
  local backoff=1000000000
  [[ "$1" == on ]] && backoff=1000
  [[ -x "$SPATE_BIN" ]] || { echo "no spate binary at $SPATE_BIN" >&2; exit 2; }
  SDIR="$(mktemp -d /tmp/spate-cleanbench.XXXX)"
  "$SPATE_BIN" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir "$SDIR/data" \
    --fsync "${SPATE_FSYNC:-interval}" --log-cleaner-backoff-ms "$backoff" \
    --log-cleaner-dedupe-buffer-size "$BUF" >"$SDIR/stdout" 2>"$OUT/spate-$1.log" &
  SPID=$!
  for _ in $(seq 1 300); do [[ -s "$SDIR/stdout" ]] && break; kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
  SB=$(awk 'NR==1{print $4}' "$SDIR/stdout")
  SHTTP=$(sed -n '1s/.*http on \([^ ,]*\).*/\1/p' "$SDIR/stdout")
  [[ -n "$SB" && -n "$SHTTP" ]] || { echo "spate did not start:" >&2; tail -20 "$OUT/spate-$1.log" >&2; exit 1; }
  echo "== spate (cleaner $1) pid $SPID at $SB, http $SHTTP (fsync ${SPATE_FSYNC:-interval})"
}
stop_spate() { kill "$SPID"; wait "$SPID" 2>/dev/null || true; SPID=""; rm -rf "$SDIR"; SDIR=""; }

for NAME in $BROKERS; do
  RES="$OUT/$NAME.txt"; : >"$RES"
  case "$NAME" in
    kafka)
      "$ROOT/scripts/drop-page-cache.sh"
      start_kafka off; run_cleaner_off "127.0.0.1:$KPORT"; stop_kafka off
      "$ROOT/scripts/drop-page-cache.sh"
      start_kafka on; run_cleaner_on "127.0.0.1:$KPORT" "$(cat "$KDIR/kafka.pid")" kafka-log-clean; stop_kafka on
      ;;
    spate)
      "$ROOT/scripts/drop-page-cache.sh"
      start_spate off; run_cleaner_off "$SB"; stop_spate
      "$ROOT/scripts/drop-page-cache.sh"
      start_spate on; run_cleaner_on "$SB" "$SPID" spate-cleaner; stop_spate
      ;;
    *) echo "unknown broker '$NAME' in BENCH_BROKERS" >&2; exit 2 ;;
  esac
  sed "s/^/$NAME  /" "$RES"
done

# The table.
val() { local v; v=$(sed -n "s/^$2=//p" "$OUT/$1.txt" 2>/dev/null | tail -1); echo "${v:--}"; }
num() { [[ "$1" =~ ^[0-9.]+$ ]]; }
div() { if num "$1" && num "$2"; then awk -v a="$1" -v b="$2" -v s="${3:-1}" -v f="${4:-%.1f}" 'BEGIN { if (b > 0) printf f, a * s / b; else print "-" }'; else echo -; fi; }
ratio() { if num "$1" && num "$2"; then awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", b / a; else print "-" }'; else echo -; fi; }
slow() { if num "$1" && num "$2"; then awk -v off="$1" -v on="$2" 'BEGIN { if (off > 0) printf "%.1f", (off - on) * 100 / off; else print "-" }'; else echo -; fi; }
row() { printf '%-46s %12s %12s %8s\n' "$1" "$2" "$3" "$(ratio "$2" "$3")"; }
declare -A D
for b in kafka spate; do
  if [[ -f "$OUT/$b.txt" ]] && [[ "$(val "$b" clean)" != error ]]; then
    D[$b,rate]=$(div "$(val "$b" read_mb)" "$(val "$b" clean_s)")
    D[$b,cpu]=$(div "$(val "$b" cleaner_cpu_s)" "$(val "$b" read_mb)" 1000)
    D[$b,pcpu]=$(div "$(val "$b" broker_cpu_s)" "$(val "$b" read_mb)" 1000)
  fi
  D[$b,slow]=$(slow "$(val "$b" produce_off)" "$(val "$b" produce_on)")
done
{
  echo "Log cleaner, Kafka $(awk -F: '/kafka-clients/ {print $3}' "$KAFKA_KIT/jars.lock" | cut -d' ' -f1) vs spate: $MB MiB = $RECORDS records of $VSIZE B over $KEYS keys, segment.bytes $SEG, dedupe buffer $BUF, 1 cleaner thread ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores)"
  printf '%-46s %12s %12s %8s\n' "clean (delete -> compact, cold page cache)" kafka spate ratio
  row "log before (MiB on disk)" "$(val kafka before_mb)" "$(val spate before_mb)"
  row "log after (MiB on disk)" "$(val kafka after_mb)" "$(val spate after_mb)"
  row "read by the cleaner (MiB)" "$(val kafka read_mb)" "$(val spate read_mb)"
  row "cleans (passes)" "$(val kafka clean_passes)" "$(val spate clean_passes)"
  row "clean time (s, broker's account)" "$(val kafka clean_s)" "$(val spate clean_s)"
  row "wall, altered -> done (s, polled)" "$(val kafka wall_s)" "$(val spate wall_s)"
  row "cleaned MiB/s (read / clean time)" "${D[kafka,rate]:--}" "${D[spate,rate]:--}"
  row "cleaner thread CPU (s)" "$(val kafka cleaner_cpu_s)" "$(val spate cleaner_cpu_s)"
  row "cleaner thread CPU ms per MiB" "${D[kafka,cpu]:--}" "${D[spate,cpu]:--}"
  row "broker process CPU ms per MiB (same window)" "${D[kafka,pcpu]:--}" "${D[spate,pcpu]:--}"
  printf '%-46s %12s %12s %8s\n' "produce (records/s)" kafka spate ratio
  row "delete policy, $RECORDS records (the clean's)" "$(val kafka produce_delete | cut -d. -f1)" "$(val spate produce_delete | cut -d. -f1)"
  row "compact, cleaner off, $PRECORDS records" "$(val kafka produce_off | cut -d. -f1)" "$(val spate produce_off | cut -d. -f1)"
  row "compact, cleaner on, $PRECORDS records" "$(val kafka produce_on | cut -d. -f1)" "$(val spate produce_on | cut -d. -f1)"
  printf '%-46s %12s %12s\n' "slowdown, cleaner on vs off (%)" "${D[kafka,slow]}" "${D[spate,slow]}"
  row "compacted topic on disk after (MiB): off" "$(val kafka off_log_mb)" "$(val spate off_log_mb)"
  row "                                      on" "$(val kafka on_log_mb)" "$(val spate on_log_mb)"
  row "cleans during the cleaner-on produce" "$(val kafka produce_on_cleans)" "$(val spate produce_on_cleans)"
  row "cleaner CPU during that produce (s)" "$(val kafka produce_on_cleaner_cpu_s)" "$(val spate produce_on_cleaner_cpu_s)"
  echo "cleaner threads seen: kafka $(val kafka cleaner_threads), spate $(val spate cleaner_threads); load average at the broker starts (off, on): kafka $(val kafka load_off) / $(val kafka load_on), spate $(val spate load_off) / $(val spate load_on)"
  echo "ratio = spate / kafka (MiB/s, records/s: above 1 is faster; time, CPU: below 1 is cheaper)"
} | tee "$OUT/table.txt"
echo "results in $OUT"
