#!/usr/bin/env bash
# A follower with a full disk (issue 30): a 3-node spate cluster on loopback where node 3's
# data dir is a 48 MiB tmpfs with an 8 MiB watermark. Filled by acks=all producers, node 3
# stops copying, drops out of the ISR as a lagging replica would, and the two others keep
# accepting acks=all writes; with min.insync.replicas=3 they answer NOT_ENOUGH_REPLICAS;
# DeleteRecords frees node 3's space too and it catches up and rejoins the ISR. A partition
# node 3 led is handed to an in-sync replica with space once node 3 is full, and takes
# acks=all writes there. disk.min.free.bytes set for broker 3 through the quorum applies on
# node 3, DescribeConfigs shows it, and deleting it goes back to node 3's flag.
# Needs root (mount); says SKIPPED and exits 0 otherwise. SPATE_BIN picks the binary.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${SPATE_BIN:-$ROOT/target/debug/spate}"
if [[ "$(id -u)" -ne 0 ]]; then
  echo "disk-full-cluster-e2e: SKIPPED (needs root to mount a size-limited tmpfs)"
  exit 0
fi
[[ -x "$BIN" ]] || { echo "spate binary not found at $BIN (cargo build first)" >&2; exit 2; }
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka

WORK="$(mktemp -d)"
PIDS=()
MOUNTED=""
cleanup() {
  exec 2>/dev/null
  for p in "${PIDS[@]}"; do kill -9 "$p" || true; done
  wait || true
  if [[ -n "$MOUNTED" ]]; then umount "$WORK/node3/data" || umount -l "$WORK/node3/data" || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/node1" "$WORK/node2" "$WORK/node3/data"
if ! mount -t tmpfs -o size=48m tmpfs "$WORK/node3/data"; then
  echo "disk-full-cluster-e2e: SKIPPED (mounting a tmpfs failed)"
  exit 0
fi
MOUNTED=1
read -r P1 P2 P3 < <(python3 "$ROOT/scripts/free-ports.py" 3)
[[ -n "${P3:-}" ]] || { echo "no free ports for the cluster" >&2; exit 1; }
PEERS="1=127.0.0.1:$P1,2=127.0.0.1:$P2,3=127.0.0.1:$P3"
for n in 1 2 3; do
  if [[ $n -eq 3 ]]; then
    disk=(--disk-min-free-bytes $((8 << 20)) --disk-min-free-percent 0)
  else
    # The test machine's own disk is not what is tested.
    disk=(--disk-min-free-bytes 0 --disk-min-free-percent 0)
  fi
  "$BIN" --node-id "$n" --cluster-peers "$PEERS" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 \
    --data-dir "$WORK/node$n/data" --replica-lag-time-max-ms 3000 \
    --offsets-topic-num-partitions 1 --retention-check-interval-ms 500 "${disk[@]}" \
    >"$WORK/node$n/stdout" 2>"$WORK/node$n/spate.log" &
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
all_ready() { for h in "${https[@]}"; do curl -sf "http://$h/ready" >/dev/null || return 1; done; }
for _ in $(seq 1 300); do all_ready && break; sleep 0.1; done
all_ready || { tail -n 40 "$WORK"/node*/spate.log >&2; exit 1; }
echo "spate cluster at $(IFS=,; echo "${boot[*]}"); node 3's data dir on a 48 MiB tmpfs"

status=0
SPATE_BOOTSTRAP="$(IFS=,; echo "${boot[*]}")" SPATE_HTTP3="${https[2]}" \
  timeout 150 python3 "$ROOT/scripts/disk_full_cluster_e2e.py" || status=$?
if [[ $status -ne 0 ]]; then
  for n in 1 3; do echo "--- node $n log (last 25 lines)" >&2; tail -25 "$WORK/node$n/spate.log" >&2; done
  exit "$status"
fi
if grep -q "out of service" "$WORK"/node*/spate.log; then
  echo "a full disk took a log out of service" >&2; exit 1
fi
echo "disk-full-cluster-e2e: OK"
