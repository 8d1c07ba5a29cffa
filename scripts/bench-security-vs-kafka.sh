#!/usr/bin/env bash
# The cost of TLS and SASL: produce and consume throughput and broker CPU per record over
# PLAINTEXT, SSL and SASL_SSL (SCRAM-SHA-512), for a real Apache Kafka (scripts/kafka/start.sh)
# and for spate, one broker after the other on this machine, with the same client (Kafka's own
# kafka-producer-perf-test / kafka-consumer-perf-test through scripts/kafka/tool.sh, the same
# client properties for both brokers). Prints numbers, no thresholds: a table per broker and
# protocol, the ratios SSL/PLAINTEXT and SASL_SSL/PLAINTEXT per broker, and spate/Kafka per
# protocol (CPU per record under SSL among them).
# Both brokers get three listeners on 127.0.0.1 (PLAINTEXT, SSL, SASL_SSL) with one throw-away
# CA and a server certificate for 127.0.0.1/localhost (scripts/security_e2e.py certs), and one
# SCRAM-SHA-512 user "bench" (spate: SPATE_BOOTSTRAP_USERS; Kafka: kafka-configs --alter
# --add-config SCRAM-SHA-512=[...] over its PLAINTEXT listener). Kafka's keystore and truststore
# are PEM files (ssl.keystore.type=PEM: key and certificate in one file). The clients:
#   PLAINTEXT  security.protocol=PLAINTEXT
#   SSL        security.protocol=SSL, ssl.truststore.type=PEM, ssl.truststore.location=ca.pem
#              (host name verification on: the certificate names 127.0.0.1), and
#              ssl.cipher.suites=BENCH_CIPHER (TLS_AES_128_GCM_SHA256; empty: the client's list).
#              One suite for both brokers: left to itself the Java client lists AES-256 first,
#              Kafka takes the client's order and spate prefers AES-128, and the client's own
#              TLS work, most of the CPU here, then differs between the brokers.
#   SASL_SSL   the same plus sasl.mechanism=SCRAM-SHA-512 and sasl.jaas.config=ScramLoginModule
# Cases, per broker and protocol, in the order PLAINTEXT, SSL, SASL_SSL, each on its own
# 1-partition topic (created over PLAINTEXT):
#   produce  BENCH_RECORDS records of BENCH_RECORD_SIZE bytes, unthrottled, acks=1, linger.ms=5,
#            batch.size=131072, no compression (BENCH_PRODUCER_PROPS adds or overrides
#            producer properties); dirty pages written back and the page cache dropped first
#   consume  the same records from the start (kafka-consumer-perf-test, default fetch sizes, a
#            new group); dirty pages written back first but the page cache kept, so the records
#            come from memory as for a consumer that keeps up (BENCH_CONSUME_COLD=1 drops the
#            cache too)
# MB/s are Kafka's tools' (MB = 2^20 bytes); consume rates are the tool's fetch.* columns (the
# group join is left out). Broker CPU per record: utime + stime of the broker process from
# /proc/PID/stat over the whole case (tool start-up, handshakes and group join included), per
# record (the case files also hold user and system ticks apart). The clients run on the same
# cores as the broker, and on loopback much of the kernel's TCP work for both ends is charged
# to the broker's system time. The client's CPU per record (the tool's JVM, from this shell's
# cutime + cstime once it is waited for) is shown too, with the sum of both: on two shared
# cores the client's own TLS work bounds what a faster broker can show in MB/s. Before the cases each broker takes BENCH_WARMUP_RECORDS
# unmeasured records on every listener and serves them back (a scratch topic per listener), for
# Kafka's JIT: with 200,000 produced records only, Kafka's first cases (PLAINTEXT) cost it 1.6x
# (produce) and 4.4x (consume) the CPU per record they cost after this warm-up.
#   scripts/bench-security-vs-kafka.sh
#   BENCH_RECORDS=20000 BENCH_WARMUP_RECORDS=0 scripts/bench-security-vs-kafka.sh   (smoke test)
# Env: BENCH_RECORDS (1,000,000 per case), BENCH_RECORD_SIZE (1024), BENCH_WARMUP_RECORDS
#   (500,000 per listener; 0: none), BENCH_CIPHER (above), BENCH_CASE_TIMEOUT (600 s per tool run; a case that runs
#   out shows as "error"), BENCH_PRODUCER_PROPS (extra key=value ... for the producer),
#   BENCH_CONSUME_COLD (0), BENCH_PROTOCOLS ("PLAINTEXT SSL SASL_SSL"), BENCH_BROKERS ("kafka
#   spate"; either alone), KAFKA_PORT (19092; SSL on +1, SASL_SSL on +2, its controller on
#   +10000), SPATE_BIN (the spate to measure; default: cargo build --release), SPATE_FSYNC
#   (interval), BENCH_DROP_CACHE (1; 0 leaves the page cache alone, e.g. for a smoke test beside
#   other work), OUT (default target/bench-security-vs-kafka/<date>: tool output per broker,
#   protocol and case, broker logs, table.txt).
# A case that fails shows as "error" and the run goes on. Needs python3 with `cryptography`
# (installed with pip if missing) and Java 17+ (the Kafka kit).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"
OUT="${OUT:-$ROOT/target/bench-security-vs-kafka/$(date +%Y%m%d-%H%M%S)}"
N="${BENCH_RECORDS:-1000000}"
SIZE="${BENCH_RECORD_SIZE:-1024}"
WARMUP="${BENCH_WARMUP_RECORDS:-500000}"
CASE_TIMEOUT="${BENCH_CASE_TIMEOUT:-600}"
COLD="${BENCH_CONSUME_COLD:-0}"
DROP="${BENCH_DROP_CACHE:-1}"
PROTOCOLS="${BENCH_PROTOCOLS:-PLAINTEXT SSL SASL_SSL}"
CIPHER="${BENCH_CIPHER-TLS_AES_128_GCM_SHA256}"
BROKERS="${BENCH_BROKERS:-kafka spate}"
KPORT="${KAFKA_PORT:-19092}"
USER_NAME=bench
USER_PASSWORD=bench-secret
PRODUCER_PROPS=(acks=1 linger.ms=5 batch.size=131072 compression.type=none)
# shellcheck disable=SC2206
PRODUCER_PROPS+=(${BENCH_PRODUCER_PROPS:-})
HZ=$(getconf CLK_TCK)
for v in N SIZE WARMUP CASE_TIMEOUT KPORT; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "$v must be a whole number, not '${!v}'" >&2; exit 2; }
done
(( N > 0 && SIZE > 0 && CASE_TIMEOUT > 0 )) || { echo "BENCH_RECORDS, BENCH_RECORD_SIZE and BENCH_CASE_TIMEOUT must be > 0" >&2; exit 2; }
for p in $PROTOCOLS; do
  [[ "$p" == PLAINTEXT || "$p" == SSL || "$p" == SASL_SSL ]] || { echo "unknown protocol '$p' in BENCH_PROTOCOLS" >&2; exit 2; }
