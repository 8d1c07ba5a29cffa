#!/usr/bin/env bash
# End-to-end tests of spate-bench against a real broker.
#
# Default: starts a throw-away Apache Kafka (scripts/kafka, jars fetched from Maven Central) on a free
# loopback port with a fresh data dir, runs `cargo test -p spate-bench` (unit + e2e tests) with
# SPATE_BENCH_BOOTSTRAP pointing at it, then stops that Kafka (only the pid it started).
# With SPATE_BENCH_BOOTSTRAP already set (e.g. a running spate broker), no Kafka is started.
#
# Env: CARGO_TARGET_DIR, CARGO_TEST_ARGS.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_KIT="$ROOT/scripts/kafka"

# librdkafka is built from source by cargo; its build includes curl headers.
if ! dpkg -s libcurl4-openssl-dev >/dev/null 2>&1; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    apt-get install -y libcurl4-openssl-dev >/dev/null
  else
    echo "bench-e2e: libcurl4-openssl-dev is required to build rdkafka (apt-get install -y libcurl4-openssl-dev)" >&2
    exit 1
  fi
fi

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

cleanup() {
  local rc=$?
  if [[ -n "${DATA_DIR:-}" ]]; then
    KAFKA_PORT="$PORT" KAFKA_DATA_DIR="$DATA_DIR" "$KAFKA_KIT/stop.sh" >/dev/null 2>&1 || true
    rm -rf "$DATA_DIR"
  fi
  exit "$rc"
}

if [[ -z "${SPATE_BENCH_BOOTSTRAP:-}" ]]; then
  PORT=""
  for _ in $(seq 1 50); do
    p=$(( 20000 + RANDOM % 9000 ))
    if port_free "$p" && port_free $(( p + 10000 )); then PORT=$p; break; fi
  done
  [[ -n "$PORT" ]] || { echo "bench-e2e: no free port pair found" >&2; exit 1; }
  DATA_DIR="$(mktemp -d /tmp/spate-bench-e2e.XXXXXX)"
  trap cleanup EXIT INT TERM
  "$KAFKA_KIT/fetch.sh" >/dev/null
  KAFKA_PORT="$PORT" KAFKA_DATA_DIR="$DATA_DIR" KAFKA_FRESH=1 "$KAFKA_KIT/start.sh"
  export SPATE_BENCH_BOOTSTRAP="127.0.0.1:$PORT"
fi

echo "bench-e2e: testing against $SPATE_BENCH_BOOTSTRAP"
cd "$ROOT"
# Per-run output is captured by the test harness and shown only for failing tests.
# shellcheck disable=SC2086
cargo test -p spate-bench ${CARGO_TEST_ARGS:-}
