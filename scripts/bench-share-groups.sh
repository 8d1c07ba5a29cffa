#!/usr/bin/env bash
# Share groups (KIP-932, issue 29): consume throughput and end-to-end latency of Kafka's own
# KafkaShareConsumer (4.3.1, scripts/share/ShareBench.java: M member threads in one JVM) on ONE
# partition, with 1, 4 and 16 members, against a release spate and then against Apache Kafka
# 4.3.1 (scripts/kafka/) on this machine, with the same client.
#   throughput: RECORDS records of SIZE bytes are pre-filled, then the members read them;
#     acknowledgement is explicit (ACCEPT per record, sent with the next poll) and a record
#     counts once the broker confirmed its acceptance (AcknowledgementCommitCallback).
#     records/s = distinct offsets accepted / (last confirmation - first record received).
#     Duplicate acceptances, acknowledgement errors and missing records are reported.
#   latency: a producer (linger.ms=0, acks=all) sends RATE records/s for LAT_SECONDS s while
#     the members consume; produce-to-receive latency (System.nanoTime in the value, same JVM),
#     p50/p99/max from a sorted array, first 2 s left out.
#   broker CPU: utime+stime from /proc/PID/stat at the start and end of each measured part;
#     "CPU µs/rec" is the consume of the pre-fill's CPU / records accepted.
# Kafka's share groups: Kafka 4.3's latest production share.version is 1 (bootstrap metadata
# version 4.2-IV0), so a cluster formatted by 4.3.1 has it finalized; this script checks
# that with kafka-features describe and, if it is not, runs
# kafka-features upgrade --feature share.version=1 (the run log says which happened). Kafka's
# share groups start at the latest offset by default: ShareBench sets the group config
# share.auto.offset.reset=earliest (Admin incrementalAlterConfigs); spate gets
# SPATE_SHARE_AUTO_OFFSET_RESET=earliest. Lock duration and every other setting: defaults.
# BROKERS may also name spate-cluster: three release spate nodes (scripts/with-spate-cluster.sh),
# the topic at replication factor 3 and the group starting at the earliest through its group
# config; "broker CPU" is then the three nodes' together.
#   scripts/bench-share-groups.sh
# Env: MEMBERS ("1 4 16"), RECORDS (200000), SIZE (256), RATE (1000 records/s), LAT_SECONDS
# (20), BROKERS ("spate kafka"; or with spate-cluster), OUT (target/bench-share-groups/<date>),
# SPATE_BIN (default: built here with cargo build --release -p spate-server).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
MEMBERS="${MEMBERS:-1 4 16}" RECORDS="${RECORDS:-200000}" SIZE="${SIZE:-256}" RATE="${RATE:-1000}"
LAT_SECONDS="${LAT_SECONDS:-20}" BROKERS="${BROKERS:-spate kafka}"
OUT="${OUT:-$ROOT/target/bench-share-groups/$(date -u +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
RESULTS="$OUT/results.txt"
LOAD="$OUT/load.txt"
if [[ -z "${SPATE_BIN:-}" ]]; then
  cargo build --release -q -p spate-server --manifest-path "$ROOT/Cargo.toml"
  SPATE_BIN="$ROOT/target/release/spate"
