#!/usr/bin/env bash
# Kafka Connect (Apache Kafka's own distributed worker, scripts/kafka/tool.sh connect-distributed)
# through a crash, against any Kafka-compatible broker. Connect keeps connector configs, source
# offsets and statuses in three internal topics that must be compacted (cleanup.policy=compact;
# Connect refuses an existing one that is not, and its config topic must have one partition):
#   1. the three topics are created compacted, by this script through kafka-topics (default; a
#      broker that refuses compaction fails the run here, with its reason) or by the worker
#      itself (CONNECT_CREATE_TOPICS=worker); kafka-configs --describe --all must then show
#      cleanup.policy=compact on each, and the config topic one partition;
#   2. a worker starts (REST on a free loopback port); a FileStreamSource connector (temp input
#      file -> a 1-partition topic) and a FileStreamSink connector (topic -> temp output file)
#      are created through the REST API; 1,000 lines are appended to the input;
#   3. once the output file holds the 1,000 lines and Connect has committed both connectors'
#      offsets to the broker (GET /connectors/NAME/offsets: the source's byte position at the
#      input's end, the sink's consumer offset at the topic's end), the worker is killed with
#      kill -9, and a new worker of the same group starts on another REST port: it must find
#      both connectors in the config topic (not created again) and run their tasks;
#   4. MID_RUN_HOOK runs (if set), then 100 more lines are appended; the output must end up
#      with exactly 1,100 lines, the input's lines in order, each exactly once, and the topic
#      must hold exactly 1,100 records.
# Why strict: FileStreamSink (and Connect's source producer, not idempotent) are at-least-once.
# A worker killed before its offsets reached the broker restarts from the last committed ones
# and repeats what came after (the source reads its input again from the committed position,
# the sink's consumer from the committed offset). Here the kill comes only once both committed
# offsets are at the end and nothing is in flight, so on Kafka the outcome is deterministic:
# no line is repeated, and a repeat means the broker lost or misreported a committed offset.
# CONNECT_MAX_DUPLICATES (0) tolerates that many repeated lines (as does a count the hook writes
# to $CONNECT_HOOK_DUPLICATES, with why), for a MID_RUN_HOOK that breaks
# something while records are in flight (a lost produce acknowledgement is then retried and
# written twice, which Kafka allows); lost or reordered lines always fail the run.
#   scripts/connect-e2e.sh     against a throw-away spate (target/debug/spate; SPATE_BIN overrides)
#   SPATE_BOOTSTRAP=host:port scripts/connect-e2e.sh     against a running broker (any Kafka)
# Env: CONNECT_LINES (1000) and CONNECT_MORE_LINES (100): lines before and after the crash;
#   CONNECT_RF (1): replication factor of every topic; CONNECT_CREATE_TOPICS (script | worker);
#   CONNECT_OFFSET_PARTITIONS (25) and CONNECT_STATUS_PARTITIONS (5), Connect's defaults;
#   CONNECT_SUFFIX (-<epoch seconds>): appended to the topic, group and connector names;
#   CONNECT_TIMEOUT (120 s for each wait); CONNECT_MAX_DUPLICATES (0);
#   MID_RUN_HOOK: a bash command run once, in the foreground, after the restarted worker runs
#   both tasks and before the last lines are appended, bounded by CONNECT_TIMEOUT; it sees
#   SPATE_BOOTSTRAP, CONNECT_URL, CONNECT_PID, CONNECT_DATA_TOPIC and CONNECT_CONFIG_TOPIC,
#   CONNECT_OFFSET_TOPIC, CONNECT_STATUS_TOPIC, CONNECT_SINK_GROUP (the sink's consumer group)
#   and CONNECT_HOOK_DUPLICATES (a file for "COUNT why": repeats its fault allows); its failure
#   fails the run.
#   scripts/connect-cluster-e2e.sh uses it to kill a broker of a 3-node cluster.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
[[ -n "${SPATE_BOOTSTRAP:-}" ]] || exec "$ROOT/scripts/with-spate.sh" -- "$0" "$@"
"$KAFKA_KIT/fetch.sh" >/dev/null
B="$SPATE_BOOTSTRAP"
FIRST="${CONNECT_LINES:-1000}"
MORE="${CONNECT_MORE_LINES:-100}"
TOTAL=$((FIRST + MORE))
RF="${CONNECT_RF:-1}"
CREATE="${CONNECT_CREATE_TOPICS:-script}"
[[ "$CREATE" == script || "$CREATE" == worker ]] || { echo "CONNECT_CREATE_TOPICS is script or worker" >&2; exit 2; }
TIMEOUT="${CONNECT_TIMEOUT:-120}"
MAX_DUP="${CONNECT_MAX_DUPLICATES:-0}"
S="${CONNECT_SUFFIX--$(date +%s)}"
CONFIG_TOPIC="connect-configs$S"; OFFSET_TOPIC="connect-offsets$S"; STATUS_TOPIC="connect-status$S"
DATA_TOPIC="connect-e2e-lines$S"; GROUP="connect-e2e$S"; SRC="e2e-file-source$S"; SINK="e2e-file-sink$S"
WORK="$(mktemp -d)"
INPUT="$WORK/input.txt"; OUTPUT="$WORK/output.txt"
WORKER_PID=""
cleanup() {
  [[ -n "$WORKER_PID" ]] && kill -9 "$WORKER_PID" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/worker*.log; do
    [[ -s "$f" ]] || continue
    echo "--- $(basename "$f"): errors (last 15)" >&2
    grep -E "ERROR|Exception|Caused by" "$f" | tail -15 >&2 || tail -15 "$f" >&2
  done
  [[ -s "$WORK/tool.err" ]] && { echo "--- tool errors" >&2; tail -10 "$WORK/tool.err" >&2; }
  [[ -f "${SPATE_LOG:-}" ]] && { echo "--- spate log" >&2; tail -30 "$SPATE_LOG" >&2; }
  exit 1
}
T0=$SECONDS
pass() { echo "ok: $* [$((SECONDS - T0)) s]"; }
tool() { timeout 120 "$KAFKA_KIT/tool.sh" "$@" 2>>"$WORK/tool.err"; }
tool_error() { grep -oE '[A-Za-z.]*(Exception|Error): .*' "$WORK/tool.err" | tail -1; }
topics() { tool topics --bootstrap-server "$B" "$@"; }
# wait_for DESCRIPTION COMMAND...: polls COMMAND every 0.5 s for CONNECT_TIMEOUT seconds; fails
# at once if the worker exits meanwhile. A COMMAND may leave what it saw last in STATE.
wait_for() {
  local what=$1 start=$SECONDS rc=0; shift
  STATE=""
  until "$@"; do
    if [[ -n "$WORKER_PID" ]] && ! kill -0 "$WORKER_PID" 2>/dev/null; then
      wait "$WORKER_PID" 2>/dev/null || rc=$?
      WORKER_PID=""
      fail "the Connect worker exited (status $rc) while waiting for $what${STATE:+ ($STATE)}"
    fi
    (( SECONDS - start > TIMEOUT )) && fail "timed out after $TIMEOUT s waiting for $what${STATE:+ ($STATE)}"
    sleep 0.5
  done
}

