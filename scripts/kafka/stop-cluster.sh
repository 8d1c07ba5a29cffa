#!/usr/bin/env bash
# Stops the three nodes of start-cluster.sh together (one after another, the last broker would
# wait for a controller quorum that is already leaving).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CDIR="$(realpath -m "${1:-${KAFKA_CLUSTER_DIR:-$KAFKA_RUN/cluster-${KAFKA_PORT:-19092}}}")"
pids=()
for i in 1 2 3; do "$KIT_DIR/stop.sh" "$CDIR/node-$i" & pids+=($!); done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