fi
"$KAFKA_KIT/fetch.sh" >/dev/null
TCK="$(getconf CLK_TCK)"
WORK="$(mktemp -d)"
if [[ -z "${BENCH_CLUSTER_INNER:-}" ]]; then : > "$RESULTS"; : > "$LOAD"; fi
SPATE_PID="" KAFKA_DIR=""
cleanup() {
  if [[ -n "$SPATE_PID" ]]; then kill "$SPATE_PID" 2>/dev/null || true; wait "$SPATE_PID" 2>/dev/null || true; fi
  if [[ -n "$KAFKA_DIR" ]]; then KAFKA_STOP_TIMEOUT=30 "$KAFKA_KIT/stop.sh" "$KAFKA_DIR" >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# run BROKER BOOTSTRAP PIDS [REPLICAS]: the member counts, one ShareBench JVM each (bounded by
# timeout). PIDS: the broker's pid, or a cluster's, comma-separated.
run() {
  local broker="$1" bootstrap="$2" pid="$3" replicas="${4:-1}" m p
  for m in $MEMBERS; do
    echo "== $broker, $m member(s): $(uptime)" | tee -a "$LOAD"
    KAFKA_TOOL_HEAP_OPTS="-Xmx1g" timeout 600 "$KAFKA_KIT/tool.sh" class "$ROOT/scripts/share/ShareBench.java" \
      "$bootstrap" "$pid" "$m" "$RECORDS" "$SIZE" "$RATE" "$LAT_SECONDS" "$broker" "$replicas" \
      > "$OUT/$broker-m$m.out" 2> "$OUT/$broker-m$m.err" \
      || echo "ShareBench failed for $broker, $m member(s) (exit $?); see $OUT/$broker-m$m.err" >&2
    sed "s/^RESULT /broker=$broker /" "$OUT/$broker-m$m.out" | grep '^broker=' | tee -a "$RESULTS" || true
    for p in ${pid//,/ }; do
      kill -0 "$p" 2>/dev/null || { echo "$broker (pid $p) is gone" >&2; return 1; }
    done
  done
  echo "== $broker done: $(uptime)" | tee -a "$LOAD"
}

# Inside scripts/with-spate-cluster.sh (see spate-cluster below): the runs, then back.
if [[ -n "${BENCH_CLUSTER_INNER:-}" ]]; then
  run spate-cluster "$SPATE_BOOTSTRAP" "$(tr ' ' '\n' <<<"$SPATE_NODE_PIDS" | cut -d= -f2 | paste -sd,)" 3
  exit 0
fi

for broker in $BROKERS; do
  case "$broker" in
    spate-cluster)
      SPATE_BIN="$SPATE_BIN" BENCH_CLUSTER_INNER=1 OUT="$OUT" MEMBERS="$MEMBERS" RECORDS="$RECORDS" \
        SIZE="$SIZE" RATE="$RATE" LAT_SECONDS="$LAT_SECONDS" \
        "$ROOT/scripts/with-spate-cluster.sh" -- "$0"
      ;;
    spate)
      SPATE_SHARE_AUTO_OFFSET_RESET=earliest "$SPATE_BIN" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 \
        --data-dir "$WORK/spate" > "$WORK/spate.stdout" 2> "$OUT/spate.log" &
      SPATE_PID=$!
      for _ in $(seq 1 300); do [[ -s "$WORK/spate.stdout" ]] && break; kill -0 "$SPATE_PID" 2>/dev/null || break; sleep 0.1; done
      bs="$(awk 'NR==1{print $4}' "$WORK/spate.stdout")"
      [[ -n "$bs" ]] || { echo "spate did not start" >&2; tail -20 "$OUT/spate.log" >&2; exit 1; }
      echo "spate $("$SPATE_BIN" --version 2>/dev/null || true) at $bs (pid $SPATE_PID)"
      run spate "$bs" "$SPATE_PID"
      grep -ciE ' (error|warn)' "$OUT/spate.log" | sed 's/^/spate log error|warn lines: /' || true
      kill "$SPATE_PID"; wait "$SPATE_PID" 2>/dev/null || true; SPATE_PID=""
      ;;
    kafka)
      read -r port cport < <(python3 "$ROOT/scripts/free-ports.py" 2 | xargs)
      KAFKA_DIR="$WORK/kafka"
      KAFKA_PORT="$port" KAFKA_CONTROLLER_PORT="$cport" KAFKA_DATA_DIR="$KAFKA_DIR" KAFKA_FRESH=1 "$KAFKA_KIT/start.sh"
      kpid="$(cat "$KAFKA_DIR/kafka.pid")"
      feats="$("$KAFKA_KIT/tool.sh" kafka-features --bootstrap-server "127.0.0.1:$port" describe)"
      echo "$feats" | grep share.version | tee "$OUT/kafka-features.txt"
      if ! echo "$feats" | grep -q 'Feature: share.version.*FinalizedVersionLevel: 1'; then
        echo "share.version not finalized at 1: kafka-features upgrade --feature share.version=1" | tee -a "$OUT/kafka-features.txt"
        "$KAFKA_KIT/tool.sh" kafka-features --bootstrap-server "127.0.0.1:$port" upgrade --feature share.version=1
      fi
      run kafka "127.0.0.1:$port" "$kpid"
      cp "$KAFKA_DIR/logs/server.log" "$OUT/kafka-server.log" 2>/dev/null || true
      KAFKA_STOP_TIMEOUT=30 "$KAFKA_KIT/stop.sh" "$KAFKA_DIR"; KAFKA_DIR=""
      ;;
    *) echo "unknown broker $broker" >&2; exit 2 ;;
  esac
done

# The table and spate/Kafka ratios.
python3 - "$RESULTS" "$TCK" <<'PYEOF' | tee "$OUT/table.md"
import sys
rows = {}
for line in open(sys.argv[1]):
    kv = dict(f.split("=", 1) for f in line.split())
    rows.setdefault((kv["broker"], int(kv["members"])), {})[kv["phase"]] = kv
tck = int(sys.argv[2])
def cell(b, m):
    t, l = rows.get((b, m), {}).get("throughput"), rows.get((b, m), {}).get("latency")
    r = {}
    if t:
        acc = int(t["accepted"])
        r["rps"] = float(t["rps"]); r["cpu"] = int(t["cpu_ticks"]) * 1e6 / tck / acc if acc else float("nan")
        r["tnote"] = f'{acc}/{t["records"]} accepted, first record after {t["first_record_s"]} s, dups {t["dups"]}, ack errors {t["ack_errors"]}, redelivered {t["redelivered"]}'
    if l:
        for k in ("p50", "p99", "max"): r[k] = float(l[k + "_ms"])
        la = int(l["accepted"])
        lcpu = int(l["cpu_ticks"]) * 1e6 / tck / la if la else float("nan")
        r["lnote"] = f'{la}/{l["records"]} accepted, dups {l["dups"]}, ack errors {l["ack_errors"]}, broker CPU {lcpu:.0f} µs/record at {l["rate"]}/s'
    return r
print("| broker | members | records/s | broker CPU µs/record | latency p50 ms | p99 ms | max ms | notes |")
print("|---|---|---|---|---|---|---|---|")
ms = sorted({m for _, m in rows})
for b in ("spate", "spate-cluster", "kafka"):
    for m in ms:
        r = cell(b, m)
        if not r: continue
        g = lambda k, f: (f % r[k]) if k in r else "-"
        print(f'| {b} | {m} | {g("rps", "%.0f")} | {g("cpu", "%.1f")} | {g("p50", "%.1f")} | {g("p99", "%.1f")} | {g("max", "%.1f")} | '
              f'throughput: {r.get("tnote", "-")}; latency: {r.get("lnote", "-")} |')
print()
print("| spate/Kafka | records/s | CPU µs/record | p50 | p99 | max |")
print("|---|---|---|---|---|---|")
for m in ms:
    s, k = cell("spate", m), cell("kafka", m)
    q = lambda key: f"{s[key] / k[key]:.2f}" if key in s and key in k and k[key] else "-"
    print(f'| {m} member(s) | {q("rps")} | {q("cpu")} | {q("p50")} | {q("p99")} | {q("max")} |')
PYEOF
echo "results in $OUT"
