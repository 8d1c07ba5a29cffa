#!/usr/bin/env bash
# KIP-932 share groups on a throw-away 3-node spate cluster, with Apache Kafka's own Java
# clients (scripts/share/ShareWorker.java: KafkaShareConsumer, explicit acknowledgement):
#   1. topic share-work, 1 partition, replication factor 3; share group share-workers. The
#      members start before anything is produced, so the group starts at the (empty) log's end
#      without any group config: the script waits until kafka-share-groups --describe shows
#      the share-partition's start offset (its state is initialized on the first fetch);
#   2. a member in 'hold' mode takes the first records and is killed (kill -9) while holding
#      their locks; three members in 'work' mode accept records as they are produced
#      (ConsoleProducer, acks=all, in paced chunks);
#   3. once a third of the records are accepted, production pauses and the node that is the
#      SHARE COORDINATOR of the share-partition is killed (kill -9): the leader of partition
#      Utils.abs("share-workers:<topicId>:0".hashCode()) % PartitionCount of
#      __share_group_state (scripts/share/share_cluster_probe.py computes it), cross-checked
#      with FindCoordinator (key type 2) where the broker answers it; then the rest is produced;
#   4. every record is accepted (nothing lost), none twice (acceptances are printed only after
#      commitSync confirms them), the held records came back with a delivery count of 2+,
#      kafka-share-groups --describe shows the start offset past every record and --list shows
#      the group;
#   5. the Empty group's offsets are reset to the earliest (--reset-offsets), then deleted
#      (--delete-offsets), then the group itself (--delete).
#   scripts/share-groups-cluster-e2e.sh     (target/debug/spate; SPATE_BIN overrides)
# RECORDS (default 3000, at least 600) sets how many records are produced.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
PROBE="$ROOT/scripts/share/share_cluster_probe.py"
# A short lock so the killed member's records come back quickly; every node inherits it.
if [[ -z "${SPATE_NODE_PIDS:-}" ]]; then
  export SPATE_GROUP_SHARE_RECORD_LOCK_DURATION_MS=5000
  # The killed member leaves the group when its session times out: 10 s rather than 45, so
  # the group is Empty soon after the others close and its offsets can be reset.
  export SPATE_GROUP_SHARE_SESSION_TIMEOUT_MS=10000
  exec "$ROOT/scripts/with-spate-cluster.sh" -- "$0" "$@"
