#!/usr/bin/env bash
# Installs what building and testing spate needs on a fresh Debian machine, and nothing that is
# already there: the curl headers librdkafka's build includes, a Java runtime, and Apache Kafka's
# jars (pinned in scripts/kafka/jars.lock, fetched from Maven Central) for the Kafka CLI tool
# checks. Safe to run repeatedly.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

need_apt=()
dpkg -s libcurl4-openssl-dev >/dev/null 2>&1 || need_apt+=(libcurl4-openssl-dev)
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
# Kafka 4's broker and tools need Java 17 or newer.
java_major() {  # the major version of $JAVA (default: java on PATH), 0 without one
  local v
  v="$("${JAVA:-java}" -XshowSettings:properties -version 2>&1 | awk '/java.specification.version/ { print $3 }')" || true
  v="${v#1.}"; echo "${v:-0}"
}
(( $(java_major) >= 17 )) || need_apt+=(openjdk-17-jre-headless)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
if (( ${#need_apt[@]} )); then
  echo "setup: installing ${need_apt[*]}"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

(( $(java_major) >= 17 )) \
  || { echo "setup: ${JAVA:-java} is Java $(java_major), Kafka 4 needs 17+ (set JAVA to a Java 17+ binary)" >&2; exit 1; }
"$ROOT/scripts/kafka/fetch.sh" >/dev/null
