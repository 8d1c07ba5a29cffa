#!/usr/bin/env bash
# Searchable topics' cost and freshness on this machine: produce throughput and p99 with and
# without search on the topic (spate-bench), then a match query's latency over what was
# produced and the index size per GiB of log. Prints numbers; asserts nothing.
#   scripts/bench-search.sh [SECONDS]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECS="${1:-20}"
cargo build --release -q -p spate-server -p spate-bench
export SPATE_BIN="$ROOT/target/release/spate"
BENCH="$ROOT/target/release/spate-bench"
run() {
  local topic="$1" configs="$2"
  "$ROOT/scripts/with-spate.sh" -- bash -c "
    set -e
    curl -sf -XPOST \$SPATE_HTTP/admin/topics -H 'content-type: application/json' \
      -d '{\"name\":\"$topic\",\"partitions\":4,\"configs\":{$configs}}' >/dev/null
    $BENCH -b \$SPATE_BOOTSTRAP -t $topic -p 4 -c 2 -s 512 -d ${SECS}s -w 3s --acks 1 --payload-pattern text 2>/dev/null | grep -Ei 'msg/s|p50|p99' || true
    sleep 2
    curl -s \$SPATE_HTTP/metrics | grep -E '^spate_search_(index_size_bytes|lag_records)' || true
    curl -s \$SPATE_HTTP/admin/topics/$topic | python3 -c 'import json,sys; t=json.load(sys.stdin); print(\"log bytes\", sum(p[\"size_bytes\"] for p in t[\"partition_details\"]))'
    for i in \$(seq 1 50); do curl -s -o /dev/null -w '%{time_total}\n' \$SPATE_HTTP/$topic/_search -d '{\"query\":{\"match\":{\"value\":\"alpha\"}}}' 2>/dev/null || true; done \
      | sort -n | awk '{a[NR]=\$1} END {if (NR) printf \"match query p50 %.1f ms p99 %.1f ms\n\", a[int(NR*0.5)]*1000, a[int(NR*0.99)]*1000}'
  "
}
echo "== without search"; run plain '"search.enabled":"false"'
echo "== with search";    run searchable '"search.enabled":"true"'
