#!/usr/bin/env bash
# Runs a command against a throw-away 3-node spate cluster on loopback (free ports, temp data
# dirs), then stops it. The command sees SPATE_BOOTSTRAP (all three Kafka addresses),
# SPATE_HTTP (node 1's HTTP listener), SPATE_HTTP_ALL, SPATE_NODE_PIDS ("1=pid 2=pid 3=pid")
# and SPATE_LOG (node 1's log).
#   scripts/with-spate-cluster.sh [--spate-arg ARG]... -- COMMAND [ARGS...]
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
PIDS=()
# SIGKILL: the data is thrown away, and three controlled shutdowns at once would each wait
# for a quorum that is leaving too.
# stderr off first: bash reports each killed job ("Killed ...") on it.
cleanup() { exec 2>/dev/null; for p in "${PIDS[@]}"; do kill -9 "$p" || true; done; wait || true; rm -rf "$WORK"; }
trap cleanup EXIT
# Three free inter-node ports below the ephemeral range (see free-ports.py).
read -r P1 P2 P3 < <(python3 "$ROOT/scripts/free-ports.py" 3)
[[ -n "${P3:-}" ]] || { echo "no free ports for the cluster" >&2; exit 1; }
PEERS="1=127.0.0.1:$P1,2=127.0.0.1:$P2,3=127.0.0.1:$P3"
for n in 1 2 3; do
  mkdir -p "$WORK/node$n"
  "$BIN" --node-id "$n" --cluster-peers "$PEERS" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 \
    --data-dir "$WORK/node$n/data" "${extra[@]}" >"$WORK/node$n/stdout" 2>"$WORK/node$n/spate.log" &
  PIDS+=($!)
done
boot=(); https=()
for n in 1 2 3; do
  for _ in $(seq 1 300); do [[ -s "$WORK/node$n/stdout" ]] && break; sleep 0.1; done
  addr="$(awk 'NR==1{print $4}' "$WORK/node$n/stdout")"
  http="$(sed -n 's/.*http on \([^,]*\),.*/\1/p' "$WORK/node$n/stdout")"
  [[ -n "$addr" ]] || { echo "node $n did not start:" >&2; cat "$WORK/node$n/spate.log" >&2; exit 1; }
  boot+=("$addr"); https+=("$http")
done
# Ready: joined, controller known, replicas caught up, on all three nodes in the same pass (a
# node can be ready, then follow a partition created after it and catch up again).
all_ready() { for h in "${https[@]}"; do curl -sf "http://$h/ready" >/dev/null || return 1; done; }
for _ in $(seq 1 300); do all_ready && break; sleep 0.1; done
if ! all_ready; then
  for h in "${https[@]}"; do echo "node at $h: $(curl -s "http://$h/ready")" >&2; done
  tail -n 40 "$WORK"/node*/spate.log >&2
  exit 1
fi
SPATE_BOOTSTRAP="$(IFS=,; echo "${boot[*]}")"
SPATE_HTTP="${https[0]}"
SPATE_HTTP_ALL="$(IFS=,; echo "${https[*]}")"
SPATE_NODE_PIDS="1=${PIDS[0]} 2=${PIDS[1]} 3=${PIDS[2]}"
export SPATE_BOOTSTRAP SPATE_HTTP SPATE_HTTP_ALL SPATE_NODE_PIDS SPATE_LOG="$WORK/node1/spate.log"
echo "spate cluster at $SPATE_BOOTSTRAP"
"$@"