fi
"$KAFKA_KIT/fetch.sh" >/dev/null
B="$SPATE_BOOTSTRAP"
RECORDS="${RECORDS:-3000}"
if ! [[ "$RECORDS" =~ ^[0-9]+$ ]] || (( RECORDS < 600 )); then echo "RECORDS must be a number of at least 600" >&2; exit 2; fi
TOPIC=share-work
GROUP=share-workers
HOLD=200                  # produced first, for the member that holds them
THIRD=$((RECORDS / 3))    # production pauses after v-THIRD until the coordinator is killed
NODES_DIR="$(dirname "$(dirname "$SPATE_LOG")")"   # with-spate-cluster.sh: NODES_DIR/nodeN/spate.log
WORK="$(mktemp -d)"
PIDS=()
declare -A WPID=() AT_KILL=()
cleanup() {
  touch "$WORK/stop" "$WORK/killed" 2>/dev/null || true
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

T0=$SECONDS
fail() {
  echo "FAIL: $*" >&2
  {
    for f in "$WORK"/*.err; do
      [[ -s "$f" ]] && { echo "--- ${f##*/} (tail, without stack frames)"; grep -v '^\s*at ' "$f" | tail -n 8; }
    done
    for n in 1 2 3; do
      log="$NODES_DIR/node$n/spate.log"
      [[ -f "$log" ]] || continue
      echo "--- node $n log: last warnings and errors (but openraft's about a killed peer)"
      sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E '^\S+ +(WARN|ERROR) ' | grep -v ' openraft::' | tail -n 10 || true
      echo "--- node $n log (tail, without the rebuilds of empty coordinator partitions)"
      sed 's/\x1b\[[0-9;]*m//g' "$log" \
        | grep -v -E 'rebuilt from the replicated log .*(groups=0 records_to=0|share_partitions=0)$' | tail -n 15 || true
    done
  } >&2
  exit 1
}
pass() { echo "ok: $* [$((SECONDS - T0)) s]"; }
tool() { timeout 90 "$KAFKA_KIT/tool.sh" "$@" 2>>"$WORK/tool.err"; }
shares() { tool kafka-share-groups --bootstrap-server "$B" "$@"; }
worker() { # MODE NAME
  "$KAFKA_KIT/tool.sh" class "$ROOT/scripts/share/ShareWorker.java" "$1" "$B" "$TOPIC" "$GROUP" "$2" "$WORK/stop" \
    >"$WORK/$2.out" 2>"$WORK/$2.err" &
  PIDS+=($!)
  WPID[$2]=$!
}
alive() { # NAME...: fails when a member's JVM is gone
  local name
  for name in "$@"; do
    kill -0 "${WPID[$name]}" 2>/dev/null || fail "member '$name' exited: $(grep -v '^\s*at ' "$WORK/$name.err" | tail -n 3)"
  done
}
# The start offset of share-work partition 0 in the group ('-' before its state exists).
start_offset() {
  shares --describe --group "$GROUP" 2>/dev/null | awk -v g="$GROUP" -v t="$TOPIC" '$1==g && $2==t && $3==0 {print $4}' || true
}
# The leader of PARTITION in kafka-topics --describe output.
leader_of() { # DESCRIBE PARTITION
  awk -v p="$2" '{ pp = ""; l = ""
    for (i = 1; i < NF; i++) { if ($i == "Partition:") pp = $(i + 1); if ($i == "Leader:") l = $(i + 1) }
    if (pp == p) { print l; exit } }' <<<"$1"
}
describe_topic() { tool kafka-topics --bootstrap-server "$B" --describe --topic "$1" || true; }
counts() { # accepted per member [and since the kill]
  local w sep="" n
  for w in w1 w2 w3; do
    n="$(grep -c '^accepted' "$WORK/$w.out" || true)"
    printf '%s%s: %s' "$sep" "$w" "$n"
    [[ -n "${AT_KILL[$w]:-}" ]] && printf ' (%s after the kill)' "$((n - AT_KILL[$w]))"
    sep=", "
  done
}
accepted() { cat "$WORK"/w1.out "$WORK"/w2.out "$WORK"/w3.out 2>/dev/null | awk '$1=="accepted"{print $2}'; }
naccepted() { accepted | sort -u | wc -l; }
produce() { # FIRST LAST, in the foreground
  seq "$1" "$2" | sed 's/^/v-/' | timeout 120 "$KAFKA_KIT/tool.sh" class org.apache.kafka.tools.ConsoleProducer \
    --bootstrap-server "$B" --topic "$TOPIC" >/dev/null 2>>"$WORK/producer.err" || fail "produce v-$1..v-$2 to $TOPIC"
}

# 1. The topic, and the group's share-partition initialized by its first member.
tool kafka-topics --bootstrap-server "$B" --create --topic "$TOPIC" --partitions 1 --replication-factor 3 >/dev/null \
  || fail "kafka-topics --create $TOPIC --replication-factor 3"
desc="$(describe_topic "$TOPIC")"
topic_id="$(sed -n 's/.*TopicId: *\([^[:space:]]*\).*/\1/p' <<<"$desc" | head -n 1)"
replicas="$(awk '{ for (i = 1; i < NF; i++) if ($i == "Replicas:") print $(i + 1) }' <<<"$desc")"
[[ -n "$topic_id" && "$(tr ',' '\n' <<<"$replicas" | grep -c .)" == 3 ]] \
  || { echo "$desc" >&2; fail "kafka-topics --describe $TOPIC: no topic id or not 3 replicas"; }
pass "topic $TOPIC: 1 partition, replicas $replicas, leader node $(leader_of "$desc" 0), topic id $topic_id"

