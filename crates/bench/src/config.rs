//! The validated configuration of one benchmark run (built by `cli`, or by `compare` per case).

use std::time::Duration;

use clap::ValueEnum;
use serde::{Serialize, Serializer};

use crate::error::{BenchError, Result};

/// What a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Producers only; latency = enqueue to delivery report.
    Produce,
    /// Consumers read a pre-filled topic; throughput only.
    Consume,
    /// Producers and consumers at once; latency = produce timestamp to consumption.
    RoundTrip,
    /// Times Metadata / CreateTopics / DeleteTopics / ListOffsets calls.
    Metadata,
}

impl Mode {
    /// The flag spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Produce => "produce",
            Mode::Consume => "consume",
            Mode::RoundTrip => "round-trip",
            Mode::Metadata => "metadata",
        }
    }
}

/// Producer acknowledgement level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
pub enum Acks {
    /// Fire and forget: a "delivery" only means written to the socket.
    #[value(name = "0")]
    #[serde(rename = "0")]
    None,
    /// Leader acknowledgement.
    #[value(name = "1")]
    #[serde(rename = "1")]
    Leader,
    /// All in-sync replicas.
    #[value(name = "all")]
    #[serde(rename = "all")]
    All,
}

impl Acks {
    /// The librdkafka `acks` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Acks::None => "0",
            Acks::Leader => "1",
            Acks::All => "all",
        }
    }
}

/// Producer compression codec.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// No compression.
    None,
    /// gzip.
    Gzip,
    /// snappy.
    Snappy,
    /// lz4.
    Lz4,
    /// zstd.
    Zstd,
}

impl Compression {
    /// The librdkafka `compression.codec` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

/// How message keys are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyPattern {
    /// No key (the partitioner spreads batches; what Kafka's perf tool does).
    None,
    /// A pseudo-random 16-hex-digit key per message.
    Random,
    /// The message's sequence number in decimal.
    Sequential,
    /// The same key for every message (one partition gets everything).
    Fixed,
}

/// What message bodies contain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadPattern {
    /// Incompressible pseudo-random bytes.
    Random,
    /// All zero bytes (maximally compressible).
    Zeros,
    /// English-like words (compresses like logs do).
    Text,
}

/// Serialises a `Duration` as fractional seconds.
fn secs<S: Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// Everything one run needs; validated by [`RunConfig::validate`].
#[derive(Clone, Debug, Serialize)]
pub struct RunConfig {
    /// Bootstrap servers, comma separated.
    pub bootstrap: String,
    /// Topic to use.
    pub topic: String,
    /// What to measure.
    pub mode: Mode,
    /// Number of producers (and consumers in round-trip / consume).
    pub concurrency: usize,
    /// Message value size in bytes.
    pub message_size: usize,
    /// Measured duration (after warm-up).
    #[serde(serialize_with = "secs", rename = "duration_s")]
    pub duration: Duration,
    /// Warm-up time whose results are discarded.
    #[serde(serialize_with = "secs", rename = "warmup_s")]
    pub warmup: Duration,
    /// Measured messages (or metadata cycles) in total; the run ends at whichever limit comes first.
    pub message_count: Option<u64>,
    /// Producer acks.
    pub acks: Acks,
    /// Producer compression.
    pub compression: Compression,
    /// librdkafka `linger.ms`, if set.
    pub linger_ms: Option<u64>,
    /// librdkafka `batch.size`, if set.
    pub batch_size: Option<u64>,
    /// Partitions when creating the topic.
    pub partitions: i32,
    /// Replication factor when creating the topic.
    pub replication_factor: i32,
    /// Create the topic before the run.
    pub create_topic: bool,
    /// Delete the topic after the run.
    pub delete_topic_after: bool,
    /// Total messages per second across producers.
    pub rate_limit: Option<u64>,
    /// Key choice.
    pub key_pattern: KeyPattern,
    /// Distinct keys with `KeyPattern::Sequential`: the key of sequence `seq` is `seq % n`
    /// (a bounded key space, so a compacted topic has records to remove). `None`: unbounded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_space: Option<u64>,
    /// Body content.
    pub payload_pattern: PayloadPattern,
    /// Embed sequence + checksum and verify every message on the consumer side.
    pub validate: bool,
    /// Progress line interval.
    #[serde(serialize_with = "secs", rename = "report_interval_s")]
    pub report_interval: Duration,
    /// Extra librdkafka properties (`-X key=value`), applied last.
    pub extra: Vec<(String, String)>,
    /// Show live progress on stderr.
    #[serde(skip)]
    pub progress: bool,
    /// Bound on every blocking client call (metadata, admin, flush, drain).
    #[serde(serialize_with = "secs", rename = "timeout_s")]
    pub timeout: Duration,
    /// Messages to pre-fill a topic with in consume mode when it is empty.
    pub fill_count: u64,
    /// Serve live counters for Prometheus on this address.
    #[serde(skip)]
    pub prometheus: Option<std::net::SocketAddr>,
    /// Broker process to sample for CPU/RSS during the measured phase.
    pub broker_pid: Option<u32>,
}

