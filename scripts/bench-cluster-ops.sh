#!/usr/bin/env bash
# Cluster operations benchmark, same machine, same client, one after the other: Apache Kafka's
# 3-node KRaft cluster (scripts/kafka/start-cluster.sh: every node broker and controller) and a
# 3-node spate cluster (every node broker and voter), on loopback:
#   1. metadata propagation: for each N in PARTITION_COUNTS, CreateTopics of N partitions,
#      replication factor 3, until every node, asked on its own connection, answers Metadata
#      with all N partitions led (scripts/cluster_ops_probe.py propagate, polls every 20 ms);
#      then until every partition's leader answers ListOffsets for it (leaders_serve: a node
#      can be named leader in Metadata before it opened the partition), and when
#      CreateTopics was answered; all timed from CreateTopics sent;
#   2. idle CPU: with those topics and no traffic, each broker process's CPU time (utime +
#      stime in /proc/PID/stat) over IDLE_SECONDS, in percent of one core; measured before
#      any kill, so no node is catching up;
#   3. failover with those topics in place (scripts/failover_probe.py: kill -9 of a partition
#      leader until the first acks=all record after it is acknowledged), (a) of a node that is
#      not the active controller, (b) of the active controller (Kafka: LeaderId of
#      kafka-metadata-quorum describe --status, a combined broker+controller node; spate:
#      "controller" of GET /admin/cluster). The probe topic has one partition led by the node
#      to kill; the node is restarted and the cluster healthy (every partition led, full ISR,
#      on every node) before the next step. On loopback the ports of a killed node refuse
#      connections at once: spate fences such a node without waiting for its session timeout,
#      Kafka waits for broker.session.timeout.ms; a host that vanishes without refusing
#      (power loss, network partition) would take spate its session timeout too.
# Both run with their defaults, nothing shortened:
#   Kafka 4.3: broker.session.timeout.ms 9000, broker.heartbeat.interval.ms 2000,
#     controller.quorum.election.timeout.ms 1000, controller.quorum.fetch.timeout.ms 2000,
#     replica.lag.time.max.ms 30000 (start-cluster.sh adds min.insync.replicas 2).
#   spate: --broker-session-timeout-ms 9000, --broker-heartbeat-interval-ms 1000, quorum
#     heartbeat 250 ms and election timeout 1000-2000 ms, --replica-lag-time-max-ms 30000.
# Results in $OUT (default target/bench-cluster-ops/<date>); a table is printed at the end.
# Env: PARTITION_COUNTS ("10 3000"), IDLE_SECONDS (60), IDLE_SETTLE_SECONDS (30: quiet time
#      before sampling; Kafka's JVM still settles, at a few % per node, over its first tens
#      of seconds, see $OUT/kafka-idle.tsv), HEALTHY_TIMEOUT (600 s, also the bound of each
#      propagation probe), SPATE_BIN (default: builds target/release/spate),
#      BENCH_ONLY=kafka|spate.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
OUT="${OUT:-$ROOT/target/bench-cluster-ops/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
COUNTS="${PARTITION_COUNTS:-10 3000}"
IDLE="${IDLE_SECONDS:-60}"
SETTLE="${IDLE_SETTLE_SECONDS:-30}"
export PROBE_TIMEOUT="${HEALTHY_TIMEOUT:-600}"
if [[ -z "${SPATE_BIN:-}" && "${BENCH_ONLY:-}" != kafka ]]; then
  cargo build --release --bin spate --manifest-path "$ROOT/Cargo.toml"
  SPATE_BIN="$ROOT/target/release/spate"
fi
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka
"$KAFKA_KIT/fetch.sh" >/dev/null
probe() { python3 "$ROOT/scripts/cluster_ops_probe.py" "$@"; }
TCK="$(getconf CLK_TCK)"