worker hold hog
deadline=$((SECONDS + 150))
so=""
while :; do
  alive hog
  so="$(start_offset)"
  [[ -n "$so" && "$so" != "-" ]] && break
  (( SECONDS < deadline )) || fail "kafka-share-groups --describe shows no start offset for $TOPIC 0 (got '${so}') 150 s after the first member started"
  sleep 1
done
[[ "$so" == 0 ]] || fail "the share-partition starts at $so, not 0 (the topic is empty)"
pass "the first member initialized the share-partition: kafka-share-groups --describe shows start offset 0 for $TOPIC 0"

# 2. The holding member takes the first records; three working members join; the holder dies.
produce 1 "$HOLD"
deadline=$((SECONDS + 90))
until grep -q '^holding' "$WORK/hog.out" 2>/dev/null; do
  alive hog
  (( SECONDS < deadline )) || fail "the holding member got no records within 90 s"
  sleep 1
done
held=$(grep -c '^held ' "$WORK/hog.out")
pass "member 'hog' holds $held records under acquisition locks"
worker work w1
worker work w2
worker work w3
members() { shares --describe --group "$GROUP" --members 2>/dev/null | awk -v g="$GROUP" '$1==g' | wc -l || true; }
deadline=$((SECONDS + 120))
until [[ "$(members)" -ge 4 ]]; do
  alive hog w1 w2 w3
  (( SECONDS < deadline )) || fail "the four members never all showed in kafka-share-groups --describe --members"
  sleep 1
done
pass "four KafkaShareConsumer members share the one partition"
kill -9 "${WPID[hog]}"
wait "${WPID[hog]}" 2>/dev/null || true
pass "member 'hog' killed (kill -9) while holding its $held locks"

# The rest is produced (paced, acks=all) while the members consume; it pauses after v-THIRD
# until the share coordinator is dead.
gen() {
  local i
  for ((i = HOLD + 1; i <= RECORDS; i++)); do
    echo "v-$i"
    if (( i == THIRD )); then
      for _ in $(seq 1 1500); do [[ -e "$WORK/killed" || ! -d "$WORK" ]] && break; sleep 0.2; done
    fi
    if (( i % 100 == 0 )); then sleep 0.25; fi
  done
}
mkfifo "$WORK/feed"
gen >"$WORK/feed" &
GEN=$!; PIDS+=("$GEN")
"$KAFKA_KIT/tool.sh" class org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$B" --topic "$TOPIC" \
  <"$WORK/feed" >/dev/null 2>>"$WORK/producer.err" &
PROD=$!; PIDS+=("$PROD")
T_PRODUCE=$SECONDS

# 3. A third accepted: kill the share coordinator's node.
deadline=$((SECONDS + 180))
until (( $(naccepted) >= THIRD )); do
  alive w1 w2 w3
  (( SECONDS < deadline )) || fail "only $(naccepted) of the first $THIRD records accepted within 180 s"
  sleep 1
done
pass "v-1..v-$THIRD accepted ($(counts))"
key="$GROUP:$topic_id:0"
deadline=$((SECONDS + 60))
while :; do
  sdesc="$(describe_topic __share_group_state)"
  nparts="$(sed -n 's/.*PartitionCount: *\([0-9]*\).*/\1/p' <<<"$sdesc" | head -n 1)"
  [[ -n "$nparts" ]] && break
  (( SECONDS < deadline )) || fail "kafka-topics --describe does not show __share_group_state"
  sleep 1
done
spart="$(python3 "$PROBE" partition "$key" "$nparts")"
coord="$(leader_of "$sdesc" "$spart")"
[[ "$coord" =~ ^[0-9]+$ ]] || { echo "$sdesc" >&2; fail "__share_group_state partition $spart has no leader ('$coord')"; }
pid="$(tr ' ' '\n' <<<"$SPATE_NODE_PIDS" | awk -F= -v n="$coord" '$1 == n { print $2 }')"
[[ -n "$pid" ]] || fail "node $coord is not one of SPATE_NODE_PIDS ($SPATE_NODE_PIDS)"
fc="$(python3 "$PROBE" find-coordinator "$B" 2 "$key" 2>>"$WORK/tool.err" || echo "error -1 no answer")"
if [[ "$fc" =~ ^[0-9]+$ ]]; then
  [[ "$fc" == "$coord" ]] || fail "FindCoordinator(key type 2, $key) names node $fc, but the leader of __share_group_state partition $spart is node $coord"
  crosscheck="FindCoordinator (key type 2) names it too"
