#!/usr/bin/env bash
# Schema registry benchmark (issue 27): spate's built-in registry against Karapace 3.16.0 (on a
# real Apache Kafka 4.3.1 from scripts/kafka) on this machine, with the same client for both:
#   - lookups by id per second: raw HTTP GET /schemas/ids/{id} over LOOKUP_IDS registered ids
#     (no client-side cache), LOOKUP_CONNS keep-alive connections;
#   - registrations per second: distinct Avro schemas, each in a subject of its own,
#     REGISTER_CONNS connections;
#   both through scripts/bench_schema_registry_load.go (Go's net/http, `go run`), each bounded by
#   a request count and a time limit, with the server's CPU seconds over the run from /proc;
#   - serializer overhead (spate only): confluent-kafka-python producing to spate with
#     AvroSerializer (the registry in the same spate process) against plain bytes of the same
#     sizes, then consuming both back (AvroDeserializer against raw bytes):
#     scripts/bench_schema_registry_serde.py. Records/s and CPU microseconds per record.
# Prints a table with ratios; raw results in target/bench-schema-registry/ (results-*.json,
# table-*.txt). Everything started here is stopped at the end, also on failure.
#
#   scripts/bench-schema-registry.sh
# Env: SPATE_BIN (default: cargo build --release, target/release/spate), LOOKUP_N (200000),
#   LOOKUP_SECONDS (15), LOOKUP_CONNS (4), LOOKUP_IDS (200), REGISTER_N (3000), REGISTER_SECONDS (20),
#   REGISTER_CONNS (2), SERDE_RECORDS (200000), SERDE_SECONDS (60), SKIP_KARAPACE=1 (spate only).
# Karapace comes from scripts/karapace.sh (its source is on no registry reachable here); without
# it the Karapace columns are left out and the run says so.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="$ROOT/target/bench-schema-registry"
mkdir -p "$OUT_DIR"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
if [[ -z "${SPATE_BIN:-}" ]]; then
  cargo build --release --bin spate --manifest-path "$ROOT/Cargo.toml" >&2
  SPATE_BIN="$ROOT/target/release/spate"
fi
command -v go >/dev/null || { echo "go is needed for the load loop (scripts/bench_schema_registry_load.go)" >&2; exit 2; }
python3 -c "from confluent_kafka.schema_registry.avro import AvroSerializer" 2>/dev/null \
  || pip install -q 'confluent-kafka[avro]'
KARAPACE=1
if [[ "${SKIP_KARAPACE:-0}" == 1 ]]; then
  KARAPACE=0
else
  rc=0; "$ROOT/scripts/karapace.sh" install >/dev/null || rc=$?
  if [[ $rc == 3 ]]; then echo "Karapace 3.16.0 is not available here (see scripts/karapace.sh): spate only" >&2; KARAPACE=0
  elif [[ $rc != 0 ]]; then exit "$rc"; fi
fi

WORK="$(mktemp -d)"
SPATE_PID=""
cleanup() {
  [[ -n "$SPATE_PID" ]] && { kill "$SPATE_PID" 2>/dev/null; wait "$SPATE_PID" 2>/dev/null || true; }
  "$ROOT/scripts/karapace.sh" stop "$WORK/karapace" || true
  "$ROOT/scripts/kafka/stop.sh" "$WORK/kafka" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
read -r KAFKA_PORT CONTROLLER_PORT KARAPACE_PORT SR_PORT < <(python3 "$ROOT/scripts/free-ports.py" 4)
LOAD="$WORK/load"
(cd "$ROOT/scripts" && go build -o "$LOAD" bench_schema_registry_load.go)

"$SPATE_BIN" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --schema-registry-listen "127.0.0.1:$SR_PORT" \
  --data-dir "$WORK/spate" >"$WORK/spate.out" 2>"$WORK/spate.log" &
SPATE_PID=$!
for _ in $(seq 1 600); do
  grep -q "schema registry on" "$WORK/spate.out" 2>/dev/null && break
  kill -0 "$SPATE_PID" 2>/dev/null || { tail -20 "$WORK/spate.log" >&2; exit 1; }
  sleep 0.1
done
SPATE_BOOTSTRAP="$(sed -n 's/.*spate listening on \([^ ,]*\).*/\1/p' "$WORK/spate.out" | head -1)"
[[ -n "$SPATE_BOOTSTRAP" ]] || { echo "spate did not start" >&2; cat "$WORK/spate.out" >&2; exit 1; }
SPATE_URL="http://127.0.0.1:$SR_PORT"
echo "spate $("$SPATE_BIN" --version 2>/dev/null | head -1): registry $SPATE_URL, broker $SPATE_BOOTSTRAP (pid $SPATE_PID)" >&2

if [[ $KARAPACE == 1 ]]; then
  KAFKA_PORT=$KAFKA_PORT KAFKA_CONTROLLER_PORT=$CONTROLLER_PORT KAFKA_DATA_DIR="$WORK/kafka" \
    KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms512m -Xmx512m}" "$ROOT/scripts/kafka/start.sh" >&2
  "$ROOT/scripts/karapace.sh" start "$WORK/karapace" "$KARAPACE_PORT" "127.0.0.1:$KAFKA_PORT" >&2
  KARAPACE_URL="http://127.0.0.1:$KARAPACE_PORT"
  # Karapace's CPU counts its Kafka's too: its schemas are stored there (spate's are in its own log).
  KARAPACE_PID="$(cat "$WORK/karapace/karapace.pid"),$(cat "$WORK/kafka/kafka.pid")"
