//! spate-bench: a benchmark harness for any Kafka-compatible broker.
//!
//! The library drives brokers through librdkafka (the `rdkafka` crate) and counts only what
//! the broker acknowledged. The binary (`src/main.rs`) is a thin shell around [`runner::run`]
//! and [`compare::run_compare`].

pub mod apiversions;
pub mod cli;
pub mod client;
pub mod compare;
pub mod config;
pub mod consumer;
pub mod error;
pub mod follow;
pub mod histogram;
pub mod metadata;
pub mod payload;
pub mod producer;
pub mod progress;
pub mod prometheus;
pub mod report;
pub mod roundtrip;
pub mod runner;
pub mod stats;
pub mod sysinfo;
pub mod validate;

pub use config::RunConfig;
pub use error::BenchError;
