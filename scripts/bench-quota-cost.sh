#!/usr/bin/env bash
# What client-quota accounting costs on the produce path: spate-bench produces N x 256 B
# (acks=1) to a broker without quotas and to one with a default client quota far above the
# offered rate (every produce request is then measured against it, none is throttled),
# alternating ROUNDS times; prints records/s and broker CPU per record. Asserts nothing.
#   scripts/bench-quota-cost.sh [ROUNDS]       default 3; BENCH_RECORDS (3000000)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS="${1:-3}"; N="${BENCH_RECORDS:-3000000}"
if [[ -z "${SPATE_BIN:-}" ]]; then
  cargo build --release -q -p spate-server -p spate-bench --manifest-path "$ROOT/Cargo.toml"
  SPATE_BIN="$ROOT/target/release/spate"
fi
BENCH="${SPATE_BENCH_BIN:-$ROOT/target/release/spate-bench}"
TCK=$(getconf CLK_TCK)
run() {  # run LABEL QUOTA(0 = none)
  local dir; dir="$(mktemp -d)"
  "$SPATE_BIN" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir "$dir/data" > "$dir/out" 2>&1 &
  local pid=$!
  for _ in $(seq 1 100); do grep -q "spate listening" "$dir/out" 2>/dev/null && break; sleep 0.1; done
  local b http
  b=$(grep -o "listening on [0-9.:]*" "$dir/out" | awk '{print $3}')
  http=$(grep -o "http on [0-9.:]*" "$dir/out" | awk '{print $3}')
  curl -sf -XPOST "http://$http/admin/topics" -H 'content-type: application/json' \
    -d '{"name":"cost","partitions":1}' >/dev/null
  if [[ "$2" != 0 ]]; then
    python3 - "$b" "$2" <<'PY'
import socket, struct, sys
host, port = sys.argv[1].rsplit(":", 1)
quota = float(sys.argv[2])
def s16(s):
    b = s.encode()
    return struct.pack(">h", len(b)) + b
# AlterClientQuotas v0: one entry, entity (client-id, default), op producer_byte_rate.
body = struct.pack(">i", 1)
body += struct.pack(">i", 1) + s16("client-id") + struct.pack(">h", -1)
body += struct.pack(">i", 1) + s16("producer_byte_rate") + struct.pack(">d", quota) + b"\x00"
body += b"\x00"  # validate_only
hdr = struct.pack(">hhi", 49, 0, 1) + s16("bench-quota-cost")
req = hdr + body
c = socket.create_connection((host, int(port)))
c.sendall(struct.pack(">i", len(req)) + req)
n = struct.unpack(">i", c.recv(4))[0]
data = b""
while len(data) < n:
    data += c.recv(n - len(data))
# correlation id, throttle, entries count, error code
err = struct.unpack(">h", data[12:14])[0]
sys.exit(1 if err else 0)
PY
  fi
  local c0; c0=$(awk '{print $14+$15}' /proc/$pid/stat)
  "$BENCH" -b "$b" -t cost -p 1 -c 1 -s 256 -n "$N" -w 0s --acks 1 --no-progress \
    --json-output "$dir/r.json" >/dev/null 2>&1
  local c1; c1=$(awk '{print $14+$15}' /proc/$pid/stat)
  local rate; rate=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["produce"]["msgs_per_sec"])' "$dir/r.json")
  local metrics; metrics=$(curl -s "http://$http/metrics")
  local throttled; throttled=$(echo "$metrics" | awk '/^spate_quota_throttled_responses_total/ {s += $NF} END {print s+0}')
  local metered; metered=$(echo "$metrics" | awk '/^spate_quota_usage_total\{quota="produce"/ {s += $NF} END {printf "%.0f", s/1048576}')
  kill $pid; wait $pid 2>/dev/null || true; rm -rf "$dir"
  awk -v l="$1" -v r="$rate" -v c="$((c1 - c0))" -v t="$TCK" -v n="$N" -v th="$throttled" \
    -v m="$metered" 'BEGIN{printf "%-12s %12.0f records/s   broker CPU %5.2f s   %6.0f ns CPU/record   metered %d MiB, throttled responses %d\n", l, r, c/t, c/t/n*1e9, m, th}'
}
for i in $(seq 1 "$ROUNDS"); do
  if (( i % 2 )); then
    run "quotas-off" 0; run "quotas-on" 1000000000000
  else
    run "quotas-on" 1000000000000; run "quotas-off" 0
  fi
done
