#!/usr/bin/env bash
# Installs what building and testing spate needs on a fresh Debian machine, and nothing that is
# already there: the curl headers librdkafka's build includes, and the Kafka anchor's jars
# (for the Kafka CLI tool checks). Safe to run repeatedly.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

need_apt=()
dpkg -s libcurl4-openssl-dev >/dev/null 2>&1 || need_apt+=(libcurl4-openssl-dev)
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
if (( ${#need_apt[@]} )); then
  echo "setup: installing ${need_apt[*]}"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

source "$ROOT/scripts/anchor.sh"
if [[ -n "$ANCHOR" ]]; then
  "$ANCHOR/install.sh" >/dev/null
else
  echo "setup: Kafka anchor not found (set SPATE_KAFKA_ANCHOR); the Kafka CLI checks will fail" >&2
fi
