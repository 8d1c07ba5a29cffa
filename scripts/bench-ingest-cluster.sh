#!/usr/bin/env bash
# HTTP ingest through one node of a throw-away 3-node cluster: wrk posts RECORDS x 256 B keyless
# records per request (acks=all) to node 1 for SECONDS_EACH seconds; a topic of 6 partitions,
# RF 3, so node 1 forwards about two thirds of the requests to the partitions' leaders. Prints
# records/s, the whole cluster's CPU per record (utime + stime of the three nodes), the Kafka
# connections the nodes accepted during the run, and wrk's latency. Asserts nothing.
# Env: SECONDS_EACH (15), RECORDS (100), WRK_CONNS (4), SPATE_BIN (default: the release build).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECS="${SECONDS_EACH:-15}"
RECORDS="${RECORDS:-100}"
if [[ -z "${SPATE_NODE_PIDS:-}" ]]; then
  if [[ -z "${SPATE_BIN:-}" ]]; then
    cargo build --release --bin spate --manifest-path "$ROOT/Cargo.toml"
    SPATE_BIN="$ROOT/target/release/spate"
  fi
  command -v wrk >/dev/null || apt-get install -y wrk >/dev/null
  "$ROOT/scripts/drop-page-cache.sh"
  SPATE_BIN="$SPATE_BIN" exec "$ROOT/scripts/with-spate-cluster.sh" -- "$0" "$@"
fi

H="$SPATE_HTTP"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$ROOT/scripts/wrk-ingest-body.sh" "$WORK" "$RECORDS"
curl -sf -XPOST "http://$H/admin/topics" -H 'content-type: application/json' \
  -d '{"name":"ingest-cluster","partitions":6,"replication_factor":3}' >/dev/null
for _ in $(seq 1 100); do
  curl -sf "http://$H/admin/topics/ingest-cluster" | grep -q '"leader":' && break
  sleep 0.1
done
ticks() {
  local t=0 p
  for e in $SPATE_NODE_PIDS; do
    p=${e#*=}
    t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$t"
}
count() { "$ROOT/scripts/topic-records.sh" "$H" ingest-cluster; }
accepted() {
  local s=0 h v
  IFS=, read -ra hs <<<"$SPATE_HTTP_ALL"
  for h in "${hs[@]}"; do
    v=$(curl -s "http://$h/metrics" | awk '/^spate_connections_accepted_total /{print $2}')
    s=$((s + ${v%.*}))
  done
  echo "$s"
}
c0=$(ticks); n0=$(count); k0=$(accepted); t0=$(date +%s.%N)
wrk -t1 -c"${WRK_CONNS:-4}" -d"${SECS}s" --latency -s "$WORK/post.lua" \
  "http://$H/topics/ingest-cluster?acks=all" >"$WORK/wrk.out"
c1=$(ticks); n1=$(count); k1=$(accepted); t1=$(date +%s.%N)
python3 - "$c0" "$c1" "$n0" "$n1" "$k0" "$k1" "$t0" "$t1" "$(getconf CLK_TCK)" <<'PY'
import sys
c0, c1, n0, n1, k0, k1 = map(int, sys.argv[1:7])
t0, t1 = map(float, sys.argv[7:9])
tck = int(sys.argv[9])
n = n1 - n0
print(f"records/s {n / (t1 - t0):,.0f}   cluster CPU us/record {(c1 - c0) / tck * 1e6 / max(n, 1):.2f}   "
      f"Kafka connections accepted during the run {k1 - k0}")
PY
grep -E "Non-2xx|Latency  | 50%| 99%" "$WORK/wrk.out" || true
