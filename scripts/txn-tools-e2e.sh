#!/usr/bin/env bash
# Transactions with Apache Kafka's own Java clients (scripts/txn/TxnClient.java) and its
# kafka-transactions tool (org.apache.kafka.tools.TransactionsCommand), on one 1-partition topic:
#   1. commit and abort: 6 transactions of 50 records, every other one aborted; read_committed
#      sees the 150 committed, read_uncommitted all 300; no transaction open (LSO = HWM).
#   2. zombie fencing: a producer whose transactional.id was initialized again by another gets
#      ProducerFencedException on its commit, and a fencing error on its next send; only the
#      last producer's records are visible to read_committed.
#   3. a hanging transaction: a producer begins a transaction, writes 10 records and never
#      commits; another transactional producer commits 5 records after it. The last stable
#      offset stays at the hanging transaction's first offset, so read_committed sees neither.
#      kafka-transactions list shows it Ongoing, describe shows its partition, describe-producers
#      shows its CurrentTransactionStartOffset, find-hanging does not call it hanging (the
#      coordinator knows it). The producer is killed (kill -9) and `kafka-transactions abort
#      --start-offset` writes the abort marker: the LSO moves to the high watermark,
#      read_committed sees the 5 records committed after it and none of the hanging ones, and
#      describe-producers shows no open transaction.
#   scripts/txn-tools-e2e.sh     against a throw-away spate (target/debug/spate; SPATE_BIN overrides)
#   SPATE_BOOTSTRAP=host:port scripts/txn-tools-e2e.sh     against a running broker (any Kafka)
# Env: TXN_SUFFIX (appended to the topic and transactional ids; when txn-tools already exists and
#   TXN_SUFFIX is unset, a -<epoch seconds> suffix is picked).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
[[ -n "${SPATE_BOOTSTRAP:-}" ]] || exec "$ROOT/scripts/with-spate.sh" -- "$0" "$@"
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
fail() {
  echo "FAIL: $*" >&2
  [[ -s "$WORK/tool.err" ]] && { echo "--- tools' stderr (last 20 lines)" >&2; tail -20 "$WORK/tool.err" >&2; }
  [[ -f "${SPATE_LOG:-}" ]] && { echo "--- spate log" >&2; tail -30 "$SPATE_LOG" >&2; }
  exit 1
}
pass() { echo "ok: $* [$((SECONDS - T0)) s]"; }
T0=$SECONDS
CLIENT=("$KAFKA_KIT/tool.sh" class "$ROOT/scripts/txn/TxnClient.java")
client() { timeout 180 "${CLIENT[@]}" "$@" 2>>"$WORK/tool.err"; }
txns() { timeout 120 "$KAFKA_KIT/tool.sh" kafka-transactions --bootstrap-server "$B" "$@" 2>>"$WORK/tool.err"; }
topics() { timeout 120 "$KAFKA_KIT/tool.sh" topics --bootstrap-server "$B" "$@" 2>>"$WORK/tool.err"; }
# "total=N tag=n ..." of partition 0 -> n for one tag (0 if absent).
tag_count() { tr ' ' '\n' <<<"$1" | awk -F= -v t="$2" '$1 == t { n = $2 } END { print n + 0 }'; }

SUFFIX="${TXN_SUFFIX:-}"
if [[ -z "${TXN_SUFFIX+set}" ]] && topics --describe --topic txn-tools >/dev/null 2>&1; then
  SUFFIX="-$(date +%s)"
  echo "txn-tools already exists on $B: this run uses the suffix $SUFFIX"
fi
T="txn-tools$SUFFIX"
topics --create --topic "$T" --partitions 1 >/dev/null || fail "create topic $T"
tv=$(timeout 120 "$KAFKA_KIT/tool.sh" kafka-features --bootstrap-server "$B" describe 2>/dev/null \
  | awk '$2 == "transaction.version" { for (i = 1; i <= NF; i++) if ($i == "FinalizedVersionLevel:") print $(i + 1) }') || true
pass "created $T on $B (finalized transaction.version: ${tv:-none})"