done
mkdir -p "$OUT"
"$KAFKA_KIT/fetch.sh" >/dev/null
python3 -c "import cryptography" 2>/dev/null || pip install -q cryptography
if [[ " $BROKERS " == *" spate "* && -z "${SPATE_BIN:-}" ]]; then
  cargo build --release --bin spate --manifest-path "$ROOT/Cargo.toml"
  SPATE_BIN="$ROOT/target/release/spate"
fi

KDIR=""; SDIR=""; SPID=""; TOOL=""
WORK="$(mktemp -d /tmp/secbench.XXXX)"
cleanup() {
  if [[ -n "$TOOL" ]]; then kill "$TOOL" 2>/dev/null || true; wait "$TOOL" 2>/dev/null || true; fi
  if [[ -n "$KDIR" ]]; then KAFKA_DATA_DIR="$KDIR" "$KAFKA_KIT/stop.sh" >/dev/null 2>&1 || true; rm -rf "$KDIR"; fi
  if [[ -n "$SPID" ]]; then kill "$SPID" 2>/dev/null || true; wait "$SPID" 2>/dev/null || true; fi
  [[ -n "$SDIR" ]] && rm -rf "$SDIR"
  rm -rf "$WORK"
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Certificates and the client settings, the same for both brokers.
CERTS="$WORK/certs"
mkdir -p "$CERTS"
python3 "$ROOT/scripts/security_e2e.py" certs "$CERTS" >/dev/null
cat "$CERTS/server.key" "$CERTS/server.pem" >"$CERTS/kafka-keystore.pem"
for p in PLAINTEXT SSL SASL_SSL; do
  {
    echo "security.protocol=$p"
    if [[ "$p" != PLAINTEXT ]]; then
      echo "ssl.truststore.type=PEM"
      echo "ssl.truststore.location=$CERTS/ca.pem"
      [[ -n "$CIPHER" ]] && echo "ssl.cipher.suites=$CIPHER"
    fi
    if [[ "$p" == SASL_SSL ]]; then
      echo "sasl.mechanism=SCRAM-SHA-512"
      echo "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"$USER_NAME\" password=\"$USER_PASSWORD\";"
    fi
  } >"$WORK/client-$p.properties"
done
cp "$WORK/client-SASL_SSL.properties" "$OUT/client-SASL_SSL.properties"

drop_cache() { if [[ "$DROP" == 1 ]]; then "$ROOT/scripts/drop-page-cache.sh"; else sync; fi; }
# A client tool under a time bound, in the background so that an interrupt reaches the trap at
# once (timeout puts the tool in its own process group, out of reach of the terminal's ^C); the
# trap stops it.
run_bounded() {  # run_bounded SECONDS COMMAND...
  local secs=$1 rc=0; shift
  timeout "$secs" "$@" & TOOL=$!
  wait "$TOOL" || rc=$?
  TOOL=""
  return "$rc"
}
ticks() { awk '{print $14, $15}' "/proc/$1/stat" 2>/dev/null || echo 0 0; }  # user system
# CPU ticks of this shell's finished children (cutime + cstime): a client tool's, once waited.
client_ticks() { awk '{print $16 + $17}' "/proc/$$/stat"; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
declare -A ADDR=()   # protocol -> host:port of the broker under test

# Waits (bounded) until an admin client gets through every listener: TLS and the SCRAM user work.
probe_listeners() {  # probe_listeners NAME
  local name=$1 p i
  for p in $PROTOCOLS; do
    for i in $(seq 1 20); do
      if run_bounded 60 "$KAFKA_KIT/tool.sh" topics --bootstrap-server "${ADDR[$p]}" \
          --command-config "$WORK/client-$p.properties" --list >/dev/null 2>>"$OUT/$name-tools.err"; then
        break
      fi
      (( i == 20 )) && { echo "$name: no admin client got through $p at ${ADDR[$p]} (see $OUT/$name-tools.err)" >&2; return 1; }
      sleep 1
    done
  done
  if command -v openssl >/dev/null; then  # what TLS a generic client gets (openssl's view)
    for p in $PROTOCOLS; do
      [[ "$p" == PLAINTEXT ]] && continue
      echo "$name $p: $(timeout 10 openssl s_client -connect "${ADDR[$p]}" -CAfile "$CERTS/ca.pem" </dev/null 2>/dev/null \
        | sed -n 's/^New, //p' | head -1)" >>"$OUT/tls.txt"
    done
  fi
}

produce() {  # produce PROTOCOL TOPIC RECORDS OUTFILE
  run_bounded "$CASE_TIMEOUT" "$KAFKA_KIT/tool.sh" producer --bootstrap-server "${ADDR[$1]}" --topic "$2" \
    --num-records "$3" --record-size "$SIZE" --throughput -1 \
    --command-config "$WORK/client-$1.properties" --command-property "${PRODUCER_PROPS[@]}" >"$4" 2>&1
}
consume() {  # consume PROTOCOL TOPIC RECORDS OUTFILE
  run_bounded "$CASE_TIMEOUT" "$KAFKA_KIT/tool.sh" consumer --bootstrap-server "${ADDR[$1]}" --topic "$2" \
    --num-records "$3" --group "secbench-$2-$RANDOM" --timeout 30000 \
    --command-config "$WORK/client-$1.properties" >"$4" 2>&1
}

# Appends the case's numbers as key=value lines to its output file.
summarize() {  # summarize KIND FILE "USER0 SYS0" "USER1 SYS1"
  local kind=$1 f=$2 line u0 s0 u1 s1
  read -r u0 s0 <<<"$3"; read -r u1 s1 <<<"$4"
  if [[ "$kind" == produce ]]; then
    # "N records sent, R records/sec (M MB/sec), ... 50th, ..." (the final line has percentiles)
    line=$(grep 'records sent,.*50th' "$f" | tail -1 || true)
    if [[ -n "$line" ]]; then
      echo "$line" | sed -n 's/^\([0-9]*\) records sent, \([0-9.]*\) records\/sec (\([0-9.]*\) MB\/sec).*/records=\1\nrate=\2\nmbps=\3/p' >>"$f"
    fi
  else
    # start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec,
    # rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
    line=$(grep -E '^[0-9]{4}-[0-9]{2}-[0-9]{2} .*, .*, ' "$f" | tail -1 || true)
    if [[ -n "$line" ]]; then
      echo "$line" | awk -F', *' '{ printf "records=%s\nrate=%s\nmbps=%s\nrebalance_ms=%s\nfetch_ms=%s\n", $5, $10, $9, $7, $8 }' >>"$f"
    fi
  fi
  printf 'cpu_user_ticks=%s\ncpu_sys_ticks=%s\ncpu_ticks=%s\n' $((u1 - u0)) $((s1 - s0)) $((u1 - u0 + s1 - s0)) >>"$f"
}

report() {  # report NAME PROTOCOL KIND FILE: one line of progress
  printf '%-6s %-10s %-8s %s\n' "$1" "$2" "$3" \
    "$(grep -E '^(records|rate|mbps|cpu_user_ticks|cpu_sys_ticks|failed)=' "$4" | tr '\n' ' ')"
}

alive() {  # alive NAME PID OUTFILE: the broker still runs (else the case is marked failed)
  kill -0 "$2" 2>/dev/null && return 0
  echo "failed=1" >>"$3"
  echo "$1 (pid $2) exited during a case; its remaining cases are not run" >&2
  return 1
}

run_cases() {  # run_cases NAME PID: every protocol and case against one broker
  local name=$1 pid=$2 p t0 c0 out topic topics=()
  for p in $PROTOCOLS; do
    topics+=("secbench-$p")
    (( WARMUP > 0 )) && topics+=("secbench-warmup-$p")
  done
  for topic in "${topics[@]}"; do
    run_bounded 120 "$KAFKA_KIT/tool.sh" topics --bootstrap-server "${ADDR[PLAINTEXT]}" --create \
      --topic "$topic" --partitions 1 >/dev/null 2>>"$OUT/$name-tools.err" \
      || echo "$name: could not create $topic" >&2
  done
  if (( WARMUP > 0 )); then
    for p in $PROTOCOLS; do
      produce "$p" "secbench-warmup-$p" "$WARMUP" "$OUT/$name-warmup-$p-produce.txt" \
        && consume "$p" "secbench-warmup-$p" "$WARMUP" "$OUT/$name-warmup-$p-consume.txt" \
        || echo "$name: warm-up over $p failed" >&2
    done
  fi
  for p in $PROTOCOLS; do
    topic="secbench-$p"
    out="$OUT/$name-$p-produce.txt"
    drop_cache
    t0=$(ticks "$pid")
    c0=$(client_ticks)
    produce "$p" "$topic" "$N" "$out" || echo "failed=1" >>"$out"
    echo "client_cpu_ticks=$(( $(client_ticks) - c0 ))" >>"$out"
    alive "$name" "$pid" "$out" || return 1
    summarize produce "$out" "$t0" "$(ticks "$pid")"
    report "$name" "$p" produce "$out"

    out="$OUT/$name-$p-consume.txt"
    if [[ "$COLD" == 1 ]]; then drop_cache; else sync; sleep 1; fi
    t0=$(ticks "$pid")
    c0=$(client_ticks)
    consume "$p" "$topic" "$N" "$out" || echo "failed=1" >>"$out"
    echo "client_cpu_ticks=$(( $(client_ticks) - c0 ))" >>"$out"
    alive "$name" "$pid" "$out" || return 1
    summarize consume "$out" "$t0" "$(ticks "$pid")"
    report "$name" "$p" consume "$out"
  done
}

for broker in $BROKERS; do
  drop_cache
  ADDR=()
  case "$broker" in
    kafka)
      for port in "$((KPORT + 1))" "$((KPORT + 2))"; do
        port_open "$port" && { echo "port $port (Kafka's SSL/SASL_SSL listener) is in use" >&2; exit 2; }
      done
      ADDR[PLAINTEXT]="127.0.0.1:$KPORT"; ADDR[SSL]="127.0.0.1:$((KPORT + 1))"; ADDR[SASL_SSL]="127.0.0.1:$((KPORT + 2))"
      KDIR="$(mktemp -d /tmp/kafka-secbench.XXXX)"
      # Appended to the kit's server.properties, where a later key wins. Properties files read
      # \uXXXX escapes: the JAAS line's space is \u0020, as KAFKA_EXTRA_PROPS splits on spaces.
      props=(
        "listeners=PLAINTEXT://${ADDR[PLAINTEXT]},SSL://${ADDR[SSL]},SASL_SSL://${ADDR[SASL_SSL]},CONTROLLER://127.0.0.1:$((KPORT + 10000))"
        "advertised.listeners=PLAINTEXT://${ADDR[PLAINTEXT]},SSL://${ADDR[SSL]},SASL_SSL://${ADDR[SASL_SSL]}"
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL"
        "ssl.keystore.type=PEM"
        "ssl.keystore.location=$CERTS/kafka-keystore.pem"
        "ssl.truststore.type=PEM"
        "ssl.truststore.location=$CERTS/ca.pem"
        "sasl.enabled.mechanisms=SCRAM-SHA-512"
        'listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule\u0020required;'
      )
      KAFKA_PORT=$KPORT KAFKA_DATA_DIR="$KDIR" KAFKA_FRESH=1 KAFKA_EXTRA_PROPS="${props[*]}" \
        "$KAFKA_KIT/start.sh" >"$OUT/kafka-start.log"
      KPID="$(cat "$KDIR/kafka.pid")"
      run_bounded 120 "$KAFKA_KIT/tool.sh" kafka-configs --bootstrap-server "${ADDR[PLAINTEXT]}" --alter \
        --add-config "SCRAM-SHA-512=[password=$USER_PASSWORD]" --entity-type users --entity-name "$USER_NAME" \
        >>"$OUT/kafka-start.log" 2>&1 || { echo "kafka: could not add the SCRAM user" >&2; tail -5 "$OUT/kafka-start.log" >&2; exit 1; }
      echo "== kafka pid $KPID at ${ADDR[PLAINTEXT]} (SSL ${ADDR[SSL]}, SASL_SSL ${ADDR[SASL_SSL]})"
      if probe_listeners kafka; then
        run_cases kafka "$KPID" || true
      fi
      KAFKA_DATA_DIR="$KDIR" "$KAFKA_KIT/stop.sh" >/dev/null || true
      cp "$KDIR/logs/server.log" "$OUT/kafka-server.log" 2>/dev/null || true
      rm -rf "$KDIR"; KDIR=""
      ;;
    spate)
      [[ -x "$SPATE_BIN" ]] || { echo "no spate binary at $SPATE_BIN" >&2; exit 2; }
      SDIR="$(mktemp -d /tmp/spate-secbench.XXXX)"
      SPATE_BOOTSTRAP_USERS="$USER_NAME:$USER_PASSWORD" "$SPATE_BIN" \
        --listeners PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0 \
        --ssl-cert "$CERTS/server.pem" --ssl-key "$CERTS/server.key" \
        --http-listen 127.0.0.1:0 --data-dir "$SDIR/data" --fsync "${SPATE_FSYNC:-interval}" \
        --group-initial-rebalance-delay-ms 0 >"$SDIR/stdout" 2>"$OUT/spate.log" &
      SPID=$!
      for _ in $(seq 1 300); do [[ -s "$SDIR/stdout" ]] && break; kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
      listeners="$(sed -n 's/.*, listeners \([^ ]*\).*/\1/p' "$SDIR/stdout" | head -1)"
      for p in PLAINTEXT SSL SASL_SSL; do
        ADDR[$p]="$(echo "$listeners" | tr ',' '\n' | sed -n "s|^$p://||p")"
        [[ -n "${ADDR[$p]}" ]] || { echo "spate did not start with a $p listener:" >&2; cat "$SDIR/stdout" >&2; tail -20 "$OUT/spate.log" >&2; exit 1; }
      done
      echo "== spate pid $SPID at ${ADDR[PLAINTEXT]} (SSL ${ADDR[SSL]}, SASL_SSL ${ADDR[SASL_SSL]}; fsync ${SPATE_FSYNC:-interval})"
      if probe_listeners spate; then
        run_cases spate "$SPID" || true
      fi
      kill "$SPID" 2>/dev/null || true; wait "$SPID" 2>/dev/null || true; SPID=""
      rm -rf "$SDIR"; SDIR=""
      ;;
    *) echo "unknown broker '$broker' in BENCH_BROKERS" >&2; exit 2 ;;
  esac
