# Sourced by the scripts in scripts/kafka: where the pinned Kafka lives, how to run its JVM,
# and small helpers. Jars and run directories stay outside the repository, in a cache.
KIT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KAFKA_LOCK="$KIT_DIR/jars.lock"
kit_die() { echo "kafka kit: $*" >&2; exit 2; }
# The lock is the one place the version is written: it is kafka-clients' version there.
KAFKA_VERSION="$(awk '$1 ~ /^org\.apache\.kafka:kafka-clients:/ { split($1, c, ":"); print c[3] }' "$KAFKA_LOCK")"
[[ -n "$KAFKA_VERSION" ]] || kit_die "$KAFKA_LOCK pins no org.apache.kafka:kafka-clients"
SPATE_KAFKA_HOME="$(realpath -m "${SPATE_KAFKA_HOME:-$HOME/.cache/spate-kafka}")"
KAFKA_LIB="$SPATE_KAFKA_HOME/$KAFKA_VERSION/lib"
KAFKA_RUN="$SPATE_KAFKA_HOME/run"
JAVA="${JAVA:-java}"
# bin/kafka-run-class.sh's JVM flags for servers and tools.
KAFKA_JVM_PERF_OPTS="${KAFKA_JVM_PERF_OPTS:--server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15 -Djava.awt.headless=true}"

# The stamp fetch.sh writes after checking every jar: the lock's own SHA-256.
kit_lock_stamp() { sha256sum "$KAFKA_LOCK" | cut -d' ' -f1; }

# The classpath. A cache stamped for this lock was checked jar by jar when fetch.sh filled it,
# so starting a tool costs no hashing; otherwise fetch.sh runs first.
kit_classpath() {
  command -v "$JAVA" >/dev/null || kit_die "no '$JAVA' on PATH: Kafka $KAFKA_VERSION needs Java 17+ (scripts/setup.sh installs it)"
  if [[ "$(cat "$KAFKA_LIB/.complete" 2>/dev/null)" != "$(kit_lock_stamp)" ]]; then
    "$KIT_DIR/fetch.sh" >&2 || kit_die "cannot fetch Kafka $KAFKA_VERSION's jars"
  fi
  echo "$KAFKA_LIB/*"
}

# Log4j2 options: broker logs to a file in DIR (or tools to stderr at WARN).
kit_log_opts() {  # kit_log_opts [LOG_DIR]
  if [[ -n "${1:-}" ]]; then
    echo "-Dlog4j2.configurationFile=$KIT_DIR/log4j2.properties -Dkafka.logs.dir=$1"
  else
    echo "-Dlog4j2.configurationFile=$KIT_DIR/log4j2.properties -Dspate.kafka.appender=STDERR -Dspate.kafka.level=${KAFKA_TOOL_LOGLEVEL:-WARN}"
  fi
}

kit_port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Waits until a started broker listens and logs that it started; fails early if it died.
kit_wait_ready() {  # kit_wait_ready PID PORT DIR TIMEOUT_S
  local pid=$1 port=$2 dir=$3 started=$SECONDS
  until kit_port_open "$port" && grep -q "Kafka Server started" "$dir/logs/server.log" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -30 "$dir/logs/stdout.log" "$dir/logs/server.log" >&2 2>/dev/null || true
      kit_die "Kafka (pid $pid) exited while starting; logs in $dir/logs"
    fi
    (( SECONDS - started > $4 )) && kit_die "Kafka did not listen on $port within $4 s (pid $pid left running)"
    sleep 0.2
  done
  echo "kafka ready on 127.0.0.1:$port after $((SECONDS - started)) s"
}