else
  crosscheck="FindCoordinator (key type 2) is not answered: $fc"
fi
data_leader="$(leader_of "$(describe_topic "$TOPIC")" 0)"
group_coord="$(shares --describe --group "$GROUP" --state | awk -v g="$GROUP" '$1==g { gsub(/[()]/, "", $3); print $3 }' || true)"
also=""
[[ "$data_leader" == "$coord" ]] && also+="; it also leads $TOPIC 0 (the share-partition's leader)"
[[ "$group_coord" == "$coord" ]] && also+="; it also coordinates the group"
for w in w1 w2 w3; do AT_KILL[$w]="$(grep -c '^accepted' "$WORK/$w.out" || true)"; done
kill -9 "$pid"
touch "$WORK/killed"
T_KILL=$SECONDS
pass "killed node $coord (kill -9, pid $pid) with $(naccepted) of $RECORDS records accepted: the share coordinator of $key, leader of __share_group_state partition $spart of $nparts; $crosscheck (share-partition leader: node $data_leader, group coordinator: node ${group_coord:-?})$also"
deadline=$((SECONDS + 90))
while :; do
  now="$(leader_of "$(describe_topic __share_group_state)" "$spart")"
  [[ "$now" =~ ^[0-9]+$ && "$now" != "$coord" ]] && break
  (( SECONDS < deadline )) || fail "__share_group_state partition $spart has no new leader 90 s after the kill (leader '$now')"
  sleep 1
done
pass "__share_group_state partition $spart is led by node $now $((SECONDS - T_KILL)) s after the kill"

# 4. Everything produced, everything accepted once.
deadline=$((SECONDS + 300))
while kill -0 "$PROD" 2>/dev/null; do
  (( SECONDS < deadline )) || fail "the producer did not finish within 300 s"
  sleep 1
done
rc=0; wait "$PROD" || rc=$?
(( rc == 0 )) || fail "ConsoleProducer exited with $rc"
grep -q 'Error when sending message' "$WORK/producer.err" \
  && fail "ConsoleProducer could not write every record: $(grep -m 1 'Error when sending message' "$WORK/producer.err")"
T_PRODUCED=$SECONDS
end="$(tool kafka-get-offsets --bootstrap-server "$B" --topic "$TOPIC" | awk -F: -v t="$TOPIC" '$1==t && $2==0 {print $3}' || true)"
[[ "$end" == "$RECORDS" ]] || fail "the end offset of $TOPIC 0 is '$end', not $RECORDS: the log does not hold each produced record once"
pass "v-$((HOLD + 1))..v-$RECORDS produced (acks=all) in $((T_PRODUCED - T_PRODUCE)) s, the last $((RECORDS - THIRD)) after the kill; the end offset of $TOPIC 0 is $RECORDS"
deadline=$((SECONDS + 180))
until (( $(naccepted) >= RECORDS )); do
  alive w1 w2 w3
  (( SECONDS < deadline )) || break
  sleep 1
done
T_DONE=$SECONDS
touch "$WORK/stop"
seq 1 "$RECORDS" | sed 's/^/v-/' | sort >"$WORK/produced"
accepted | sort -u >"$WORK/accepted"
missing=$(comm -23 "$WORK/produced" "$WORK/accepted" | wc -l)
stray=$(comm -13 "$WORK/produced" "$WORK/accepted" | wc -l)
(( missing == 0 )) || fail "nothing lost: $missing of $RECORDS records never accepted within 180 s of the last produce (first: $(comm -23 "$WORK/produced" "$WORK/accepted" | sort -t- -k2n | head -n 5 | xargs))"
(( stray == 0 )) || fail "$stray accepted values were never produced"
pass "nothing lost: all $RECORDS records accepted, $((T_DONE - T_KILL)) s after the kill, $((T_DONE - T_PRODUCED)) s after the last was produced"
dups="$(accepted | sort | uniq -d)"
if [[ -n "$dups" ]]; then
  in_topic="$(tool kafka-console-consumer --bootstrap-server "$B" --topic "$TOPIC" --from-beginning --timeout-ms 15000 \
    | sort | uniq -d | wc -l || true)"
  fail "$(wc -l <<<"$dups") records accepted more than once (e.g. $(head -n 5 <<<"$dups" | xargs); $(grep -h -w -F "$(head -n 1 <<<"$dups")" "$WORK"/w*.out | xargs)); the topic itself holds $in_topic values more than once"