done

# The table.
field() { [[ -f "$1" ]] && sed -n "s/^$2=\([0-9.]*\)$/\1/p" "$1" | tail -1; }
cell() {  # cell BROKER PROTOCOL KIND -> "mb/s rec/s cpu_us_per_record", "error ..." or "- ..." (not run)
  local f="$OUT/$1-$2-$3.txt" r m n t
  [[ -f "$f" ]] || { echo "- - -"; return; }
  r=$(field "$f" rate); m=$(field "$f" mbps); n=$(field "$f" records); t=$(field "$f" cpu_ticks)
  if grep -q "^failed=1" "$f" || [[ -z "$n" || "$n" == 0 || -z "$r" ]]; then echo "error error error"; return; fi
  awk -v r="$r" -v m="$m" -v n="$n" -v t="$t" -v hz="$HZ" 'BEGIN { printf "%.1f %.0f %.2f\n", m, r, t / hz * 1e6 / n }'
}
client() {  # client BROKER PROTOCOL KIND -> "client_us_per_record total_us_per_record" or "- -"
  local f="$OUT/$1-$2-$3.txt" n t c
  [[ -f "$f" ]] || { echo "- -"; return; }
  n=$(field "$f" records); t=$(field "$f" cpu_ticks); c=$(field "$f" client_cpu_ticks)
  if grep -q "^failed=1" "$f" || [[ -z "$n" || "$n" == 0 || -z "$c" ]]; then echo "- -"; return; fi
  awk -v n="$n" -v t="$t" -v c="$c" -v hz="$HZ" 'BEGIN { printf "%.2f %.2f\n", c / hz * 1e6 / n, (c + t) / hz * 1e6 / n }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", b / a; else print "-" }'; }