/// The smallest message that can carry the validation / timestamp header.
pub const MIN_HEADER_MESSAGE: usize = crate::payload::HEADER_LEN;
/// Upper bound on message size; a benchmark of bigger messages is a misconfiguration.
pub const MAX_MESSAGE_SIZE: usize = 64 * 1024 * 1024;
/// Upper bound on concurrency: each producer is a librdkafka instance with its own threads.
pub const MAX_CONCURRENCY: usize = 1024;

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            bootstrap: "127.0.0.1:9092".into(),
            topic: "spate-bench".into(),
            mode: Mode::Produce,
            concurrency: 1,
            message_size: 1024,
            duration: Duration::from_secs(10),
            warmup: Duration::ZERO,
            message_count: None,
            acks: Acks::All,
            compression: Compression::None,
            linger_ms: None,
            batch_size: None,
            partitions: 1,
            replication_factor: 1,
            create_topic: false,
            delete_topic_after: false,
            rate_limit: None,
            key_pattern: KeyPattern::None,
            key_space: None,
            payload_pattern: PayloadPattern::Random,
            validate: false,
            report_interval: Duration::from_secs(1),
            extra: Vec::new(),
            progress: true,
            timeout: Duration::from_secs(30),
            fill_count: 500_000,
            prometheus: None,
            broker_pid: None,
        }
    }
}

impl RunConfig {
    /// Rejects combinations that cannot produce a meaningful run.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(BenchError::Config(m));
        if self.bootstrap.trim().is_empty() {
            return bad("--bootstrap-servers is empty".into());
        }
        if self.topic.is_empty() || self.topic.len() > 200 {
            return bad("--topic must be 1..=200 characters".into());
        }
        if self.concurrency == 0 || self.concurrency > MAX_CONCURRENCY {
            return bad(format!("--concurrency must be 1..={MAX_CONCURRENCY}"));
        }
        if self.message_size > MAX_MESSAGE_SIZE {
            return bad(format!("--message-size must be at most {MAX_MESSAGE_SIZE}"));
        }
        if self.needs_header() && self.message_size < MIN_HEADER_MESSAGE {
            return bad(format!(
                "--message-size must be at least {MIN_HEADER_MESSAGE} bytes with --validate or round-trip mode (sequence, timestamp and checksum live in the message)"
            ));
        }
        if self.duration.is_zero() && self.message_count.is_none() {
            return bad("give a --duration or a --message-count".into());
        }
        if self.message_count == Some(0) {
            return bad("--message-count must be positive".into());
        }
        if self.key_space == Some(0) {
            return bad("--key-space must be positive".into());
        }
        if self.key_space.is_some() && self.key_pattern != KeyPattern::Sequential {
            return bad(
                "--key-space bounds sequential keys: it needs --key-pattern sequential (the default with --key-space)".into(),
            );
        }
        if self.rate_limit == Some(0) {
            return bad("--rate-limit must be positive".into());
        }
        if self.partitions < 1 || self.replication_factor < 1 {
            return bad("--partitions and --replication-factor must be positive".into());
        }
        if self.report_interval < Duration::from_millis(100) {
            return bad("--report-interval must be at least 100ms".into());
        }
        Ok(())
    }

    /// True when messages must carry the sequence/timestamp/checksum header.
    pub fn needs_header(&self) -> bool {
        self.validate || self.mode == Mode::RoundTrip
    }

    /// True when the producer is idempotent (explicitly or through `-X`).
    pub fn idempotent(&self) -> bool {
        self.extra
            .iter()
            .rev()
            .find(|(k, _)| k == "enable.idempotence")
            .map(|(_, v)| v == "true")
            .unwrap_or(false)
    }

    /// The whole run must finish by this point (plus drain time).
    pub fn measured_limit(&self) -> Option<Duration> {
        if self.duration.is_zero() {
            None
        } else {
            Some(self.warmup + self.duration)
        }
    }
}

/// Parses "10", "10s", "250ms", "2m", "1h", "1.5s" into a `Duration`.
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let t = text.trim();
    let (num, unit) = match t.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration '{text}' (examples: 10s, 500ms, 2m)"))?;
    let scale = match unit {
        "ms" => 0.001,
        "s" | "" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(format!(
                "invalid duration unit in '{text}' (use ms, s, m or h)"
            ))
        }
    };
    let secs = value * scale;
    if !secs.is_finite() || !(0.0..=7.0 * 86400.0).contains(&secs) {
        return Err(format!("duration '{text}' out of range (0..7 days)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses one `-X key=value` librdkafka property.
pub fn parse_property(text: &str) -> std::result::Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("expected key=value, got '{text}'")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn properties() {
        assert_eq!(
            parse_property("linger.ms=5"),
            Ok(("linger.ms".into(), "5".into()))
        );
        assert_eq!(parse_property("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(parse_property("novalue").is_err());
        assert!(parse_property("=x").is_err());
    }

    #[test]
    fn validation_rules() {
        let ok = RunConfig::default();
        assert!(ok.validate().is_ok());
        let small = RunConfig {
            validate: true,
            message_size: 10,
            ..RunConfig::default()
        };
        assert!(small.validate().is_err());
        let unbounded = RunConfig {
            duration: Duration::ZERO,
            ..RunConfig::default()
        };
        assert!(unbounded.validate().is_err());
        let counted = RunConfig {
            duration: Duration::ZERO,
            message_count: Some(10),
            ..RunConfig::default()
        };
        assert!(counted.validate().is_ok());
    }

    #[test]
    fn key_space_needs_sequential_keys() {
        let bounded = RunConfig {
            key_pattern: KeyPattern::Sequential,
            key_space: Some(50_000),
            ..RunConfig::default()
        };
        assert!(bounded.validate().is_ok());
        for keys in [KeyPattern::None, KeyPattern::Random, KeyPattern::Fixed] {
            let c = RunConfig {
                key_pattern: keys,
                ..bounded.clone()
            };
            assert!(c.validate().is_err(), "{keys:?} with --key-space");
        }
        let zero = RunConfig {
            key_space: Some(0),
            ..bounded
        };
        assert!(zero.validate().is_err());
    }

    #[test]
    fn idempotence_from_extra_properties() {
        let mut c = RunConfig::default();
        assert!(!c.idempotent());
        c.extra.push(("enable.idempotence".into(), "true".into()));
        assert!(c.idempotent());
    }
}
