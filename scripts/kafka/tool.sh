#!/usr/bin/env bash
# Runs one of Kafka's command-line tools (the pinned version, jars from fetch.sh) against any
# Kafka-compatible broker, by the name of its script in Kafka's bin/ (".sh" optional):
#   tool.sh kafka-topics --bootstrap-server 127.0.0.1:9092 --list
#   tool.sh producer ...  consumer ...  topics ...   (short for the perf tests and kafka-topics)
#   tool.sh class org.apache.kafka.tools.SomeMain ... (or kafka-run-class): any main class, or a
#                                                     .java file in source-file mode
#   tool.sh --list                                    the names and their main classes
#   tool.sh connect-distributed worker.properties     a Connect worker (Connect's runtime and the
#                                                     FileStream connectors are on the classpath)
# Env: KAFKA_TOOL_HEAP_OPTS (-Xmx512M), KAFKA_TOOL_LOGLEVEL (WARN), JAVA.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# name main-class, as Kafka 4.3's bin/*.sh run them.
TOOLS="
connect-distributed org.apache.kafka.connect.cli.ConnectDistributed
connect-plugin-path org.apache.kafka.tools.ConnectPluginPath
connect-standalone org.apache.kafka.connect.cli.ConnectStandalone
kafka-acls org.apache.kafka.tools.AclCommand
kafka-broker-api-versions org.apache.kafka.tools.BrokerApiVersionsCommand
kafka-client-metrics org.apache.kafka.tools.ClientMetricsCommand
kafka-cluster org.apache.kafka.tools.ClusterTool
kafka-configs kafka.admin.ConfigCommand
kafka-console-consumer org.apache.kafka.tools.consumer.ConsoleConsumer
kafka-console-producer org.apache.kafka.tools.ConsoleProducer
kafka-console-share-consumer org.apache.kafka.tools.consumer.ConsoleShareConsumer
kafka-consumer-groups org.apache.kafka.tools.consumer.group.ConsumerGroupCommand
kafka-consumer-perf-test org.apache.kafka.tools.ConsumerPerformance
kafka-delegation-tokens org.apache.kafka.tools.DelegationTokenCommand
kafka-delete-records org.apache.kafka.tools.DeleteRecordsCommand
kafka-dump-log org.apache.kafka.tools.DumpLogSegments
kafka-e2e-latency org.apache.kafka.tools.EndToEndLatency
kafka-features org.apache.kafka.tools.FeatureCommand
kafka-get-offsets org.apache.kafka.tools.GetOffsetShell
kafka-groups org.apache.kafka.tools.GroupsCommand
kafka-jmx org.apache.kafka.tools.JmxTool
kafka-leader-election org.apache.kafka.tools.LeaderElectionCommand
kafka-log-dirs org.apache.kafka.tools.LogDirsCommand
kafka-metadata-quorum org.apache.kafka.tools.MetadataQuorumCommand
kafka-producer-perf-test org.apache.kafka.tools.ProducerPerformance
kafka-reassign-partitions org.apache.kafka.tools.reassign.ReassignPartitionsCommand
kafka-share-consumer-perf-test org.apache.kafka.tools.ShareConsumerPerformance
kafka-share-groups org.apache.kafka.tools.consumer.group.ShareGroupCommand
kafka-storage kafka.tools.StorageTool
kafka-topics org.apache.kafka.tools.TopicCommand
kafka-transactions org.apache.kafka.tools.TransactionsCommand
kafka-verifiable-consumer org.apache.kafka.tools.VerifiableConsumer
kafka-verifiable-producer org.apache.kafka.tools.VerifiableProducer
producer org.apache.kafka.tools.ProducerPerformance
consumer org.apache.kafka.tools.ConsumerPerformance
topics org.apache.kafka.tools.TopicCommand
"
[[ $# -ge 1 ]] || { sed -n '2,11p' "$0" >&2; exit 2; }
name="${1%.sh}"; shift
case "$name" in
  --list) echo "$TOOLS" | awk 'NF { printf "%-32s %s\n", $1, $2 }'; exit 0 ;;
  class|kafka-run-class) main="${1:?tool.sh class needs a main class}"; shift ;;
  *) main="$(echo "$TOOLS" | awk -v n="$name" '$1 == n { print $2 }')"
     [[ -n "$main" ]] || kit_die "unknown tool '$name' (tool.sh --list names them; tool.sh class MAIN runs any other)" ;;
esac
CP="$(kit_classpath)"
# shellcheck disable=SC2046,SC2086
exec "$JAVA" ${KAFKA_TOOL_HEAP_OPTS:--Xmx512M} $KAFKA_JVM_PERF_OPTS $(kit_log_opts) -cp "$CP" "$main" "$@"