# The data topic has one partition, so the output keeps the input's order.
topics --create --topic "$DATA_TOPIC" --partitions 1 --replication-factor "$RF" >/dev/null \
  || fail "create $DATA_TOPIC: $(tool_error)"
if [[ "$CREATE" == script ]]; then
  for t in "$CONFIG_TOPIC:1" "$OFFSET_TOPIC:${CONNECT_OFFSET_PARTITIONS:-25}" "$STATUS_TOPIC:${CONNECT_STATUS_PARTITIONS:-5}"; do
    topics --create --topic "${t%:*}" --partitions "${t##*:}" --replication-factor "$RF" \
      --config cleanup.policy=compact >/dev/null \
      || fail "the broker refused to create ${t%:*} with cleanup.policy=compact, which Kafka Connect requires of its internal topics: $(tool_error)"
  done
  pass "created $CONFIG_TOPIC, $OFFSET_TOPIC and $STATUS_TOPIC (cleanup.policy=compact, RF $RF) and $DATA_TOPIC on $B"
fi

# The FileStream connectors come from the kit's classpath (connect-file), found through their
# ServiceLoader manifests without scanning every jar. Offsets are committed every second. The
# killed worker's sink consumer stays in the sink's group until its session ends, and the new
# one waits for that: 10 s rather than the consumer's default 45 s.
read -r PORT1 PORT2 < <(python3 "$ROOT/scripts/free-ports.py" 2)
cat > "$WORK/worker.properties" <<EOF
bootstrap.servers=$B
group.id=$GROUP
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
config.storage.topic=$CONFIG_TOPIC
offset.storage.topic=$OFFSET_TOPIC
status.storage.topic=$STATUS_TOPIC
config.storage.replication.factor=$RF
offset.storage.replication.factor=$RF
status.storage.replication.factor=$RF
offset.storage.partitions=${CONNECT_OFFSET_PARTITIONS:-25}
status.storage.partitions=${CONNECT_STATUS_PARTITIONS:-5}
offset.flush.interval.ms=1000
consumer.session.timeout.ms=10000
consumer.heartbeat.interval.ms=3000
plugin.discovery=service_load
EOF
# start_worker K PORT: worker K in the background (tool.sh execs java: $! is the JVM).
start_worker() {
  sed "/^listeners=/d; /^rest.advertised/d" "$WORK/worker.properties" > "$WORK/worker$1.properties"
  printf 'listeners=http://127.0.0.1:%s\nrest.advertised.host.name=127.0.0.1\nrest.advertised.port=%s\n' "$2" "$2" \
    >> "$WORK/worker$1.properties"
  KAFKA_TOOL_LOGLEVEL=INFO "$KAFKA_KIT/tool.sh" connect-distributed "$WORK/worker$1.properties" \
    >"$WORK/worker$1.out" 2>"$WORK/worker$1.log" &
  WORKER_PID=$!
  URL="http://127.0.0.1:$2"
  wait_for "worker $1's REST API to report healthy (GET /health)" healthy "$WORK/worker$1.log"
}
# healthy LOG: GET /health says healthy. A worker whose herder failed (the broker refused its
# topics, say) takes ~45 s more to exit: its log tells at once.
healthy() {
  if grep -qs "Uncaught exception in herder work thread" "$1"; then
    fail "the worker's herder failed: $(grep -m1 -E '^[A-Za-z.]*(Exception|Error): ' "$1")"
  fi
  curl -sf --max-time 5 "$URL/health" 2>/dev/null | grep -q healthy
}
rest() { curl -sS --max-time 30 "$@" 2>>"$WORK/tool.err"; }
start_worker 1 "$PORT1"
pass "worker 1 (pid $WORKER_PID, group $GROUP) healthy at $URL"

