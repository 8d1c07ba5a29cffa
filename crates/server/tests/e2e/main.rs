//! End-to-end tests: the real `spate` binary on a free loopback port with a temp data dir,
//! driven by librdkafka (the `rdkafka` crate) and by raw protocol requests for the inputs no
//! well-behaved client sends.

mod admin;
mod admin_apis;
mod bad_input;
mod cluster;
mod cluster_chaos;
mod cluster_netns;
mod cluster_observers;
mod cluster_ops;
mod compaction;
mod compression;
mod consumer_groups;
mod disk_configs;
mod durability;
mod fetch;
mod grafana;
mod groups;
mod harness;
mod ingest;
mod netns;
mod operations;
mod produce_consume;
mod quotas;
mod search;
mod security;
mod share_groups;
mod share_groups_cluster;
mod telemetry;
mod transactions;
