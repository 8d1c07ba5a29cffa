#!/usr/bin/env bash
# Chaos run against a 3-node cluster in network namespaces (issues 8 and 22): idempotent
# acks=all producers and a consumer run while a seeded schedule kills (-9), pauses and
# restarts nodes and cuts and heals links; then everything heals and a checker counts
# acknowledged-but-lost, duplicated, reordered and read-but-later-lost records and replicas
# that differ below the high watermark. Any non-zero count fails the run. Needs root.
#   scripts/chaos.sh [SECONDS]            spate nodes, default 300 s of faults
#   scripts/chaos.sh --kafka [SECONDS]    the same against Apache Kafka's KRaft nodes (broker and
#                                         controller per node, static quorum; jars from
#                                         scripts/kafka/fetch.sh, Java 17+); replicas are compared
#                                         through Fetch from each replica instead of spate's files
#   SPATE_CHAOS_SEED=N scripts/chaos.sh   replays the fault schedule of seed N (the same seed
#                                         gives spate and Kafka the same schedule)
#   SPATE_CHAOS_KEEP=1                    keep node logs and data after a passing run too
#   SPATE_CHAOS_FSYNC=always              run spate nodes with --fsync always
#   SPATE_CHAOS_MESSAGE_TIMEOUT_MS=6000   producers give up sooner: records fail during faults
#   SPATE_CHAOS_KAFKA_HEAP="-Xms512m -Xmx1g"  each Kafka node's heap
# The report is printed; a failing run keeps it (report.txt), the node logs and their data
# in $TMPDIR/spate-chaos-<spate|kafka>-<pid>-<seed>/, with the consumer's record of its fetches:
# consumer-debug.log (librdkafka's fetch/msg/topic debug lines), consumer-fetches.tsv (per
# fetch reply and partition: broker, leader epoch, error, high watermark) and
# consumer-stats.tsv (librdkafka's statistics each second: leader, epoch, fetch state, HW).
# Comparing the two under a short message timeout:
#   SPATE_CHAOS_SEED=N SPATE_CHAOS_MESSAGE_TIMEOUT_MS=6000 scripts/chaos.sh --kafka 1800
#   SPATE_CHAOS_SEED=N SPATE_CHAOS_MESSAGE_TIMEOUT_MS=6000 scripts/chaos.sh 1800
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TARGET=spate
if [[ "${1:-}" == "--kafka" ]]; then TARGET=kafka; shift; fi
SECONDS_ARG="${1:-300}"
[[ "$SECONDS_ARG" =~ ^[0-9]+$ && $# -le 1 ]] || { echo "usage: $0 [--kafka] [SECONDS]" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "chaos.sh needs root (network namespaces, veth pairs)" >&2; exit 2; }
command -v ip >/dev/null || { echo "chaos.sh needs iproute2 (ip)" >&2; exit 2; }

# What the rdkafka build needs on a fresh machine (see scripts/setup.sh).
need_apt=()
dpkg -s libcurl4-openssl-dev >/dev/null 2>&1 || need_apt+=(libcurl4-openssl-dev)
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
if (( ${#need_apt[@]} )); then
  echo "chaos: installing ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [[ "$TARGET" == kafka ]]; then
  # Java 17+ and the pinned jars, as scripts/setup.sh installs them.
  "$ROOT/scripts/setup.sh"
  source "$ROOT/scripts/kafka/lib.sh"
  "$ROOT/scripts/kafka/fetch.sh"
  export SPATE_CHAOS_TARGET=kafka SPATE_CHAOS_KAFKA_LIB="$KAFKA_LIB" JAVA
else
  export SPATE_CHAOS_TARGET=spate
fi

export SPATE_CHAOS_SECONDS="$SECONDS_ARG"
cargo test -p spate-server --test e2e --no-run
exec cargo test -p spate-server --test e2e cluster_chaos -- --ignored --nocapture --test-threads 1
