#!/usr/bin/env bash
# Stops the node start.sh started from DIR (argument, or KAFKA_DATA_DIR, or the port's default):
# only the pid in its kafka.pid, and only if that process runs this dir's server.properties.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DIR="$(realpath -m "${1:-${KAFKA_DATA_DIR:-$KAFKA_RUN/node-${KAFKA_PORT:-19092}}}")"
[[ -f "$DIR/kafka.pid" ]] || { echo "no Kafka started from $DIR"; exit 0; }
PID="$(cat "$DIR/kafka.pid")"
if ! kill -0 "$PID" 2>/dev/null; then rm -f "$DIR/kafka.pid"; echo "pid $PID already gone"; exit 0; fi
tr '\0' ' ' < "/proc/$PID/cmdline" | grep -q "kafka.Kafka $DIR/server.properties" \
  || kit_die "pid $PID is not the Kafka of $DIR; left alone"
kill -TERM "$PID"
for _ in $(seq 1 "$(( ${KAFKA_STOP_TIMEOUT:-60} * 2 ))"); do kill -0 "$PID" 2>/dev/null || break; sleep 0.5; done
kill -0 "$PID" 2>/dev/null && { echo "pid $PID ignored SIGTERM; SIGKILL"; kill -KILL "$PID"; }
rm -f "$DIR/kafka.pid"
echo "stopped Kafka pid $PID ($DIR)"
