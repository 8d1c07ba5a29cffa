#!/usr/bin/env bash
# Exactly-once Kafka Streams (processing.guarantee=exactly_once_v2, Kafka's own Streams library)
# through a crash. scripts/txn/StreamsEos.java sums txn-input's values per key (k0..k99) and
# writes every running sum to txn-output. An idempotent producer writes TXN_RECORDS records at
# TXN_RATE/s meanwhile; once the app has committed a quarter of them it is killed (kill -9, an
# open transaction left behind) and started again on the same state dir; once it has committed
# 60% MID_RUN_HOOK runs (if set); when the app's committed offsets reach the input's end and no
# transaction is open on txn-output, a read_committed checker verifies that every key's final
# sum is the sum of its inputs and that each input gave exactly one committed running sum
# (prefix sums, growing, none above the final): nothing lost, nothing counted twice.
#   scripts/txn-streams-e2e.sh     against a throw-away spate (target/debug/spate; SPATE_BIN overrides)
#   SPATE_BOOTSTRAP=host:port scripts/txn-streams-e2e.sh     against a running broker (any Kafka)
# Env: TXN_RECORDS (200000), TXN_RATE (5000 records/s), TXN_PARTITIONS (4: input and output),
#   TXN_SUFFIX (appended to the topic and app names; when txn-input already exists and TXN_SUFFIX
#   is unset, a -<epoch seconds> suffix is picked), TXN_TIMEOUT (300 s for each wait),
#   MID_RUN_HOOK: a bash command run once, in the foreground while the restarted app processes
#   (after 60% of the input is committed; the producer and the app go on meanwhile), bounded by
#   TXN_TIMEOUT; it sees SPATE_BOOTSTRAP, TXN_INPUT, TXN_OUTPUT, TXN_APP_ID and TXN_APP_PID, and
#   its failure fails the run. STREAMS_CHANGELOG_POLICY (compact, Streams' own): the state
#   store changelog's cleanup.policy; delete keeps everything (for brokers without compaction).
#   A cluster variant uses MID_RUN_HOOK to kill the transaction coordinator:
#     MID_RUN_HOOK='kill -9 $(coordinator_pid)' SPATE_BOOTSTRAP=... scripts/txn-streams-e2e.sh
#   or, against the kit's single Kafka node, a broker crash and restart (scripts/kafka/start.sh):
#     MID_RUN_HOOK='p=$(cat ~/.cache/spate-kafka/run/node-19192/kafka.pid); kill -9 $p;
#       while kill -0 $p 2>/dev/null; do sleep 0.2; done; KAFKA_PORT=19192 scripts/kafka/start.sh'
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
[[ -n "${SPATE_BOOTSTRAP:-}" ]] || exec "$ROOT/scripts/with-spate.sh" -- "$0" "$@"
"$KAFKA_KIT/fetch.sh" >/dev/null
export STREAMS_CHANGELOG_POLICY="${STREAMS_CHANGELOG_POLICY:-compact}"
B="$SPATE_BOOTSTRAP"
N="${TXN_RECORDS:-200000}"
RATE="${TXN_RATE:-5000}"
PARTS="${TXN_PARTITIONS:-4}"
TIMEOUT="${TXN_TIMEOUT:-300}"
WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/app*.out; do [[ -f "$f" ]] && { echo "--- $(basename "$f")" >&2; tail -20 "$f" >&2; }; done
  for f in "$WORK"/app*.err; do
    [[ -s "$f" ]] && { echo "--- $(basename "$f"): errors (last 12)" >&2; grep -E "ERROR|Exception|Caused by" "$f" | tail -12 >&2; }
  done
  [[ -f "${SPATE_LOG:-}" ]] && { echo "--- spate log" >&2; tail -30 "$SPATE_LOG" >&2; }
  exit 1
}
pass() { echo "ok: $* [$((SECONDS - T0)) s]"; }
T0=$SECONDS
EOS=("$KAFKA_KIT/tool.sh" class "$ROOT/scripts/txn/StreamsEos.java")
# In the foreground only: "$!" of a backgrounded function is a subshell, not the JVM, so the
# background runs below start tool.sh itself (it execs java: $! is the JVM to kill).
eos() { "${EOS[@]}" "$@"; }
topics() { timeout 120 "$KAFKA_KIT/tool.sh" topics --bootstrap-server "$B" "$@" 2>>"$WORK/tool.err"; }

