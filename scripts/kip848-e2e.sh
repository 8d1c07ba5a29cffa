#!/usr/bin/env bash
# KIP-848 consumer groups with Apache Kafka's own Java consumer (group.protocol=consumer):
# three console consumers join one group while a producer writes; one leaves (SIGTERM), one is
# killed (kill -9). Meanwhile GroupWatch (scripts/kip848/GroupWatch.java, Kafka's Admin client)
# polls the group every 100 ms and fails if a partition is ever in two members' assignments or
# a committed offset moves backwards. At the end every produced record has been consumed and
# the committed offsets equal the log end offsets. kafka-consumer-groups describes the group and
# lists it beside a classic group; an unknown assignor is refused (UNSUPPORTED_ASSIGNOR); a
# static member (group.instance.id) restarted within its session gets its partitions back.
#   scripts/kip848-e2e.sh     against a throw-away spate (target/debug/spate; SPATE_BIN overrides)
#   SPATE_BOOTSTRAP=host:port scripts/kip848-e2e.sh     against a running broker
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
# A session short enough that the killed member's partitions move on within the 60 s waits,
# long enough that a static member's JVM restarts within it on a busy 2-core machine (8 s was
# not: the restarted member came back after its session ended, and the group rebalanced).
[[ -n "${SPATE_BOOTSTRAP:-}" ]] || exec "$ROOT/scripts/with-spate.sh" \
  --spate-arg --group-consumer-session-timeout-ms --spate-arg 20000 -- "$0" "$@"
"$KAFKA_KIT/fetch.sh" >/dev/null
B="$SPATE_BOOTSTRAP"
WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; [[ -f "${SPATE_LOG:-}" ]] && { echo "--- spate log" >&2; tail -30 "$SPATE_LOG" >&2; }; exit 1; }
pass() { echo "ok: $*"; }
klass() { timeout 120 "$KAFKA_KIT/tool.sh" class "$@" 2>>"$WORK/tool.err"; }
groups() { klass org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "$B" "$@"; }
TOPIC=kip848-orders
GROUP=kip848-group
RECORDS=3000

# Starts a console consumer of $GROUP in the background (perf.sh execs java: $! is the JVM).
member() {
  "$KAFKA_KIT/tool.sh" class org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$B" \
    --topic "$TOPIC" --group "$GROUP" --from-beginning \
    --command-property group.protocol=consumer --command-property auto.commit.interval.ms=1000 \
    >"$WORK/member$1.out" 2>"$WORK/member$1.err" &
  PIDS+=($!)
}

"$KAFKA_KIT/tool.sh" topics --bootstrap-server "$B" --create --topic "$TOPIC" --partitions 6 >/dev/null 2>>"$WORK/tool.err" \
  || fail "create topic"

"$KAFKA_KIT/tool.sh" class "$ROOT/scripts/kip848/GroupWatch.java" watch "$B" "$GROUP" "$WORK/stop" \
  >"$WORK/watch.out" 2>"$WORK/watch.err" &
WATCH=$!
PIDS+=("$WATCH")

member 1; M1=$!
member 2; M2=$!
member 3; M3=$!

# The producer writes for ~15 s, so records keep coming while members come and go.
seq 1 "$RECORDS" | while read -r i; do echo "v-$i"; (( i % 100 == 0 )) && sleep 0.5; done \
  | "$KAFKA_KIT/tool.sh" class org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$B" --topic "$TOPIC" \
    >/dev/null 2>"$WORK/producer.err" &
PRODUCER=$!
PIDS+=("$PRODUCER")

members_now() { groups --describe --group "$GROUP" --members 2>/dev/null | awk -v g="$GROUP" '$1==g' | wc -l; }
for _ in $(seq 1 60); do [[ "$(members_now)" == 3 ]] && break; sleep 1; done
[[ "$(members_now)" == 3 ]] || fail "three members never joined"
desc=$(groups --describe --group "$GROUP" --members --verbose)
echo "$desc"
echo "$desc" | awk -v g="$GROUP" '$1==g && $6 > 0' | wc -l | grep -qx 3 || fail "members without a member epoch"
pass "three Java consumers (group.protocol=consumer) joined; kafka-consumer-groups shows epochs and assignments"
state=$(groups --describe --group "$GROUP" --state | awk -v g="$GROUP" '$1==g {print $4, $5, $6}')
grep -q "^uniform " <<<"$state" || fail "state line: $state"
pass "kafka-consumer-groups --state: assignor uniform ($state)"

kill -TERM "$M1"
wait "$M1" 2>/dev/null || true
pass "member 1 left (SIGTERM: leave heartbeat, epoch -1)"
sleep 3
kill -9 "$M2"
wait "$M2" 2>/dev/null || true
pass "member 2 killed (kill -9)"
wait "$PRODUCER" || fail "producer"
pass "producer wrote $RECORDS records"