fi
redelivered_all=$(awk '$1=="accepted" && $3>=2' "$WORK"/w*.out | wc -l)
failed_commits=$(cat "$WORK"/w*.err | grep -c 'commitSync failed' || true)
pass "nothing accepted twice ($(counts); $redelivered_all accepted on a redelivery, $failed_commits commitSync calls failed and were not counted)"
grep '^held ' "$WORK/hog.out" | awk '{print $2}' | sort >"$WORK/held"
redelivered=$(awk '$1=="accepted" && $3>=2 {print $2}' "$WORK"/w*.out | sort | comm -12 - "$WORK/held" | wc -l)
[[ "$redelivered" == "$held" ]] || fail "only $redelivered of the $held records the killed member held came back with a delivery count of 2+"
pass "the $held records the killed member held were redelivered (delivery count 2+) and accepted by the others"
# A member that had a share session with a node that died waits out its close timeout (30 s):
# Kafka 4.3's share consumer keeps that session to close and the node is gone from metadata
# (KAFKA-20736 tidies share sessions on leader change in 4.4).
T_STOP=$SECONDS
for w in w1 w2 w3; do
  deadline=$((SECONDS + 60))
  while kill -0 "${WPID[$w]}" 2>/dev/null; do
    (( SECONDS < deadline )) || fail "member $w did not stop within 60 s"
    sleep 0.5
  done
done
pass "the three members stopped and closed their consumers in $((SECONDS - T_STOP)) s"
deadline=$((SECONDS + 60))
while :; do
  so="$(start_offset)"
  [[ "$so" == "$RECORDS" ]] && break
  (( SECONDS < deadline )) || fail "kafka-share-groups --describe shows start offset '$so' for $TOPIC 0, not $RECORDS"
  sleep 1
done
pass "kafka-share-groups --describe: the start offset of $TOPIC 0 is $RECORDS, past every record"
shares --list | grep -qx "$GROUP" || fail "kafka-share-groups --list does not show $GROUP"
pass "kafka-share-groups --list shows $GROUP"
# Once the group is Empty (the killed member's session has timed out), its offsets are reset
# and deleted, then the group, through whichever node coordinates it (the share coordinators
# hold the state).
deadline=$((SECONDS + 60))
until [[ "$(members)" == 0 ]]; do
  (( SECONDS < deadline )) || fail "$GROUP still has $(members) member(s) 60 s after the others closed"
  sleep 1
done
pass "$GROUP is Empty: the killed member's session timed out"
shares --reset-offsets --group "$GROUP" --topic "$TOPIC" --to-earliest --execute >/dev/null \
  || fail "kafka-share-groups --reset-offsets --to-earliest"
so="$(start_offset)"
[[ "$so" == 0 ]] || fail "the start offset of $TOPIC 0 is '$so' after --reset-offsets --to-earliest, not 0"
pass "kafka-share-groups --reset-offsets --to-earliest: the start offset of $TOPIC 0 is 0"
shares --delete-offsets --group "$GROUP" --topic "$TOPIC" >/dev/null || fail "kafka-share-groups --delete-offsets"
so="$(start_offset)"
[[ "$so" == "-" || -z "$so" ]] || fail "$TOPIC 0 still has a start offset ('$so') after --delete-offsets"
pass "kafka-share-groups --delete-offsets forgot the share-partition state of $TOPIC"
shares --delete --group "$GROUP" >/dev/null || fail "kafka-share-groups --delete"
shares --list | grep -qx "$GROUP" && fail "$GROUP is still listed after --delete"
pass "kafka-share-groups --delete removed the Empty group"