# What Connect needs of its topics, as the broker reports it.
for t in "$CONFIG_TOPIC" "$OFFSET_TOPIC" "$STATUS_TOPIC"; do
  policy=$(tool kafka-configs --bootstrap-server "$B" --entity-type topics --entity-name "$t" --describe --all \
    | sed -n 's/^ *cleanup.policy=\([^ ]*\) .*/\1/p')
  [[ "$policy" == compact ]] || fail "$t has cleanup.policy='$policy', not compact"
done
parts=$(topics --describe --topic "$CONFIG_TOPIC" | grep -c "Partition: ") || true
[[ "$parts" == 1 ]] || fail "$CONFIG_TOPIC has $parts partitions, not 1"
pass "kafka-configs --describe --all: cleanup.policy=compact on the three internal topics ($CREATE created them); $CONFIG_TOPIC has one partition"

# put_connector NAME JSON: PUT /connectors/NAME/config, retried while the worker rebalances (409).
put_connector() {
  local code start=$SECONDS
  while :; do
    code=$(rest -o "$WORK/put.out" -w '%{http_code}' -X PUT -H 'Content-Type: application/json' \
      --data "$2" "$URL/connectors/$1/config") || code=000
    [[ "$code" == 200 || "$code" == 201 ]] && return 0
    (( SECONDS - start > TIMEOUT )) && fail "PUT /connectors/$1/config: HTTP $code $(cat "$WORK/put.out" 2>/dev/null)"
    sleep 1
  done
}
: > "$INPUT"
put_connector "$SRC" "{\"connector.class\":\"org.apache.kafka.connect.file.FileStreamSourceConnector\",\"tasks.max\":\"1\",\"file\":\"$INPUT\",\"topic\":\"$DATA_TOPIC\"}"
put_connector "$SINK" "{\"connector.class\":\"org.apache.kafka.connect.file.FileStreamSinkConnector\",\"tasks.max\":\"1\",\"file\":\"$OUTPUT\",\"topics\":\"$DATA_TOPIC\"}"
# running NAME PORT: the connector and its one task are RUNNING on the worker at PORT.
running() {
  rest "$URL/connectors/$1/status" > "$WORK/status.json" || return 1
  python3 - "$WORK/status.json" "127.0.0.1:$2" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
t = s.get("tasks", [])
ok = s.get("connector", {}).get("state") == "RUNNING" and len(t) == 1 \
    and t[0].get("state") == "RUNNING" and t[0].get("worker_id") == sys.argv[2]
sys.exit(0 if ok else 1)
EOF
}
wait_for "$SRC and $SINK to run on worker 1" eval "running '$SRC' '$PORT1' && running '$SINK' '$PORT1'"
pass "FileStreamSource ($SRC) and FileStreamSink ($SINK) created through the REST API and RUNNING"