# Once the killed member's session ends, member 3 owns every partition and commits up to the
# log end.
caught_up() {
  local d; d=$(groups --describe --group "$GROUP" 2>/dev/null) || return 1
  echo "$d" | awk -v g="$GROUP" -v t="$TOPIC" '$1==g && $2==t {n++; if ($4=="-" || $6!=0) bad=1} END {exit !(n==6 && !bad)}'
}
alone() { [[ "$(groups --describe --group "$GROUP" --members 2>/dev/null | awk -v g="$GROUP" '$1==g {n++; p=$5} END {print n, p}')" == "1 6" ]]; }
for _ in $(seq 1 60); do alone && caught_up && break; sleep 1; done
alone || { groups --describe --group "$GROUP" --members >&2; fail "member 3 does not own all 6 partitions alone"; }
pass "the remaining member owns all 6 partitions"
caught_up || { groups --describe --group "$GROUP" >&2; fail "committed offsets never reached the log end"; }
pass "committed offsets equal the log end offsets on all 6 partitions"

kill -TERM "$M3"
wait "$M3" 2>/dev/null || true
cat "$WORK"/member*.out | grep -o '^v-[0-9]*$' | sort -u > "$WORK/consumed"
seq 1 "$RECORDS" | sed 's/^/v-/' | sort > "$WORK/produced"
missing=$(comm -23 "$WORK/produced" "$WORK/consumed" | wc -l)
[[ "$missing" == 0 ]] || fail "$missing produced records were never consumed"
pass "every one of the $RECORDS records was consumed"

touch "$WORK/stop"
wait "$WATCH" || { cat "$WORK/watch.out" >&2; fail "GroupWatch saw a partition owned twice or an offset go back"; }
cat "$WORK/watch.out"
pass "no partition was ever owned twice and no committed offset went back ($(tail -1 "$WORK/watch.out"))"

# The group is Empty now and lists as a consumer group beside a classic one.
klass org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$B" --topic "$TOPIC" --group kip848-classic \
  --from-beginning --max-messages 10 --timeout-ms 30000 >/dev/null || fail "classic console consumer"
list=$(groups --list --type)
grep -Eq "^$GROUP +Consumer" <<<"$list" || { echo "$list"; fail "--list --type does not show $GROUP as Consumer"; }
grep -Eq "^kip848-classic +Classic" <<<"$list" || { echo "$list"; fail "--list --type does not show the classic group"; }
pass "kafka-consumer-groups --list --type: consumer and classic groups side by side"
all=$(groups --describe --all-groups)
for g in "$GROUP" kip848-classic; do
  echo "$all" | awk -v g="$g" -v t="$TOPIC" '$1==g && $2==t && $4 ~ /^[0-9]+$/ {n++} END {exit !(n>0)}' \
    || { echo "$all"; fail "--describe --all-groups shows no committed offsets of $g"; }
done
pass "kafka-consumer-groups --describe --all-groups describes both kinds"

# An assignor the coordinator does not have is UNSUPPORTED_ASSIGNOR, fatal to the consumer.
timeout 120 "$KAFKA_KIT/tool.sh" class org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$B" \
  --topic "$TOPIC" --group kip848-bad --command-property group.protocol=consumer \
  --command-property group.remote.assignor=no-such-assignor --timeout-ms 20000 >/dev/null 2>"$WORK/bad.err" || true
grep -q "UnsupportedAssignorException: ServerAssignor no-such-assignor is not supported" "$WORK/bad.err" \
  || { cat "$WORK/bad.err" >&2; fail "no UNSUPPORTED_ASSIGNOR error reported"; }
pass "an unknown server assignor is refused with UNSUPPORTED_ASSIGNOR"
# Static membership: a member with group.instance.id that closes (leave with epoch -2) and
# starts again within the session timeout gets its partitions back at the same member epoch,
# beside a second member that keeps its own.
static_member() {
  "$KAFKA_KIT/tool.sh" class org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$B" \
    --topic "$TOPIC" --group kip848-static --command-property group.protocol=consumer \
    --command-property group.instance.id="$1" >/dev/null 2>>"$WORK/static.err" &
  PIDS+=($!)
}
# "instance epoch assignment" of each static member (verbose columns: GROUP CONSUMER-ID
# GROUP-INSTANCE-ID HOST CLIENT-ID #PARTITIONS CURRENT-EPOCH CURRENT-ASSIGNMENT ...).
static_view() {
  groups --describe --group kip848-static --members --verbose 2>/dev/null \
    | awk '$1=="kip848-static" {print $3, $7, $8}' | sort
}
static_member host-a; SA=$!
static_member host-b
settled() { [[ "$(static_view | wc -l)" == 2 ]] && ! static_view | grep -q -- " -$"; }
for _ in $(seq 1 60); do settled && break; sleep 1; done
settled || { static_view >&2; fail "two static members never settled"; }
before=$(static_view)
kill -TERM "$SA"
wait "$SA" 2>/dev/null || true
static_member host-a
for _ in $(seq 1 60); do [[ "$(static_view)" == "$before" ]] && break; sleep 1; done
[[ "$(static_view)" == "$before" ]] || { echo "before: $before"; echo "after: $(static_view)"; fail "the restarted static member did not get its partitions back at the same epoch"; }
pass "a static member restarted within its session gets its partitions back, no rebalance: $(echo $before)"
echo "kip848 e2e: all checks passed"
