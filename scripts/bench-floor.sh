#!/usr/bin/env bash
# How close spate gets to the physical floor (issue 28): the broker CPU per produced byte of
# spate against spate-floor (crates/floor: the same produce request stream from the same
# client, appended to one file per partition with the same fsync policy, no broker work), and
# spate's CPU per consumed byte against a plain sendfile of the bytes to a loopback socket.
# Rounds alternate floor and spate, each on a fresh data dir with the page cache dropped.
#   scripts/bench-floor.sh
# Env: ROUNDS (3), RECORDS (4000000 per round), SIZE (256), PRODUCERS (4), PARTITIONS (3),
# ACKS (1), FSYNC (interval: interval|always|never), OUT (target/bench-floor/<date>),
# SPATE_BIN / FLOOR_BIN / BENCH_BIN (default: built here with --release).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS="${ROUNDS:-3}" RECORDS="${RECORDS:-4000000}" SIZE="${SIZE:-256}"
PRODUCERS="${PRODUCERS:-4}" PARTITIONS="${PARTITIONS:-3}" ACKS="${ACKS:-1}" FSYNC="${FSYNC:-interval}"
OUT="${OUT:-$ROOT/target/bench-floor/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
if [[ -z "${SPATE_BIN:-}${FLOOR_BIN:-}${BENCH_BIN:-}" ]]; then
  cargo build --release -q -p spate-server -p spate-floor -p spate-bench --manifest-path "$ROOT/Cargo.toml"
fi
SPATE_BIN="${SPATE_BIN:-$ROOT/target/release/spate}"
FLOOR_BIN="${FLOOR_BIN:-$ROOT/target/release/spate-floor}"
BENCH_BIN="${BENCH_BIN:-$ROOT/target/release/spate-bench}"
TICK="$(getconf CLK_TCK)"
WORK="$(mktemp -d /tmp/bench-floor.XXXX)"
SERVER_PID=""
cleanup() {
  [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

cpu_ticks() {  # user + system clock ticks of a process
  awk '{ print $14 + $15 }' "/proc/$1/stat"
}

start() {  # start floor|spate DIR: runs the server, sets SERVER_PID and ADDR
  local kind="$1" dir="$2"
  mkdir -p "$dir"
  if [[ "$kind" == floor ]]; then
    "$FLOOR_BIN" produce --dir "$dir/data" --partitions "$PARTITIONS" --fsync "$FSYNC" \
      > "$dir/stdout" 2> "$dir/log" &
  else
    "$SPATE_BIN" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir "$dir/data" \
      --fsync "$FSYNC" > "$dir/stdout" 2> "$dir/log" &
  fi
  SERVER_PID=$!
  for _ in $(seq 1 200); do [[ -s "$dir/stdout" ]] && break; sleep 0.05; done
  ADDR="$(awk 'NR==1 { print $4 }' "$dir/stdout")"
  [[ -n "$ADDR" ]] || { echo "$kind did not start:" >&2; cat "$dir/log" >&2; exit 1; }
}

stop() {
  kill "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
}

measure() {  # measure LABEL MODE TOPIC [ARGS...]: one spate-bench run; prints "LABEL msg/s ns/byte CPU bytes"
  local label="$1" mode="$2" topic="$3" before after
  shift 3
  before="$(cpu_ticks "$SERVER_PID")"
  "$BENCH_BIN" -b "$ADDR" -t "$topic" -m "$mode" -c "$PRODUCERS" -s "$SIZE" -n "$RECORDS" \
    -w 0 --acks "$ACKS" --no-progress "$@" \
    --json-output "$OUT/$label.json" > "$OUT/$label.txt" 2>&1 \
    || { cat "$OUT/$label.txt" >&2; exit 1; }
  after="$(cpu_ticks "$SERVER_PID")"
  python3 - "$OUT/$label.json" "$label" "$before" "$after" "$TICK" <<'PYEOF'
import json, sys
report, label, before, after, tick = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
r = json.load(open(report))
phase = r["produce"] or r["consume"]
msgs = phase.get("delivered", phase.get("consumed"))
cpu = (after - before) / tick
# Record value bytes as the client counts them: the same for every server.
print(f"{label} {phase['msgs_per_sec']:.0f} {cpu * 1e9 / max(phase['bytes'], 1):.3f} {cpu:.2f} {phase['bytes']}")
PYEOF
}

echo "bench-floor: $ROUNDS rounds, $RECORDS x $SIZE B, $PRODUCERS producers, $PARTITIONS partitions, acks=$ACKS, fsync $FSYNC" | tee "$OUT/summary.txt"
results="$OUT/results.txt"
: > "$results"
for round in $(seq 1 "$ROUNDS"); do
  for kind in floor spate; do
    dir="$WORK/$kind-$round"
    "$ROOT/scripts/drop-page-cache.sh" >/dev/null 2>&1 || true
    start "$kind" "$dir"
    # The floor has every topic already; spate gets it made with the same partitions.
    create=(); [[ "$kind" == spate ]] && create=(--create-topic -p "$PARTITIONS")
    measure "produce-$kind-$round" produce "floor-$round" "${create[@]}" | tee -a "$results"
    if [[ "$kind" == spate ]]; then
      measure "consume-spate-$round" consume "floor-$round" | tee -a "$results"
      stop
      # The consume floor: the same bytes, sent from the log's files with sendfile.
      segment="$(find "$dir/data" -name '*.log' -size +1M | head -1)"
      total="$(du -cb $(find "$dir/data" -name '*.log') | tail -1 | cut -f1)"
      # Counted per record value byte, as the rows above: the log's bytes include batch and
      # record headers, which a fetch sends too.
      consumed="$(awk '$1 == "consume-spate-'"$round"'" { print $5 }' "$results")"
      "$FLOOR_BIN" copy --file "$segment" --bytes "$total" \
        | awk -v r="$round" -v c="$consumed" -v t="$total" \
          '{ for (i = 1; i <= NF; i++) if ($i == "=") ns = $(i+1);
             printf "copy-floor-%s 0 %.3f 0 %s\n", r, ns * t / c, c }' | tee -a "$results"
    else
      stop
    fi
    rm -rf "$dir"
  done
done
python3 - "$results" <<'PYEOF' | tee -a "$OUT/summary.txt"
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    label, rate, nspb, cpu, msgs = line.split()
    rows[label.rsplit("-", 1)[0]].append((float(rate), float(nspb)))
def med(k, i):
    return statistics.median(v[i] for v in rows[k]) if rows[k] else float("nan")
print(f"{'':16}{'msg/s (median)':>16}{'CPU ns/byte (median)':>22}   each round (ns/byte)")
for k in ("produce-floor", "produce-spate", "consume-spate", "copy-floor"):
    print(f"{k:16}{med(k, 0):>16,.0f}{med(k, 1):>22.3f}   {', '.join(f'{v[1]:.3f}' for v in rows[k])}")
print(f"produce: spate / floor CPU per byte = {med('produce-spate', 1) / med('produce-floor', 1):.2f} (bar: <= 1.5)")
print(f"consume: spate / sendfile CPU per byte = {med('consume-spate', 1) / med('copy-floor', 1):.2f} (bar: <= 1.5)")
PYEOF
echo "results in $OUT"