KDIR="" SDIR="" SPIDS=()
# Everything started here stops on any exit: Kafka through its stop script (only the pids in
# its kafka.pid files), spate by SIGKILL (its data is thrown away, see with-spate-cluster.sh).
cleanup() {
  set +e
  [[ -n "$KDIR" ]] && kafka_down
  [[ -n "$SDIR" ]] && spate_down
}
trap cleanup EXIT
trap 'exit 130' INT TERM
keep_log() {  # keep_log NAME NODE LOG: a node's whole log (its start and the restart), compressed
  mkdir -p "$OUT/logs"
  [[ -f "$3" ]] && gzip -c "$3" > "$OUT/logs/$1-node-$2.log.gz"
  return 0
}

# --- Kafka: the kit's cluster; a killed node restarts with start-cluster.sh's settings.
KBASE=19092
kafka_up() {
  KDIR="$(mktemp -d /tmp/kafka-cluster-ops.XXXX)"
  KAFKA_CLUSTER_DIR="$KDIR" KAFKA_FRESH=1 KAFKA_PORT=$KBASE "$KAFKA_KIT/start-cluster.sh" > "$OUT/kafka-start.log"
  NODES="1=127.0.0.1:$KBASE 2=127.0.0.1:$((KBASE + 1)) 3=127.0.0.1:$((KBASE + 2))"
}
kafka_pid() { cat "$KDIR/node-$1/kafka.pid"; }
kafka_start() {
  local i=$1
  KAFKA_FRESH=0 KAFKA_WAIT=0 KAFKA_NODE_ID="$i" KAFKA_PORT=$((KBASE + i - 1)) \
    KAFKA_CONTROLLER_PORT=$((KBASE + 10000 + i - 1)) KAFKA_RF=3 KAFKA_CLUSTER_ID="$(cat "$KDIR/cluster.id")" \
    KAFKA_VOTERS="1@127.0.0.1:$((KBASE + 10000)),2@127.0.0.1:$((KBASE + 10001)),3@127.0.0.1:$((KBASE + 10002))" \
    KAFKA_DATA_DIR="$KDIR/node-$i" "$KAFKA_KIT/start.sh" >> "$OUT/kafka-start.log"
}
kafka_controller() {
  timeout 120 "$KAFKA_KIT/tool.sh" kafka-metadata-quorum --bootstrap-server "$(bootstrap)" describe --status \
    | awk '$1 == "LeaderId:" { print $2 }'
}
kafka_down() {
  local i
  for i in 1 2 3; do keep_log kafka "$i" "$KDIR/node-$i/logs/server.log"; done
  KAFKA_CLUSTER_DIR="$KDIR" "$KAFKA_KIT/stop-cluster.sh" >/dev/null 2>&1 || true
  rm -rf "$KDIR"; KDIR=""
}