fi

# Registers LOOKUP_IDS distinct schemas (ids 1..LOOKUP_IDS on an empty registry) to look up.
seed() {  # seed URL
  "$LOAD" -url "$1" -mode register -prefix seed -n "${LOOKUP_IDS:-200}" -t 120 -c 1 >/dev/null
}
lookup() {  # lookup URL PID
  "$LOAD" -url "$1" -mode lookup -ids "1-${LOOKUP_IDS:-200}" -n "${LOOKUP_N:-200000}" \
    -t "${LOOKUP_SECONDS:-15}" -c "${LOOKUP_CONNS:-4}" -pid "$2"
}
register() {  # register URL PID
  "$LOAD" -url "$1" -mode register -prefix "reg-$STAMP" -n "${REGISTER_N:-3000}" \
    -t "${REGISTER_SECONDS:-20}" -c "${REGISTER_CONNS:-2}" -pid "$2"
}

RESULTS="$OUT_DIR/results-$STAMP.json"
{
  echo "{"
  seed "$SPATE_URL"
  echo "\"spate_lookup\": $(lookup "$SPATE_URL" "$SPATE_PID"),"
  echo "\"spate_register\": $(register "$SPATE_URL" "$SPATE_PID"),"
  if [[ $KARAPACE == 1 ]]; then
    seed "$KARAPACE_URL"
    echo "\"karapace_lookup\": $(lookup "$KARAPACE_URL" "$KARAPACE_PID"),"
    echo "\"karapace_register\": $(register "$KARAPACE_URL" "$KARAPACE_PID"),"
  fi
  SERDE="$(SPATE_BOOTSTRAP="$SPATE_BOOTSTRAP" SPATE_REGISTRY="$SPATE_URL" SPATE_PID="$SPATE_PID" \
    timeout 600 python3 "$ROOT/scripts/bench_schema_registry_serde.py" | sed -n 's/^RESULT //p')"
  echo "\"serde\": ${SERDE:-null}"
  echo "}"
} > "$RESULTS"

python3 - "$RESULTS" "$OUT_DIR/table-$STAMP.txt" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
lines = []
def p(s=""):
    lines.append(s)
p(f"{'registry benchmark':<34}{'spate':>14}{'Karapace':>14}{'spate/Karapace':>16}")
for key, label in (("lookup", "lookups by id /s"), ("register", "registrations /s")):
    s, k = r.get(f"spate_{key}"), r.get(f"karapace_{key}")
    kv = f"{k['per_sec']:14.0f}" if k else f"{'-':>14}"
    ratio = f"{s['per_sec'] / k['per_sec']:15.1f}x" if k and k["per_sec"] else f"{'-':>16}"
    p(f"{label:<34}{s['per_sec']:14.0f}{kv}{ratio}")
    for field, lab, fmt in (("p50_ms", "  p50 ms", "{:14.2f}"), ("p99_ms", "  p99 ms", "{:14.2f}")):
        p(f"{lab:<34}{fmt.format(s[field])}{fmt.format(k[field]) if k else '-':>14}")
    cpu = lambda x: x["server_cpu_s"] / x["requests"] * 1e6 if x and x["requests"] else 0
    kc = f"{cpu(k):14.0f}" if k else f"{'-':>14}"
    ratio = f"{cpu(k) / cpu(s):15.1f}x less" if k and cpu(s) else ""
    p(f"{'  server CPU us/request':<34}{cpu(s):14.0f}{kc}  {ratio}")
    p(f"{'  requests (errors)':<34}{str(s['requests']) + ' (' + str(s['errors']) + ')':>14}"
      f"{(str(k['requests']) + ' (' + str(k['errors']) + ')') if k else '-':>14}")
sd = r.get("serde")
if sd:
    p()
    p(f"serializer overhead through spate (confluent-kafka-python, mean value {sd['mean_value_bytes']} B)")
    p(f"{'':<28}{'records/s':>12}{'client us/rec':>15}{'spate us/rec':>14}")
    for key in ("produce_plain", "produce_avro", "consume_plain", "consume_avro"):
        x = sd[key]
        p(f"{x['phase']:<28}{x['per_sec']:12.0f}{x['client_cpu_us_per_record']:15.1f}{x['spate_cpu_us_per_record']:14.1f}")
    for a, b, what in (("produce_avro", "produce_plain", "produce"), ("consume_avro", "consume_plain", "consume")):
        A, B = sd[a], sd[b]
        p(f"{what}: Avro/plain records/s {A['per_sec'] / B['per_sec']:.2f}; client CPU +"
          f"{A['client_cpu_us_per_record'] - B['client_cpu_us_per_record']:.1f} us/record "
          f"({A['client_cpu_us_per_record'] / B['client_cpu_us_per_record']:.2f}x); spate CPU "
          f"{A['spate_cpu_us_per_record'] - B['spate_cpu_us_per_record']:+.1f} us/record")
text = "\n".join(lines)
print(text)
open(sys.argv[2], "w").write(text + "\n")
EOF
echo "results: $RESULTS"
