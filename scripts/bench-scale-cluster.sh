#!/usr/bin/env bash
# Many partitions on a 3-node cluster (issue 28): 10 and then 10,000 partitions at RF 3
# (30,000 replicas): creation until every ISR is whole, RSS per replica, idle CPU, Metadata
# latency, controller failover (kill -9) and the killed node's return, each with its
# 10-partition counterpart. See scripts/bench_scale_cluster.py.
#   scripts/bench-scale-cluster.sh
# Env: PARTITIONS (10000), FEW (10), PER_TOPIC (100), WAIT_S (600), IDLE_S (10),
# OUT (target/bench-scale-cluster/<date>), SPATE_BIN (default: built here, --release).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/target/bench-scale-cluster/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
if [[ -z "${SPATE_BIN:-}" ]]; then
  cargo build --release -q -p spate-server --manifest-path "$ROOT/Cargo.toml"
fi
export SPATE_BIN="${SPATE_BIN:-$ROOT/target/release/spate}"
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka
# Each replica holds a few files open, in every node (which inherits this limit).
ulimit -n "$(ulimit -Hn)"
SCALE_DATA="$(mktemp -d /tmp/bench-scale-cluster.XXXX)"
export SCALE_DATA
trap 'pkill -9 -f -- "--data-dir $SCALE_DATA/" 2>/dev/null || true; rm -rf "$SCALE_DATA"' EXIT
python3 "$ROOT/scripts/bench_scale_cluster.py" 2>&1 | tee "$OUT/results.txt"
echo "results in $OUT"
