#!/usr/bin/env bash
# Starts three Kafka nodes on 127.0.0.1 as one KRaft cluster (each broker and controller; a
# static quorum of 3): client ports KAFKA_PORT..+2 (19092-19094), controllers +10000.
# Replication factor 3, min.insync.replicas 2. Env: KAFKA_PORT, KAFKA_CLUSTER_DIR
# ($SPATE_KAFKA_HOME/run/cluster-PORT), KAFKA_HEAP_OPTS per node, KAFKA_FRESH=1,
# KAFKA_EXTRA_PROPS, KAFKA_START_TIMEOUT (180 s).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CP="$(kit_classpath)"
BASE="${KAFKA_PORT:-19092}"
CDIR="$(realpath -m "${KAFKA_CLUSTER_DIR:-$KAFKA_RUN/cluster-$BASE}")"
[[ "${KAFKA_FRESH:-0}" == 1 ]] && rm -rf "$CDIR"
mkdir -p "$CDIR"
# shellcheck disable=SC2046
[[ -s "$CDIR/cluster.id" ]] || "$JAVA" -cp "$CP" $(kit_log_opts) kafka.tools.StorageTool random-uuid > "$CDIR/cluster.id"
VOTERS="1@127.0.0.1:$((BASE + 10000)),2@127.0.0.1:$((BASE + 10001)),3@127.0.0.1:$((BASE + 10002))"
for i in 1 2 3; do
  KAFKA_FRESH=0 KAFKA_WAIT=0 KAFKA_NODE_ID=$i KAFKA_PORT=$((BASE + i - 1)) \
    KAFKA_CONTROLLER_PORT=$((BASE + 10000 + i - 1)) KAFKA_VOTERS="$VOTERS" KAFKA_RF=3 \
    KAFKA_CLUSTER_ID="$(cat "$CDIR/cluster.id")" KAFKA_DATA_DIR="$CDIR/node-$i" "$KIT_DIR/start.sh"
done
for i in 1 2 3; do
  kit_wait_ready "$(cat "$CDIR/node-$i/kafka.pid")" $((BASE + i - 1)) "$CDIR/node-$i" "${KAFKA_START_TIMEOUT:-180}"
done
echo "cluster up: bootstrap 127.0.0.1:$BASE,127.0.0.1:$((BASE + 1)),127.0.0.1:$((BASE + 2))"
