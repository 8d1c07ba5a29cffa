#!/usr/bin/env bash
# Runs one of Kafka's command-line tools (pinned version, jars from fetch.sh) against any
# Kafka-compatible broker:
#   tool.sh kafka-topics --bootstrap-server 127.0.0.1:9092 --list
#   tool.sh producer ...   (= kafka-producer-perf-test)   tool.sh consumer ...   tool.sh topics ...
#   tool.sh class org.apache.kafka.tools.SomeMain ...     any main class on the classpath
# Env: KAFKA_TOOL_HEAP_OPTS (-Xmx512M), KAFKA_TOOL_LOGLEVEL (WARN).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[[ $# -ge 1 ]] || { sed -n '2,9p' "$0"; exit 2; }
name="$1"; shift
case "$name" in
  producer|kafka-producer-perf-test) main=org.apache.kafka.tools.ProducerPerformance ;;
  consumer|kafka-consumer-perf-test) main=org.apache.kafka.tools.ConsumerPerformance ;;
  topics|kafka-topics) main=org.apache.kafka.tools.TopicCommand ;;
  kafka-configs) main=kafka.admin.ConfigCommand ;;
  kafka-consumer-groups) main=org.apache.kafka.tools.consumer.group.ConsumerGroupCommand ;;
  kafka-console-producer) main=org.apache.kafka.tools.ConsoleProducer ;;
  kafka-console-consumer) main=org.apache.kafka.tools.consumer.ConsoleConsumer ;;
  kafka-reassign-partitions) main=org.apache.kafka.tools.reassign.ReassignPartitionsCommand ;;
  kafka-leader-election) main=org.apache.kafka.tools.LeaderElectionCommand ;;
  kafka-delete-records) main=org.apache.kafka.tools.DeleteRecordsCommand ;;
  kafka-log-dirs) main=org.apache.kafka.tools.LogDirsCommand ;;
  kafka-get-offsets) main=org.apache.kafka.tools.GetOffsetShell ;;
  kafka-features) main=org.apache.kafka.tools.FeatureCommand ;;
  kafka-broker-api-versions) main=org.apache.kafka.tools.BrokerApiVersionsCommand ;;
  kafka-acls) main=org.apache.kafka.tools.AclCommand ;;
  kafka-metadata-quorum) main=org.apache.kafka.tools.MetadataQuorumCommand ;;
  class) main="${1:?tool.sh class needs a main class}"; shift ;;
  *) kit_die "unknown tool '$name' (see tool.sh's header for the names)" ;;
esac
CP="$(kit_classpath)"
# shellcheck disable=SC2046,SC2086
exec "$JAVA" ${KAFKA_TOOL_HEAP_OPTS:--Xmx512M} $KAFKA_JVM_PERF_OPTS $(kit_log_opts) -cp "$CP" "$main" "$@"