# append FROM TO: lines FROM..TO, ASCII (the source's position counts characters, its seek bytes).
append() {
  seq "$1" "$2" | awk '{ printf "line %06d %s\n", $1, substr("abcdefghijklmnopqrstuvwxyz0123456789", 1, 1 + $1 % 36) }' >> "$INPUT"
}
lines() { if [[ -f "$OUTPUT" ]]; then wc -l < "$OUTPUT"; else echo 0; fi; }
# output_has N: the output holds N lines (more fails at once: nothing repeats before the crash).
output_has() {
  local n; n=$(lines); STATE="the output holds $n lines"
  (( n > $1 )) && fail "the output holds $n lines, more than the $1 sent"
  (( n == $1 ))
}
output_reached() { local n; n=$(lines); STATE="the output holds $n lines"; (( n >= $1 )); }
topic_end() { tool kafka-get-offsets --bootstrap-server "$B" --topic "$DATA_TOPIC" --time latest | awk -F: '{ print $3 }'; }
# committed: Connect's committed offsets as the broker has them: the source's position equals
# the input's size, the sink's consumer offset the number of lines sent.
committed() {
  local pos off
  pos=$(rest "$URL/connectors/$SRC/offsets" | sed -n 's/.*"position":\([0-9]*\).*/\1/p')
  off=$(rest "$URL/connectors/$SINK/offsets" | sed -n 's/.*"kafka_offset":\([0-9]*\).*/\1/p')
  STATE="source position ${pos:-none} of $(stat -c %s "$INPUT") bytes, sink offset ${off:-none} of $1"
  [[ "$pos" == "$(stat -c %s "$INPUT")" && "$off" == "$1" ]]
}
append 1 "$FIRST"
wait_for "the output to hold $FIRST lines" output_has "$FIRST"
pass "the output holds $FIRST lines"
wait_for "Connect to commit both connectors' offsets" committed "$FIRST"
pass "offsets committed: $STATE"

