#!/usr/bin/env bash
# Starts a 3-node spate cluster on loopback for trying it out; Ctrl-C stops all three.
#
#   scripts/cluster-local.sh            # Kafka on 127.0.0.1:19092,19093,19094
#   SPATE_BIN=target/release/spate DATA=/tmp/spate-cluster scripts/cluster-local.sh
#
# Node N: Kafka port 19091+N, inter-node port 19191+N, HTTP port 19700+N, data in $DATA/nodeN.
# Extra arguments are passed to every node (e.g. --fsync always).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${SPATE_BIN:-target/debug/spate}
DATA=${DATA:-./data-cluster}
if [[ ! -x "$BIN" ]]; then
  cargo build -p spate-server ${SPATE_BIN:+--release}
fi
PEERS="1=127.0.0.1:19192,2=127.0.0.1:19193,3=127.0.0.1:19194"
pids=()
stop() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap stop EXIT INT TERM
for n in 1 2 3; do
  mkdir -p "$DATA/node$n"
  "$BIN" --node-id "$n" --cluster-peers "$PEERS" \
    --listen "127.0.0.1:$((19091 + n))" --http-listen "127.0.0.1:$((19700 + n))" \
    --data-dir "$DATA/node$n" "$@" > "$DATA/node$n.log" 2>&1 &
  pids+=($!)
done
echo "spate cluster: bootstrap 127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094"
echo "status: curl -s 127.0.0.1:19701/admin/cluster | jq ; logs in $DATA/node{1,2,3}.log"
wait -n "${pids[@]}"
echo "a node exited; see its log" >&2
