#!/usr/bin/env bash
# Chaos run against a 3-node spate cluster in network namespaces (issue 8): idempotent
# acks=all producers and a consumer run while a seeded schedule kills (-9), pauses and
# restarts nodes and cuts and heals links; then everything heals and a checker counts
# acknowledged-but-lost, duplicated, reordered and read-but-later-lost records and replicas
# that differ below the high watermark. Any non-zero count fails the run. Needs root.
#   scripts/chaos.sh [SECONDS]            default 300 s of faults
#   SPATE_CHAOS_SEED=N scripts/chaos.sh   replays the fault schedule of seed N
#   SPATE_CHAOS_KEEP=1                    keep node logs and data after a passing run too
#   SPATE_CHAOS_FSYNC=always              run the nodes with --fsync always
#   SPATE_CHAOS_MESSAGE_TIMEOUT_MS=6000   producers give up sooner: records fail during faults
# The report is printed; a failing run keeps it (report.txt), the node logs and their data
# in $TMPDIR/spate-chaos-<pid>-<seed>/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SECONDS_ARG="${1:-300}"
[[ "$SECONDS_ARG" =~ ^[0-9]+$ ]] || { echo "usage: $0 [SECONDS]" >&2; exit 2; }
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

export SPATE_CHAOS_SECONDS="$SECONDS_ARG"
cargo test -p spate-server --test e2e --no-run
exec cargo test -p spate-server --test e2e cluster_chaos -- --ignored --nocapture --test-threads 1
