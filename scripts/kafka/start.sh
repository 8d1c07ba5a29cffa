#!/usr/bin/env bash
# Starts one Apache Kafka node (KRaft; broker and controller in one process unless
# KAFKA_EXTRA_PROPS says otherwise) on 127.0.0.1, for side-by-side benchmarks. Env, all optional:
#   KAFKA_PORT (19092), KAFKA_CONTROLLER_PORT (KAFKA_PORT + 10000), KAFKA_NODE_ID (1),
#   KAFKA_VOTERS (this node alone), KAFKA_CLUSTER_ID (new), KAFKA_RF (1: internal topics and
#   default replication factor), KAFKA_DATA_DIR ($SPATE_KAFKA_HOME/run/node-PORT: data/, logs/,
#   server.properties, kafka.pid), KAFKA_HEAP_OPTS (-Xms1g -Xmx1g), KAFKA_FRESH=1 (wipe first),
#   KAFKA_EXTRA_PROPS (key=value ..., appended), KAFKA_WAIT=0 (do not wait),
#   KAFKA_START_TIMEOUT (120 s).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CP="$(kit_classpath)"
PORT="${KAFKA_PORT:-19092}"
CPORT="${KAFKA_CONTROLLER_PORT:-$((PORT + 10000))}"
ID="${KAFKA_NODE_ID:-1}"
VOTERS="${KAFKA_VOTERS:-$ID@127.0.0.1:$CPORT}"
RF="${KAFKA_RF:-1}"
MIN_ISR=$(( RF > 1 ? 2 : 1 ))
DIR="$(realpath -m "${KAFKA_DATA_DIR:-$KAFKA_RUN/node-$PORT}")"
if [[ -f "$DIR/kafka.pid" ]] && kill -0 "$(cat "$DIR/kafka.pid")" 2>/dev/null; then
  kit_die "a Kafka already runs from $DIR (pid $(cat "$DIR/kafka.pid"))"
fi
for p in "$PORT" "$CPORT"; do kit_port_open "$p" && kit_die "port $p is in use"; done
[[ "${KAFKA_FRESH:-0}" == 1 ]] && rm -rf "$DIR"
mkdir -p "$DIR/data" "$DIR/logs"
{
  echo "process.roles=broker,controller"
  echo "node.id=$ID"
  echo "controller.quorum.voters=$VOTERS"
  echo "listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CPORT"
  echo "advertised.listeners=PLAINTEXT://127.0.0.1:$PORT"
  echo "inter.broker.listener.name=PLAINTEXT"
  echo "controller.listener.names=CONTROLLER"
  echo "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
  echo "log.dirs=$DIR/data"
  echo "num.partitions=1"
  echo "default.replication.factor=$RF"
  echo "min.insync.replicas=$MIN_ISR"
  echo "offsets.topic.replication.factor=$RF"
  echo "transaction.state.log.replication.factor=$RF"
  echo "transaction.state.log.min.isr=$MIN_ISR"
  echo "share.coordinator.state.topic.replication.factor=$RF"
  echo "share.coordinator.state.topic.min.isr=$MIN_ISR"
  echo "group.initial.rebalance.delay.ms=0"
  for kv in ${KAFKA_EXTRA_PROPS:-}; do echo "$kv"; done
} > "$DIR/server.properties"
# shellcheck disable=SC2046
if [[ ! -f "$DIR/data/meta.properties" ]]; then
  CID="${KAFKA_CLUSTER_ID:-$("$JAVA" -cp "$CP" $(kit_log_opts) kafka.tools.StorageTool random-uuid)}"
  "$JAVA" -cp "$CP" $(kit_log_opts "$DIR/logs") kafka.tools.StorageTool format -t "$CID" \
    -c "$DIR/server.properties" > "$DIR/logs/format.log" 2>&1 || { cat "$DIR/logs/format.log" >&2; exit 1; }
fi
# shellcheck disable=SC2046,SC2086
nohup "$JAVA" ${KAFKA_HEAP_OPTS:--Xms1g -Xmx1g} $KAFKA_JVM_PERF_OPTS $(kit_log_opts "$DIR/logs") \
  -Xlog:gc*:file="$DIR/logs/gc.log":time,tags:filecount=2,filesize=20M \
  -cp "$CP" kafka.Kafka "$DIR/server.properties" > "$DIR/logs/stdout.log" 2>&1 < /dev/null &
PID=$!
echo "$PID" > "$DIR/kafka.pid"
echo "kafka $KAFKA_VERSION node $ID: pid $PID, port $PORT, controller $CPORT, dir $DIR"
[[ "${KAFKA_WAIT:-1}" == 1 ]] || exit 0
kit_wait_ready "$PID" "$PORT" "$DIR" "${KAFKA_START_TIMEOUT:-120}"