SUFFIX="${TXN_SUFFIX:-}"
if [[ -z "${TXN_SUFFIX+set}" ]] && topics --describe --topic txn-input >/dev/null 2>&1; then
  SUFFIX="-$(date +%s)"
  echo "txn-input already exists on $B: this run uses the suffix $SUFFIX"
fi
INPUT="txn-input$SUFFIX"; OUTPUT="txn-output$SUFFIX"; APP="txn-streams-eos$SUFFIX"
for t in "$INPUT" "$OUTPUT"; do
  topics --create --topic "$t" --partitions "$PARTS" >/dev/null || { cat "$WORK/tool.err" >&2; fail "create topic $t"; }
done
pass "created $INPUT and $OUTPUT ($PARTS partitions each) on $B"

# The input arrives over ~N/RATE seconds, so the crash and the hook fall in mid-stream.
"${EOS[@]}" produce "$B" "$INPUT" "$N" "$RATE" >"$WORK/produce.out" 2>"$WORK/produce.err" &
PRODUCER=$!; PIDS+=("$PRODUCER")
start_app() {  # start_app K: instance K in the background; APP_PID is its JVM (tool.sh execs java)
  "${EOS[@]}" run "$B" "$APP" "$INPUT" "$OUTPUT" "$WORK/state" 900 >"$WORK/app$1.out" 2>"$WORK/app$1.err" &
  APP_PID=$!; PIDS+=("$APP_PID")
}
start_app 1
eos await "$B" "$APP" "$INPUT" "$((N / 4))" "$TIMEOUT" "$APP_PID" >"$WORK/await1.out" 2>>"$WORK/tool.err" \
  || fail "the app did not commit a quarter of the input: $(cat "$WORK/await1.out")"
kill -9 "$APP_PID"; wait "$APP_PID" 2>/dev/null || true
pass "app instance 1 committed >= $((N / 4)) input records, then was killed with kill -9 ($(cat "$WORK/await1.out"))"

start_app 2
eos await "$B" "$APP" "$INPUT" "$((N * 6 / 10))" "$TIMEOUT" "$APP_PID" >"$WORK/await2.out" 2>>"$WORK/tool.err" \
  || fail "the restarted app did not commit 60% of the input: $(cat "$WORK/await2.out")"
pass "app instance 2 (same state dir) took over and went on ($(cat "$WORK/await2.out"))"
if [[ -n "${MID_RUN_HOOK:-}" ]]; then
  echo "running MID_RUN_HOOK: $MID_RUN_HOOK"
  SPATE_BOOTSTRAP="$B" TXN_INPUT="$INPUT" TXN_OUTPUT="$OUTPUT" TXN_APP_ID="$APP" TXN_APP_PID="$APP_PID" \
    timeout "$TIMEOUT" bash -c "$MID_RUN_HOOK" || fail "MID_RUN_HOOK failed (exit $?)"
  pass "MID_RUN_HOOK done"
fi

wait "$PRODUCER" || fail "producer: $(cat "$WORK/produce.out") $(tail -5 "$WORK/produce.err")"
pass "$(cat "$WORK/produce.out")"
eos done "$B" "$APP" "$INPUT" "$OUTPUT" "$N" "$TIMEOUT" "$APP_PID" >"$WORK/done.out" 2>>"$WORK/tool.err" \
  || fail "the app did not finish the input: $(cat "$WORK/done.out")"
pass "the app consumed all input: $(cat "$WORK/done.out")"
kill -TERM "$APP_PID"
for _ in $(seq 1 120); do kill -0 "$APP_PID" 2>/dev/null || break; sleep 0.5; done
wait "$APP_PID" 2>/dev/null || fail "app instance 2 exited with an error"
grep -q "state RUNNING" "$WORK/app2.out" || fail "app instance 2 never reached RUNNING"
pass "app instance 2 stopped cleanly (SIGTERM)"

eos check "$B" "$INPUT" "$OUTPUT" "$N" >"$WORK/check.out" 2>>"$WORK/tool.err" || { cat "$WORK/check.out"; fail "checker"; }
cat "$WORK/check.out"
grep -q "(0 more read_uncommitted" "$WORK/check.out" \
  && echo "note: no aborted records on $OUTPUT: the kill -9 came between two transactions this time"
echo "txn streams e2e: all checks passed ($N records, $((SECONDS - T0)) s)"
