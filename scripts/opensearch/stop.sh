#!/usr/bin/env bash
# Stops the OpenSearch start.sh started from DIR: only the pid in its opensearch.pid, and only if
# that process runs the kit's main for this DIR.
set -euo pipefail
DIR="$(realpath -m "${1:?usage: stop.sh DIR}")"
[[ -f "$DIR/opensearch.pid" ]] || { echo "no OpenSearch started from $DIR"; exit 0; }
PID="$(cat "$DIR/opensearch.pid")"
if ! kill -0 "$PID" 2>/dev/null; then rm -f "$DIR/opensearch.pid"; echo "pid $PID already gone"; exit 0; fi
tr '\0' ' ' < "/proc/$PID/cmdline" | grep -q "SpateOpenSearch.java $DIR " \
  || { echo "opensearch kit: pid $PID is not the OpenSearch of $DIR; left alone" >&2; exit 2; }
kill -TERM "$PID"
for _ in $(seq 1 60); do kill -0 "$PID" 2>/dev/null || break; sleep 0.5; done
kill -0 "$PID" 2>/dev/null && { echo "pid $PID ignored SIGTERM for 30 s; SIGKILL"; kill -KILL "$PID"; }
rm -f "$DIR/opensearch.pid"
echo "stopped OpenSearch pid $PID ($DIR)"