# 1. Commit and abort.
out=$(client rounds "$B" "$T" "$T-rounds" main 6 50) || fail "transactional producer: $out"
committed=$(client count "$B" "$T" read_committed) || fail "read_committed consumer"
uncommitted=$(client count "$B" "$T" read_uncommitted) || fail "read_uncommitted consumer"
[[ "$(tag_count "$committed" main-commit) $(tag_count "$committed" main-abort)" == "150 0" ]] \
  || fail "read_committed should see the 150 committed records and none aborted: $committed"
[[ "$(tag_count "$uncommitted" main-commit) $(tag_count "$uncommitted" main-abort)" == "150 150" ]] \
  || fail "read_uncommitted should see all 300 records: $uncommitted"
offs=$(client offsets "$B" "$T" 0) || fail "ListOffsets"
[[ "$offs" =~ ^hwm=([0-9]+)\ lso=([0-9]+)$ && "${BASH_REMATCH[1]}" == "${BASH_REMATCH[2]}" ]] \
  || fail "after committed and aborted transactions the LSO should equal the HWM: $offs"
pass "$out; read_committed: $committed; read_uncommitted: $uncommitted; $offs"

# 2. Zombie fencing.
out=$(client fence "$B" "$T" "$T-fence") || { echo "$out"; fail "zombie fencing"; }
echo "$out"
committed=$(client count "$B" "$T" read_committed) || fail "read_committed consumer"
uncommitted=$(client count "$B" "$T" read_uncommitted) || fail "read_uncommitted consumer"
[[ "$(tag_count "$committed" fencer) $(tag_count "$committed" zombie)" == "10 0" ]] \
  || fail "read_committed should see the 10 records of the last producer and no zombie's: $committed"
(( $(tag_count "$uncommitted" zombie) == 2 )) || fail "read_uncommitted should see the 2 aborted zombie records: $uncommitted"
pass "zombies fenced (ProducerFencedException on commit); read_committed: $committed; read_uncommitted: $uncommitted"

# 3. A hanging transaction, aborted with kafka-transactions.
HID="$T-hanging"
"${CLIENT[@]}" hang "$B" "$T" "$HID" 10 "$WORK/hang.ready" >"$WORK/hang.out" 2>"$WORK/hang.err" &
HANG=$!; PIDS+=("$HANG")
for _ in $(seq 1 240); do [[ -s "$WORK/hang.ready" ]] && break; kill -0 "$HANG" 2>/dev/null || break; sleep 0.5; done
[[ -s "$WORK/hang.ready" ]] || { cat "$WORK/hang.out" "$WORK/hang.err" >&2; fail "the hanging producer never wrote its records"; }
START=$(cat "$WORK/hang.ready")
pass "$(cat "$WORK/hang.out")"
out=$(client rounds "$B" "$T" "$T-after" after 1 5) || fail "transactional producer after the hanging one: $out"
offs=$(client offsets "$B" "$T" 0) || fail "ListOffsets"
[[ "$offs" =~ ^hwm=([0-9]+)\ lso=([0-9]+)$ && "${BASH_REMATCH[2]}" == "$START" && "${BASH_REMATCH[1]}" -gt "$START" ]] \
  || fail "the LSO should stay at the hanging transaction's first offset $START: $offs"
HWM_BEFORE="${BASH_REMATCH[1]}"
committed=$(client count "$B" "$T" read_committed) || fail "read_committed consumer"
[[ "$(tag_count "$committed" hang) $(tag_count "$committed" after-commit)" == "0 0" ]] \
  || fail "read_committed should stop at the LSO, before the hanging and the later records: $committed"
pass "5 records committed after it; the LSO stays at $START ($offs); read_committed: $committed"

list=$(txns list) || fail "kafka-transactions list"
echo "$list" | awk -v id="$HID" '$1 == id && $4 == "Ongoing" { ok = 1 } END { exit !ok }' \
  || { echo "$list"; fail "kafka-transactions list does not show $HID Ongoing"; }