declare -A PM PR PC CM CR CC PK PT CK CT
for b in kafka spate; do
  for p in PLAINTEXT SSL SASL_SSL; do
    read -r PM[$b-$p] PR[$b-$p] PC[$b-$p] <<<"$(cell "$b" "$p" produce)"
    read -r CM[$b-$p] CR[$b-$p] CC[$b-$p] <<<"$(cell "$b" "$p" consume)"
    read -r PK[$b-$p] PT[$b-$p] <<<"$(client "$b" "$p" produce)"
    read -r CK[$b-$p] CT[$b-$p] <<<"$(client "$b" "$p" consume)"
  done
done
{
  echo "TLS and SASL cost, Kafka $(awk -F: '/kafka-clients/ {print $3}' "$KAFKA_KIT/jars.lock" | cut -d' ' -f1) perf tools (Java clients), $N x ${SIZE}-byte records per case, acks=1, 1 partition ($(date -u +%Y-%m-%dT%H:%MZ); consume from $( [[ "$COLD" == 1 ]] && echo "a dropped page cache" || echo "the page cache"))"
  row() { printf '%-6s %-10s %10s %10s %10s %10s %13s %13s\n' "$@"; }
  row broker protocol "prod MB/s" "prod rec/s" "cons MB/s" "cons rec/s" "prod cpu us/r" "cons cpu us/r"
  for b in kafka spate; do
    for p in PLAINTEXT SSL SASL_SSL; do
      [[ "${PM[$b-$p]}" == "-" && "${CM[$b-$p]}" == "-" ]] && continue
      row "$b" "$p" "${PM[$b-$p]}" "${PR[$b-$p]}" "${CM[$b-$p]}" "${CR[$b-$p]}" "${PC[$b-$p]}" "${CC[$b-$p]}"
    done
  done
  echo
  echo "the client's CPU per record (Kafka's Java tool, on the same cores), and the broker's and the client's together"
  row broker protocol "" "" "prod client" "prod total" "cons client" "cons total"
  for b in kafka spate; do
    for p in PLAINTEXT SSL SASL_SSL; do
      [[ "${PK[$b-$p]}" == "-" && "${CK[$b-$p]}" == "-" ]] && continue
      row "$b" "$p" "" "" "${PK[$b-$p]}" "${PT[$b-$p]}" "${CK[$b-$p]}" "${CT[$b-$p]}"
    done
  done
  echo
  echo "against PLAINTEXT on the same broker (throughput: below 1 is slower; cpu: above 1 is dearer)"
  rrow() { printf '%-6s %-20s %10s %10s %14s %14s\n' "$@"; }
  rrow broker ratio "prod MB/s" "cons MB/s" "prod cpu us/r" "cons cpu us/r"
  for b in kafka spate; do
    for p in SSL SASL_SSL; do
      [[ "${PM[$b-$p]}" == "-" || "${PM[$b-PLAINTEXT]}" == "-" ]] && continue
      rrow "$b" "$p/PLAINTEXT" "$(ratio "${PM[$b-PLAINTEXT]}" "${PM[$b-$p]}")" "$(ratio "${CM[$b-PLAINTEXT]}" "${CM[$b-$p]}")" \
        "$(ratio "${PC[$b-PLAINTEXT]}" "${PC[$b-$p]}")" "$(ratio "${CC[$b-PLAINTEXT]}" "${CC[$b-$p]}")"
    done
  done
  echo
  echo "spate/kafka on the same protocol (throughput: above 1 is faster; cpu: below 1 is cheaper)"
  rrow "" protocol "prod MB/s" "cons MB/s" "prod cpu us/r" "cons cpu us/r"
  for p in PLAINTEXT SSL SASL_SSL; do
    [[ "${PM[kafka-$p]}" == "-" || "${PM[spate-$p]}" == "-" ]] && continue
    rrow "" "$p" "$(ratio "${PM[kafka-$p]}" "${PM[spate-$p]}")" "$(ratio "${CM[kafka-$p]}" "${CM[spate-$p]}")" \
      "$(ratio "${PC[kafka-$p]}" "${PC[spate-$p]}")" "$(ratio "${CC[kafka-$p]}" "${CC[spate-$p]}")"
  done
  [[ -f "$OUT/tls.txt" ]] && { echo; echo "TLS as openssl s_client sees it:"; cat "$OUT/tls.txt"; }
  if [[ -f "$OUT/spate.log" ]]; then
    echo
    echo "spate log: $(grep -c ' WARN' "$OUT/spate.log" || true) WARN, $(grep -c ' ERROR' "$OUT/spate.log" || true) ERROR lines"
  fi
} | tee "$OUT/table.txt"
echo "results in $OUT"