kill -9 "$WORKER_PID"; wait "$WORKER_PID" 2>/dev/null || true
pass "worker 1 killed with kill -9"
start_worker 2 "$PORT2"
pass "worker 2 (pid $WORKER_PID) healthy at $URL"
listed=$(rest "$URL/connectors")
[[ "$listed" == *"\"$SRC\""* && "$listed" == *"\"$SINK\""* ]] || fail "worker 2 lists $listed, not both connectors"
wait_for "$SRC and $SINK to run on worker 2" eval "running '$SRC' '$PORT2' && running '$SINK' '$PORT2'"
pass "worker 2 read both connectors back from $CONFIG_TOPIC and runs their tasks"
if [[ -n "${MID_RUN_HOOK:-}" ]]; then
  if [[ "$MID_RUN_HOOK" == *$'\n'* ]]; then echo "running MID_RUN_HOOK"; else echo "running MID_RUN_HOOK: $MID_RUN_HOOK"; fi
  SPATE_BOOTSTRAP="$B" CONNECT_URL="$URL" CONNECT_PID="$WORKER_PID" CONNECT_DATA_TOPIC="$DATA_TOPIC" \
    CONNECT_CONFIG_TOPIC="$CONFIG_TOPIC" CONNECT_OFFSET_TOPIC="$OFFSET_TOPIC" CONNECT_STATUS_TOPIC="$STATUS_TOPIC" \
    CONNECT_SINK_GROUP="connect-$SINK" CONNECT_HOOK_DUPLICATES="$WORK/hook-duplicates" \
    timeout "$TIMEOUT" bash -c "$MID_RUN_HOOK" || fail "MID_RUN_HOOK failed (exit $?)"
  pass "MID_RUN_HOOK done"
  # A hook may name repeats its fault allows: "COUNT why" in $CONNECT_HOOK_DUPLICATES.
  if [[ -s "$WORK/hook-duplicates" ]]; then
    read -r allowed why < "$WORK/hook-duplicates"
    (( allowed > MAX_DUP )) && MAX_DUP=$allowed
    echo "note: up to $allowed repeated lines allowed: $why"
  fi
fi

append "$((FIRST + 1))" "$TOTAL"
wait_for "the output to hold $TOTAL lines" output_reached "$TOTAL"
wait_for "Connect to commit both connectors' offsets" eval 'committed "$(topic_end)"'
pass "the output holds $(lines) lines; offsets committed: $STATE"

# The checks: the topic and the output each hold every input line once, in the input's order;
# a line seen before counts as a repeat, anything else fails.
end=$(topic_end)
awk -v max="$MAX_DUP" -v end="$end" '
  NR == FNR { want[++n] = $0; next }
  ($0 in seen) { dup++; next }
  i < n && $0 == want[i + 1] { seen[$0] = 1; i++; next }
  { bad++; if (bad <= 5) printf "unexpected line %d of the output: %s (expected %s)\n", FNR, $0, want[i + 1] }
  END {
    printf "output: %d lines, %d of the %d input lines in order, %d repeated, %d unexpected; topic end offset %d\n", \
      FNR, i, n, dup, bad, end
    exit !(bad == 0 && i == n && dup <= max && end <= n + max)
  }' "$INPUT" "$OUTPUT" > "$WORK/check.out" || { cat "$WORK/check.out"; fail "the output is not the input, each line once"; }
cat "$WORK/check.out"
if [[ "$MAX_DUP" == 0 ]]; then
  cmp -s "$INPUT" "$OUTPUT" || fail "the output differs from the input"
  [[ "$end" == "$TOTAL" ]] || fail "$DATA_TOPIC holds $end records, not $TOTAL"
fi
pass "the output holds the $TOTAL input lines in order, $( ((MAX_DUP)) && echo "at most $MAX_DUP repeated" || echo "each exactly once"); $DATA_TOPIC holds $end records"

kill -TERM "$WORKER_PID"
start=$SECONDS
while kill -0 "$WORKER_PID" 2>/dev/null && (( SECONDS - start < 60 )); do sleep 0.5; done
kill -0 "$WORKER_PID" 2>/dev/null && fail "worker 2 did not stop within 60 s of SIGTERM"
wait "$WORKER_PID" 2>/dev/null || true
WORKER_PID=""
pass "worker 2 stopped (SIGTERM)"
echo "connect e2e: all checks passed ($TOTAL lines, $((SECONDS - T0)) s)"
