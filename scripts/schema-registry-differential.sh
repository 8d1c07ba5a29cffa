#!/usr/bin/env bash
# Differential test of the built-in schema registry against Karapace 3.16.0, a
# Confluent-compatible registry run as a separate program on a real Apache Kafka 4.3.1 (the kit in
# scripts/kafka: jars from Maven Central, pinned in scripts/kafka/jars.lock). Both registries start
# empty and get the same API steps (scripts/schema_registry_differential.py: registrations of the
# three schema types, lookups, references, configs, modes, a table of schema changes under each of
# the 7 compatibility levels, deletes, error codes); answers are compared, and every difference is
# either in that file's ACCEPTED table with its reason or fails the run.
#
#   scripts/schema-registry-differential.sh     (target/debug/spate; SPATE_BIN overrides)
#
# Karapace is not on PyPI nor on any other registry reachable here, so this script cannot
# download it: scripts/karapace.sh takes its source from KARAPACE_SRC, its cache
# (~/.cache/spate-karapace) or a git dir of Aiven-Open/karapace (KARAPACE_GIT), and installs
# its pinned Python dependencies from PyPI in a venv there. Without the source the run is
# skipped (exit 0, with a message saying so); SR_DIFF_REQUIRE=1 makes that a failure instead.
# Kafka, Karapace and spate are all stopped at the end, also when a step fails.
# Env: DIFF_ONLY, DIFF_VERBOSE (see the .py), SR_DIFF_TIMEOUT (300 s).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${SPATE_BIN:-$ROOT/target/debug/spate}"
[[ -x "$BIN" ]] || { echo "spate binary not found at $BIN (cargo build first)" >&2; exit 2; }
rc=0; "$ROOT/scripts/karapace.sh" install >/dev/null || rc=$?
if [[ $rc == 3 ]]; then
  echo "SKIPPED schema-registry-differential: Karapace 3.16.0's source is not on this machine and cannot be downloaded from a package registry (see scripts/karapace.sh)."
  [[ "${SR_DIFF_REQUIRE:-0}" == 1 ]] && exit 1
  exit 0
fi
[[ $rc == 0 ]] || exit "$rc"

WORK="$(mktemp -d)"
SPATE_PID=""
cleanup() {
  [[ -n "$SPATE_PID" ]] && { kill "$SPATE_PID" 2>/dev/null; wait "$SPATE_PID" 2>/dev/null || true; }
  "$ROOT/scripts/karapace.sh" stop "$WORK/karapace" || true
  "$ROOT/scripts/kafka/stop.sh" "$WORK/kafka" >/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
read -r KAFKA_PORT CONTROLLER_PORT KARAPACE_PORT SR_PORT < <(python3 "$ROOT/scripts/free-ports.py" 4)
KAFKA_PORT=$KAFKA_PORT KAFKA_CONTROLLER_PORT=$CONTROLLER_PORT KAFKA_DATA_DIR="$WORK/kafka" \
  KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}" "$ROOT/scripts/kafka/start.sh"
"$ROOT/scripts/karapace.sh" start "$WORK/karapace" "$KARAPACE_PORT" "127.0.0.1:$KAFKA_PORT"

"$BIN" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --schema-registry-listen "127.0.0.1:$SR_PORT" \
  --data-dir "$WORK/spate" >"$WORK/spate.out" 2>"$WORK/spate.log" &
SPATE_PID=$!
for _ in $(seq 1 600); do
  grep -q "schema registry on" "$WORK/spate.out" 2>/dev/null && break
  kill -0 "$SPATE_PID" 2>/dev/null || { tail -20 "$WORK/spate.log" >&2; exit 1; }
  sleep 0.1
done
grep -q "schema registry on" "$WORK/spate.out" || { echo "spate's registry did not start" >&2; exit 1; }
echo "spate registry on 127.0.0.1:$SR_PORT (pid $SPATE_PID)"

SPATE_REGISTRY="http://127.0.0.1:$SR_PORT" KARAPACE_REGISTRY="http://127.0.0.1:$KARAPACE_PORT" \
  timeout "${SR_DIFF_TIMEOUT:-300}" python3 "$ROOT/scripts/schema_registry_differential.py" || rc=$?
if [[ $rc != 0 && -n "${DIFF_VERBOSE:-}" ]]; then tail -20 "$WORK/karapace/karapace.log" >&2; fi
exit "$rc"
