#!/usr/bin/env bash
# Many partitions and idle connections on one node (issue 28): RSS per idle partition and per
# idle connection, Metadata latency, produce across many partitions against across 10, and
# start-up time after a clean stop and after kill -9. See scripts/bench_scale.py.
#   scripts/bench-scale.sh
# Env: PARTITIONS (10000), PER_TOPIC (100), CONNECTIONS (10000), PRODUCE_SECONDS (10), PRODUCE_ROUNDS (3),
# OUT (target/bench-scale/<date>), SPATE_BIN / BENCH_BIN (default: built here, --release).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/target/bench-scale/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
if [[ -z "${SPATE_BIN:-}" ]]; then
  cargo build --release -q -p spate-server -p spate-bench --manifest-path "$ROOT/Cargo.toml"
fi
export SPATE_BIN="${SPATE_BIN:-$ROOT/target/release/spate}"
export BENCH_BIN="${BENCH_BIN:-$ROOT/target/release/spate-bench}"
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka
# Each partition holds a few files open and each connection one socket, in this script and in
# the broker (which inherits this limit): as many as the hard limit allows.
ulimit -n "$(ulimit -Hn)"
SCALE_DATA="$(mktemp -d /tmp/bench-scale.XXXX)"
export SCALE_DATA
trap 'pkill -f -- "--data-dir $SCALE_DATA/d" 2>/dev/null || true; rm -rf "$SCALE_DATA"' EXIT
python3 "$ROOT/scripts/bench_scale.py" 2>&1 | tee "$OUT/results.txt"
echo "results in $OUT"
