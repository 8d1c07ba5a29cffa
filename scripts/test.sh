#!/usr/bin/env bash
# The whole test suite, as CI runs it: unit tests, end-to-end tests against the real spate
# binary with librdkafka, and Apache Kafka's own CLI tools against spate.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# CI's disk is small: incremental caches are of no use to a one-shot build, and the free space
# is printed so a full disk is recognised at once.
if [[ -n "${CI:-}" ]]; then
  export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
  df -h "$ROOT" "${TMPDIR:-/tmp}" || true
fi
scripts/setup.sh
# Lints are part of the test: a warning fails the run.
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace --all-targets
cargo test --workspace
scripts/kafka-tools-e2e.sh
# KIP-848 consumer groups with Kafka's Java consumer: members join, leave, die; nothing owned twice.
scripts/kip848-e2e.sh
# The same tools against a throw-away 3-node cluster, plus replication-factor checks.
scripts/kafka-tools-cluster-e2e.sh
# spate-bench's end-to-end tests, every mode, against spate.
scripts/with-spate.sh -- bash -c 'SPATE_BENCH_BOOTSTRAP=$SPATE_BOOTSTRAP exec scripts/bench-e2e.sh'
# A real search client (opensearch-py) against searchable topics.
scripts/search-client-e2e.sh
# The same documents and Grafana-shaped requests against spate and a real OpenSearch 2.19 (its jars
# from Maven Central, pinned in scripts/opensearch/jars.lock): hits and aggregations compared.
scripts/search-differential.sh
# A real REST Proxy client (Confluent's Node.js kafka-rest) against HTTP ingest.
scripts/rest-client-e2e.sh
# kafka-python's admin client: delete_records, log dirs, topic partitions, features.
scripts/kafka-python-admin-e2e.sh
# A full disk (a 64 MiB tmpfs, as root; SKIPPED otherwise): the watermark and a real ENOSPC
# refuse produce with KAFKA_STORAGE_ERROR and HTTP 507, nothing acknowledged is lost, commits
# go on, DeleteRecords and retention.ms free space and produce resumes without a restart.
scripts/disk-full-e2e.sh
# The same on a 3-node cluster with one follower's disk full: it leaves the ISR, acks=all goes
# on (NOT_ENOUGH_REPLICAS when min.insync.replicas needs it), DeleteRecords frees it, it rejoins.
scripts/disk-full-cluster-e2e.sh
# The built-in schema registry with confluent-kafka's SchemaRegistryClient and its Avro and
# JSON Schema serializers, through a kill -9 and restart.
scripts/schema-registry-e2e.sh
# The same registry with franz-go's registry client, Serde and Kafka client (Go).
scripts/schema-registry-franz-e2e.sh
# The same registry on a 3-node cluster: reads on every node, writes through any node
# forwarded to the _schemas leader, and registration going on through a surviving node after
# the leader is killed, no id handed out twice.
scripts/schema-registry-cluster-e2e.sh
# The registry with security on: SASL users over HTTP Basic, ACLs of the subject's topic,
# 401 and 403 (40301) with confluent-kafka's SchemaRegistryClient.
scripts/schema-registry-security-e2e.sh
# Searchable topics of schema'd values: AvroSerializer and ProtobufSerializer records found by
# their decoded fields (search.value.format=schema and auto), undecodable values kept as text.
scripts/schema-search-e2e.sh
# Transactions: librdkafka (commits, aborts, fencing, consume-transform-produce, timeouts,
# read_committed offsets), Kafka's Java producer and kafka-transactions, exactly-once Kafka
# Streams killed mid-run, and all of it again on a 3-node cluster with the coordinator killed.
scripts/txn-client-e2e.sh
scripts/txn-tools-e2e.sh
scripts/txn-streams-e2e.sh
scripts/txn-cluster-e2e.sh
# Kafka Connect (distributed) on compacted internal topics through a kill -9, standalone and on
# a 3-node cluster with a broker killed.
scripts/connect-e2e.sh
scripts/connect-cluster-e2e.sh
# TLS and SASL (PLAIN, SCRAM-SHA-256/512) with librdkafka, kafka-configs and Kafka's console
# clients, and the logins, mechanisms and certificates that must be refused.
scripts/security-e2e.sh
# The same on a 3-node cluster: SASL_SSL clients, mutual TLS and HTTPS between the nodes,
# credentials and ACLs through the quorum, Metadata per listener, kill -9 of a leader.
scripts/security-cluster-e2e.sh
# Share groups (KIP-932) with Kafka's console share consumer and KafkaShareConsumer members, one killed with kill -9 while holding locks.
scripts/share-groups-e2e.sh
# The same on a 3-node cluster, the share coordinator's node killed (kill -9) mid-run, then
# kafka-share-groups --reset-offsets, --delete-offsets and --delete.
scripts/share-groups-cluster-e2e.sh
# The container images built offline (podman, from the debug binaries above) and run as the chart runs them.
SPATE_IMAGE_PROFILE=debug SPATE_IMAGE_NO_CARGO=1 scripts/image-e2e.sh
