#!/usr/bin/env bash
# Runs a command against a throw-away spate broker on a free loopback port with a temp data
# dir, then stops it. The command sees SPATE_BOOTSTRAP (host:port), SPATE_PID, SPATE_HTTP (host:port of
# its HTTP listener), SPATE_LOG (its log) and, when --listeners was given, SPATE_LISTENERS
# (NAME://host:port,... as bound).
#   scripts/with-spate.sh [--spate-arg ARG]... -- COMMAND [ARGS...]
# SPATE_BIN picks the binary (default target/debug/spate).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${SPATE_BIN:-$ROOT/target/debug/spate}"
extra=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
  [[ "$1" == "--spate-arg" ]] || { echo "usage: $0 [--spate-arg ARG]... -- COMMAND..." >&2; exit 2; }
  extra+=("$2"); shift 2
done
[[ "${1:-}" == "--" ]] && shift
[[ $# -gt 0 ]] || { echo "usage: $0 [--spate-arg ARG]... -- COMMAND..." >&2; exit 2; }
[[ -x "$BIN" ]] || { echo "spate binary not found at $BIN (cargo build first)" >&2; exit 2; }

WORK="$(mktemp -d)"
PID=""
cleanup() { [[ -n "$PID" ]] && kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
"$BIN" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir "$WORK/data" "${extra[@]}" >"$WORK/stdout" 2>"$WORK/spate.log" &
PID=$!
for _ in $(seq 1 300); do [[ -s "$WORK/stdout" ]] && break; kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
SPATE_BOOTSTRAP="$(awk 'NR==1{print $4}' "$WORK/stdout")"
[[ -n "$SPATE_BOOTSTRAP" ]] || { echo "spate did not start:" >&2; cat "$WORK/spate.log" >&2; exit 1; }
SPATE_HTTP="$(sed -n 's/.*http on \([^,]*\),.*/\1/p' "$WORK/stdout")"
SPATE_LISTENERS="$(sed -n 's/.*, listeners \([^ ]*\).*/\1/p' "$WORK/stdout" | head -1)"
export SPATE_BOOTSTRAP SPATE_HTTP SPATE_LISTENERS SPATE_PID="$PID" SPATE_LOG="$WORK/spate.log"
echo "spate at $SPATE_BOOTSTRAP (pid $PID)"
"$@"