pass "kafka-transactions list: $(echo "$list" | awk -v id="$HID" '$1 == id' | tr -s ' \t' ' ')"
desc=$(txns describe --transactional-id "$HID") || fail "kafka-transactions describe"
echo "$desc"
echo "$desc" | awk -v id="$HID" -v tp="$T-0" '$2 == id && $5 == "Ongoing" && $NF == tp { ok = 1 } END { exit !ok }' \
  || fail "kafka-transactions describe does not show $HID Ongoing on $T-0"
pass "kafka-transactions describe --transactional-id: Ongoing, partition $T-0"
prods=$(txns describe-producers --topic "$T" --partition 0) || fail "kafka-transactions describe-producers"
echo "$prods"
open=$(echo "$prods" | awk 'NR > 1 && $NF != "None"' | wc -l)
echo "$prods" | awk -v s="$START" 'NR > 1 && $NF == s { ok = 1 } END { exit !ok }' && [[ "$open" == 1 ]] \
  || fail "describe-producers should show one producer with CurrentTransactionStartOffset $START"
PRODUCER_ID=$(echo "$prods" | awk -v s="$START" 'NR > 1 && $NF == s { print $1 }')
pass "kafka-transactions describe-producers: producer $PRODUCER_ID has a transaction open from offset $START"

kill -9 "$HANG"; wait "$HANG" 2>/dev/null || true
pass "the hanging producer was killed (kill -9)"
# --max-transaction-timeout 0: every open transaction is a candidate, and the coordinator's
# description (Ongoing, this producer, this partition) must clear it.
hanging=$(txns find-hanging --topic "$T" --max-transaction-timeout 0) || fail "kafka-transactions find-hanging"
echo "$hanging"
echo "$hanging" | head -1 | grep -q "StartOffset" || fail "find-hanging printed no table"
echo "$hanging" | awk -v p="$PRODUCER_ID" 'NR > 1 && $3 == p { bad = 1 } END { exit bad }' \
  || fail "find-hanging calls the transaction hanging though its coordinator has it Ongoing"
pass "kafka-transactions find-hanging: nothing hanging (the coordinator knows the open transaction)"

txns abort --topic "$T" --partition 0 --start-offset "$START" || fail "kafka-transactions abort"
for _ in $(seq 1 60); do
  offs=$(client offsets "$B" "$T" 0) || fail "ListOffsets"
  [[ "$offs" =~ ^hwm=([0-9]+)\ lso=([0-9]+)$ && "${BASH_REMATCH[1]}" == "${BASH_REMATCH[2]}" ]] && break
  sleep 1
done
[[ "${BASH_REMATCH[1]}" == "${BASH_REMATCH[2]}" && "${BASH_REMATCH[1]}" -gt "$HWM_BEFORE" ]] \
  || fail "after the abort the LSO should move to the HWM, past the abort marker: $offs (HWM before: $HWM_BEFORE)"
pass "kafka-transactions abort --start-offset $START: the LSO moved past the hanging transaction ($offs)"
committed=$(client count "$B" "$T" read_committed) || fail "read_committed consumer"
uncommitted=$(client count "$B" "$T" read_uncommitted) || fail "read_uncommitted consumer"
[[ "$(tag_count "$committed" hang) $(tag_count "$committed" after-commit)" == "0 5" ]] \
  || fail "read_committed should see the 5 later records and none of the aborted hanging ones: $committed"
(( $(tag_count "$uncommitted" hang) == 10 )) || fail "read_uncommitted should still see the 10 aborted records: $uncommitted"
pass "read_committed: $committed; read_uncommitted: $uncommitted"
prods=$(txns describe-producers --topic "$T" --partition 0) || fail "kafka-transactions describe-producers"
echo "$prods" | awk 'NR > 1 && $NF != "None" { bad = 1 } END { exit bad }' \
  || { echo "$prods"; fail "describe-producers still shows an open transaction"; }
pass "kafka-transactions describe-producers: no open transaction left"
echo "txn tools e2e: all checks passed ($((SECONDS - T0)) s)"
