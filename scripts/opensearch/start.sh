#!/usr/bin/env bash
# Starts a throw-away one-node OpenSearch (the version jars.lock pins) on 127.0.0.1 and waits
# until it answers. Its data, logs and pid live in DIR, which stop.sh takes:
#   start.sh DIR HTTP_PORT [TRANSPORT_PORT]       (TRANSPORT_PORT defaults to HTTP_PORT + 100)
# Env: OS_HEAP_OPTS (-Xms512m -Xmx512m), OS_START_TIMEOUT (120 s), JAVA.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DIR="$(realpath -m "${1:?usage: start.sh DIR HTTP_PORT [TRANSPORT_PORT]}")"
PORT="${2:?usage: start.sh DIR HTTP_PORT [TRANSPORT_PORT]}"
TPORT="${3:-$((PORT + 100))}"
CP="$(os_classpath)"
if [[ -f "$DIR/opensearch.pid" ]] && kill -0 "$(cat "$DIR/opensearch.pid")" 2>/dev/null; then
  os_die "an OpenSearch already runs from $DIR (pid $(cat "$DIR/opensearch.pid"))"
fi
mkdir -p "$DIR/logs"
# shellcheck disable=SC2086
nohup "$JAVA" ${OS_HEAP_OPTS:--Xms512m -Xmx512m} -XX:+UseG1GC -Djava.awt.headless=true \
  -Dlog4j2.configurationFile="$OS_KIT_DIR/log4j2.properties" -Dspate.opensearch.logs="$DIR/logs" \
  -cp "$CP" "$OS_KIT_DIR/SpateOpenSearch.java" "$DIR" "$PORT" "$TPORT" \
  > "$DIR/logs/stdout.log" 2>&1 < /dev/null &
PID=$!
echo "$PID" > "$DIR/opensearch.pid"
started=$SECONDS
until grep -q "^opensearch ready on" "$DIR/logs/stdout.log" 2>/dev/null \
      && curl -fsS -o /dev/null "http://127.0.0.1:$PORT/_cluster/health?wait_for_status=yellow&timeout=1s" 2>/dev/null; do
  if ! kill -0 "$PID" 2>/dev/null; then
    tail -30 "$DIR/logs/stdout.log" "$DIR/logs/opensearch.log" >&2 2>/dev/null || true
    rm -f "$DIR/opensearch.pid"
    os_die "OpenSearch (pid $PID) exited while starting; logs in $DIR/logs"
  fi
  (( SECONDS - started > ${OS_START_TIMEOUT:-120} )) && os_die "OpenSearch did not answer on $PORT within ${OS_START_TIMEOUT:-120} s (pid $PID left running; stop.sh $DIR)"
  sleep 0.3
done
echo "OpenSearch $OS_VERSION: pid $PID, http 127.0.0.1:$PORT, dir $DIR, ready after $((SECONDS - started)) s"
