#!/usr/bin/env bash
# A full disk is an ordinary, recoverable state (issue 30): the real spate binary on a 64 MiB
# tmpfs with a free-space watermark of 8 MiB is filled by librdkafka producers until refused;
# the producer sees the retriable KAFKA_STORAGE_ERROR, HTTP ingest a 507, every acknowledged
# record is read back, a group commits while full, and DeleteRecords, then retention.ms
# lowered at run time, free space so produce resumes without a restart. Then the same without
# a watermark, where the file system itself answers ENOSPC.
# Needs root (mount); says SKIPPED and exits 0 otherwise. SPATE_BIN picks the binary.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${SPATE_BIN:-$ROOT/target/debug/spate}"
if [[ "$(id -u)" -ne 0 ]]; then
  echo "disk-full-e2e: SKIPPED (needs root to mount a size-limited tmpfs)"
  exit 0
fi
[[ -x "$BIN" ]] || { echo "spate binary not found at $BIN (cargo build first)" >&2; exit 2; }
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka

WORK="$(mktemp -d)"
DATA="$WORK/data"
PID=""
MOUNTED=""
cleanup() {
  if [[ -n "$PID" ]]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  if [[ -n "$MOUNTED" ]]; then umount "$DATA" 2>/dev/null || umount -l "$DATA" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$DATA"
if ! mount -t tmpfs -o size=64m tmpfs "$DATA"; then
  echo "disk-full-e2e: SKIPPED (mounting a tmpfs failed)"
  exit 0
fi
MOUNTED=1

# Starts spate on the tmpfs with extra flags; sets PID, BOOTSTRAP and HTTP.
start_spate() {
  rm -rf "${DATA:?}"/* "$WORK/stdout" "$WORK/spate.log"
  "$BIN" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir "$DATA" \
    --retention-check-interval-ms 500 --offsets-topic-num-partitions 1 "$@" \
    >"$WORK/stdout" 2>"$WORK/spate.log" &
  PID=$!
  for _ in $(seq 1 300); do [[ -s "$WORK/stdout" ]] && break; kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
  BOOTSTRAP="$(awk 'NR==1{print $4}' "$WORK/stdout")"
  HTTP="$(sed -n 's/.*http on \([^,]*\),.*/\1/p' "$WORK/stdout")"
  [[ -n "$BOOTSTRAP" && -n "$HTTP" ]] || { echo "spate did not start:" >&2; cat "$WORK/spate.log" >&2; exit 1; }
  echo "spate at $BOOTSTRAP (http $HTTP), data dir on a 64 MiB tmpfs, flags: $*"
}

stop_spate() {
  kill "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
  PID=""
}

# Runs the driver in MODE; on failure shows the broker's log.
drive() {
  local status=0
  SPATE_BOOTSTRAP="$BOOTSTRAP" SPATE_HTTP="$HTTP" SPATE_DISK_MODE="$1" \
    timeout 120 python3 "$ROOT/scripts/disk_full_e2e.py" || status=$?
  if [[ $status -ne 0 ]]; then
    echo "--- spate log (last 40 lines)" >&2
    tail -40 "$WORK/spate.log" >&2
    exit "$status"
  fi
}

# 1. The watermark (8 MiB) refuses produce before the disk is full.
start_spate --disk-min-free-bytes $((8 << 20)) --disk-min-free-percent 0
drive watermark
# The crossings were logged both ways.
grep -q "below its free-space watermark" "$WORK/spate.log" || { echo "no log line for going below the watermark" >&2; exit 1; }
grep -q "above its free-space watermark again" "$WORK/spate.log" || { echo "no log line for coming back above the watermark" >&2; exit 1; }
stop_spate

# 2. No watermark: the file system itself runs out (ENOSPC), which must be "full", not a
# failed disk: the partition stays online and produce resumes once space is freed.
start_spate --disk-min-free-bytes 0 --disk-min-free-percent 0
drive enospc
grep -q "met ENOSPC" "$WORK/spate.log" || { echo "the broker never met ENOSPC: the test did not fill the disk" >&2; exit 1; }
if grep -q "out of service" "$WORK/spate.log"; then
  echo "a full disk took a log out of service:" >&2; grep "out of service" "$WORK/spate.log" >&2; exit 1
fi
stop_spate
echo "disk-full-e2e: OK"