# --- spate: three processes on fixed free ports, so that a restarted node keeps its addresses.
spate_up() {
  SDIR="$(mktemp -d /tmp/spate-cluster-ops.XXXX)"
  local ports i
  read -r -a ports < <(python3 "$ROOT/scripts/free-ports.py" 9)
  [[ ${#ports[@]} == 9 ]] || { echo "no free ports for the spate cluster" >&2; exit 1; }
  SKAFKA=("" "${ports[@]:0:3}") SHTTP=("" "${ports[@]:3:3}")
  SPEERS="1=127.0.0.1:${ports[6]},2=127.0.0.1:${ports[7]},3=127.0.0.1:${ports[8]}"
  NODES="1=127.0.0.1:${SKAFKA[1]} 2=127.0.0.1:${SKAFKA[2]} 3=127.0.0.1:${SKAFKA[3]}"
  for i in 1 2 3; do spate_start "$i"; done
  for i in 1 2 3; do spate_wait_ready "$i"; done
}
spate_start() {
  local i=$1
  "$SPATE_BIN" --node-id "$i" --cluster-peers "$SPEERS" --listen "127.0.0.1:${SKAFKA[i]}" \
    --http-listen "127.0.0.1:${SHTTP[i]}" --data-dir "$SDIR/node-$i" \
    >> "$SDIR/node-$i.out" 2>> "$SDIR/node-$i.log" &
  SPIDS[i]=$!
  # Not a job of this shell: bash would report each kill -9 of the failover probe.
  disown "$!"
}
spate_wait_ready() {
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:${SHTTP[$1]}/ready" >/dev/null && return 0
    alive "${SPIDS[$1]}" || break
    sleep 0.1
  done
  echo "spate node $1 not ready: $(curl -s "http://127.0.0.1:${SHTTP[$1]}/ready" || echo exited)" >&2
  tail -n 30 "$SDIR/node-$1.log" >&2
  return 1
}
spate_pid() { echo "${SPIDS[$1]}"; }
spate_controller() {  # asks the nodes in turn: one may be down
  local i
  for i in 1 2 3; do
    curl -sf --max-time 10 "http://127.0.0.1:${SHTTP[i]}/admin/cluster" \
      | python3 -c 'import json, sys; c = json.load(sys.stdin)["controller"]; print(c if c is not None else "")' 2>/dev/null \
      && return 0
  done
  return 1
}
spate_down() {
  local i p
  for p in "${SPIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${SPIDS[@]}"; do for _ in $(seq 1 100); do alive "$p" || break; sleep 0.1; done; done
  for i in 1 2 3; do keep_log spate "$i" "$SDIR/node-$i.log"; done
  rm -rf "$SDIR"; SDIR="" SPIDS=()
}

# --- The measurements, the same for both; NAME_up/_pid/_start/_controller differ.
bootstrap() { local b="" e; for e in $NODES; do b="$b,${e#*=}"; done; echo "${b#,}"; }
wait_node() {  # wait_node NAME I: a restarted node listens again (the health check does the rest)
  local port; port="$(echo "$NODES" | tr ' ' '\n' | sed -n "s/^$2=.*://p")"
  for _ in $(seq 1 1200); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0; sleep 0.1; done
  echo "$1 node $2 did not listen on $port within 120 s" >&2; return 1
}
healthy() { probe healthy $NODES >> "$OUT/$1-health.log"; }
record() { echo "$2 $3" >> "$OUT/$1.results"; echo "$1 $2: $3"; }
# Alive and not a zombie (a killed spate node stays one until this shell reaps it).
alive() { local s; s="$(awk '{ sub(/^.*\) /, ""); print $1 }' "/proc/$1/stat" 2>/dev/null)"; [[ -n "$s" && "$s" != Z ]]; }
ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }

pct() { awk -v d="$1" -v hz="$TCK" -v s="$2" 'BEGIN { printf "%.2f", d / hz / s * 100 }'; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }'; }
# Each node's CPU over IDLE s, and per window of at most 10 s in $OUT/NAME-idle.tsv (whether a
# node is still settling shows there).
idle_cpu() {
  local name=$1 i step elapsed=0 total=0 rss=0 line
  local -a pids first prev now
  for i in 1 2 3; do pids[i]="$("${name}_pid" "$i")"; first[i]="$(ticks "${pids[i]}")"; prev[i]=${first[i]}; done
  local start=$EPOCHREALTIME mark=$EPOCHREALTIME
  echo "end_s node1_pct node2_pct node3_pct" > "$OUT/$name-idle.tsv"
  while (( elapsed < IDLE )); do
    step=$(( IDLE - elapsed < 10 ? IDLE - elapsed : 10 ))
    sleep "$step"; elapsed=$(( elapsed + step ))
    local took; took="$(since "$mark")"; mark=$EPOCHREALTIME
    line="$elapsed"
    for i in 1 2 3; do now[i]="$(ticks "${pids[i]}")"; line="$line $(pct $(( now[i] - prev[i] )) "$took")"; prev[i]=${now[i]}; done
    echo "$line" >> "$OUT/$name-idle.tsv"
  done
  local all; all="$(since "$start")"
  for i in 1 2 3; do
    local p; p="$(pct $(( now[i] - first[i] )) "$all")"
    record "$name" "idle_cpu_pct_node$i" "$p"
    total="$(awk -v a="$total" -v b="$p" 'BEGIN { printf "%.2f", a + b }')"
    rss=$(( rss + $(awk '/^VmRSS:/ { print $2 }' "/proc/${pids[i]}/status") ))
  done
  record "$name" idle_cpu_pct_total "$total"
  record "$name" idle_rss_mib_total $(( rss / 1024 ))
}

suite() {
  local name=$1 n i k pid
  : > "$OUT/$name.results"
  healthy "$name"
  for n in $COUNTS; do
    echo "== $name: CreateTopics ops-p$n ($n partitions, RF 3) until every node has every leader"
    if probe propagate "ops-p$n" "$n" $NODES > "$OUT/$name-propagate-$n.txt" 2>&1; then
      cat "$OUT/$name-propagate-$n.txt"
      for k in propagation_ms leaders_serve_ms create_ms; do
        record "$name" "${k}_$n" "$(sed -n "s/.*\b$k=\([0-9]*\).*/\1/p" "$OUT/$name-propagate-$n.txt")"
      done
    else
      cat "$OUT/$name-propagate-$n.txt" >&2
      record "$name" "propagation_ms_$n" failed
    fi
    healthy "$name"
  done

  echo "== $name: idle CPU over $IDLE s (after $SETTLE s quiet), topics of $COUNTS partitions"
  sleep "$SETTLE"
  idle_cpu "$name"

  local controller victim kind
  for kind in leader controller; do
    controller="$("${name}_controller")"
    [[ "$controller" =~ ^[123]$ ]] || { echo "$name: no active controller found ('$controller')" >&2; return 1; }
    victim=$controller
    [[ $kind == leader ]] && victim=$(( controller % 3 + 1 ))
    echo "== $name: failover, kill -9 of node $victim ($kind; active controller: node $controller)"
    probe create "ops-failover-$kind" "$victim" $NODES
    local pidlist="" f="$OUT/$name-failover-$kind.txt"
    for i in 1 2 3; do pidlist="$pidlist $i=$("${name}_pid" "$i")"; done
    # shellcheck disable=SC2086
    if PROBE_PARTITION=0 timeout 300 python3 "$ROOT/scripts/failover_probe.py" "$(bootstrap)" "ops-failover-$kind" $pidlist > "$f" 2>&1; then
      grep "^failover_ms=" "$f"
      grep -q "killed_node=$victim " "$f" || echo "$name: the probe killed another node than $victim" >&2
      record "$name" "failover_${kind}_ms" "$(sed -n 's/.*failover_ms=\([0-9]*\).*/\1/p' "$f")"
    else
      cat "$f" >&2
      record "$name" "failover_${kind}_ms" failed
    fi
    # Back to three healthy nodes (the probe may have failed before its kill).
    pid="$("${name}_pid" "$victim")"
    if ! alive "$pid"; then
      "${name}_start" "$victim"
      wait_node "$name" "$victim"
    fi
    healthy "$name"
    echo "$name: node $victim back, cluster healthy ($(tail -n 1 "$OUT/$name-health.log"))"
  done
}

if [[ "${BENCH_ONLY:-}" != spate ]]; then
  echo "== kafka: starting the 3-node cluster"
  kafka_up
  suite kafka
  kafka_down
fi
if [[ "${BENCH_ONLY:-}" != kafka ]]; then
  echo "== spate: starting the 3-node cluster ($SPATE_BIN)"
  spate_up
  suite spate
  spate_down
fi

value() { awk -v k="$2" '$1 == k { print $2 }' "$OUT/$1.results" 2>/dev/null; }
{
  echo
  echo "== summary (3 nodes on loopback; propagation and failover in ms, idle CPU in % of one core)"
  printf "%-28s %12s %12s\n" metric kafka spate
  keys=()
  for n in $COUNTS; do keys+=("propagation_ms_$n" "leaders_serve_ms_$n" "create_ms_$n"); done
  keys+=(idle_cpu_pct_node1 idle_cpu_pct_node2 idle_cpu_pct_node3 idle_cpu_pct_total idle_rss_mib_total
         failover_leader_ms failover_controller_ms)
  for k in "${keys[@]}"; do
    printf "%-28s %12s %12s\n" "$k" "$(value kafka "$k")" "$(value spate "$k")"
  done
} | tee "$OUT/summary.txt"
echo "results in $OUT"
