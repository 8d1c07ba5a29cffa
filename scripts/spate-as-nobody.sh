#!/usr/bin/env bash
# Runs spate as the user nobody with no capabilities (as the shipped image runs: a plain uid,
# no CAP_SYS_NICE), for measuring what such a broker gets. Use it as the binary of the bench
# scripts, as root: SPATE_BIN=scripts/spate-as-nobody.sh scripts/bench-search.sh
# SPATE_REAL_BIN picks the binary (default target/release/spate). Its data dir is handed to
# nobody, and the temporary dirs above it made passable.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${SPATE_REAL_BIN:-$ROOT/target/release/spate}"
args=("$@")
dir=""
for ((i = 0; i < ${#args[@]}; i++)); do
  [[ "${args[i]}" == --data-dir ]] && dir="${args[i + 1]:-}"
done
if [[ -n "$dir" ]]; then
  mkdir -p "$dir"
  chown -R 65534:65534 "$(dirname "$dir")"
  p="$(dirname "$dir")"
  while [[ "$p" == /tmp/* ]]; do chmod o+x "$p"; p="$(dirname "$p")"; done
fi
exec setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --bounding-set=-all "$BIN" "$@"
