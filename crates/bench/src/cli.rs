//! Command-line parsing: flags to a validated [`RunConfig`] or a comparison request.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{
    parse_duration, parse_property, Acks, Compression, KeyPattern, Mode, PayloadPattern, RunConfig,
};
use crate::error::{BenchError, Result};

/// Benchmark any Kafka-compatible broker through librdkafka.
#[derive(Parser, Debug)]
#[command(
    name = "spate-bench",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// `compare` runs a suite against several brokers; without it, one run is made.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Flags of a single run.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a suite against every --target in the same run, interleaved, and report ratios.
    Compare(CompareArgs),
    /// Consume as a consumer group until stopped (or for --duration), serving consumed
    /// records, lag and end-to-end latency for Prometheus.
    Consume(ConsumeArgs),
}

/// Flags of the long-running `consume` subcommand.
#[derive(Args, Debug, Clone)]
pub struct ConsumeArgs {
    /// Bootstrap servers (host:port[,host:port...]).
    #[arg(
        short = 'b',
        long = "bootstrap-servers",
        default_value = "127.0.0.1:9092"
    )]
    pub bootstrap: String,
    /// Topics to subscribe to (comma-separated).
    #[arg(short = 't', long, value_delimiter = ',', required = true)]
    pub topic: Vec<String>,
    /// Consumer group id.
    #[arg(short = 'g', long, default_value = "spate-bench-consume")]
    pub group: String,
    /// Group members in this process (one thread each).
    #[arg(short = 'c', long, default_value_t = 1)]
    pub concurrency: usize,
    /// Port of the Prometheus endpoint (/metrics).
    #[arg(long = "prometheus-port", default_value_t = 9465)]
    pub prometheus_port: u16,
    /// Address the Prometheus endpoint binds to.
    #[arg(long = "prometheus-bind", default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub prometheus_bind: IpAddr,
    /// Stop after this long (e.g. 10m); unlimited by default (Ctrl-C stops).
    #[arg(short = 'd', long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Where a group without committed offsets starts: earliest or latest.
    #[arg(long, default_value = "latest", value_parser = ["earliest", "latest"])]
    pub start: String,
    /// Interval of progress lines and lag statistics.
    #[arg(long = "report-interval", default_value = "5s", value_parser = parse_duration)]
    pub report_interval: Duration,
    /// Any librdkafka property, e.g. -X fetch.wait.max.ms=50 (repeatable, applied last).
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = parse_property)]
    pub extra: Vec<(String, String)>,
}

impl ConsumeArgs {
    /// The follow configuration.
    pub fn to_config(&self) -> crate::follow::FollowConfig {
        crate::follow::FollowConfig {
            bootstrap: self.bootstrap.clone(),
            topics: self.topic.clone(),
            group: self.group.clone(),
            consumers: self.concurrency.max(1),
            prometheus: SocketAddr::new(self.prometheus_bind, self.prometheus_port),
            duration: self.duration.filter(|d| !d.is_zero()),
            start: self.start.clone(),
            report_interval: self.report_interval.max(Duration::from_millis(100)),
            extra: self.extra.clone(),
        }
    }
}

/// Flags of a single run.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Bootstrap servers (host:port[,host:port...]).
    #[arg(
        short = 'b',
        long = "bootstrap-servers",
        default_value = "127.0.0.1:9092"
    )]
    pub bootstrap: String,
    /// Topic to produce to / consume from.
    #[arg(short = 't', long, default_value = "spate-bench")]
    pub topic: String,
    /// Number of producers (and consumers in consume / round-trip mode).
    #[arg(short = 'c', long, default_value_t = 1)]
    pub concurrency: usize,
    /// Message value size in bytes.
    #[arg(short = 's', long = "message-size", default_value_t = 1024)]
    pub message_size: usize,
    /// Measured duration, e.g. 30s, 2m (default 10s, or unlimited when -n is given; 0 = unlimited).
    #[arg(short = 'd', long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Warm-up time excluded from results.
    #[arg(short = 'w', long, default_value = "0s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Measured messages in total (metadata mode: cycles).
    #[arg(short = 'n', long = "message-count")]
    pub message_count: Option<u64>,
    /// What to measure.
    #[arg(short = 'm', long, value_enum, default_value = "produce")]
    pub mode: Mode,
    /// Producer acknowledgements.
    #[arg(long, value_enum, default_value = "all")]
    pub acks: Acks,
    /// Producer compression codec.
    #[arg(long, value_enum, default_value = "none")]
    pub compression: Compression,
    /// librdkafka linger.ms (client default when unset).
    #[arg(long = "linger-ms")]
    pub linger_ms: Option<u64>,
    /// librdkafka batch.size in bytes (client default when unset).
    #[arg(long = "batch-size")]
    pub batch_size: Option<u64>,
    /// Partitions for --create-topic.
    #[arg(short = 'p', long, default_value_t = 1)]
    pub partitions: i32,
    /// Replication factor for --create-topic.
    #[arg(short = 'r', long = "replication-factor", default_value_t = 1)]
    pub replication_factor: i32,
    /// Create the topic first (an existing topic is reused).
    #[arg(long = "create-topic")]
    pub create_topic: bool,
    /// Delete the topic when done.
    #[arg(long = "delete-topic-after")]
    pub delete_topic_after: bool,
    /// Total messages per second across all producers.
    #[arg(long = "rate-limit")]
    pub rate_limit: Option<u64>,
    /// Message keys [default: none; sequential with --key-space].
    #[arg(long = "key-pattern", value_enum)]
    pub key_pattern: Option<KeyPattern>,
    /// Bound the key space to N distinct keys: the key of sequence number seq is seq % N in
    /// decimal, so later records supersede earlier ones (a data set for compacted topics).
    /// Implies --key-pattern sequential; each producer counts its own sequence.
    #[arg(long = "key-space", value_name = "N")]
    pub key_space: Option<u64>,
    /// Message bodies.
    #[arg(long = "payload-pattern", value_enum, default_value = "random")]
    pub payload_pattern: PayloadPattern,
    /// Embed sequence + checksum and verify content, loss, duplicates and order.
    #[arg(long)]
    pub validate: bool,
    /// Append a CSV row to this file (header written when the file is new).
    #[arg(long = "csv-output")]
    pub csv_output: Option<PathBuf>,
    /// Write the JSON report to this file.
    #[arg(long = "json-output")]
    pub json_output: Option<PathBuf>,
    /// Serve live counters for Prometheus on this port.
    #[arg(long = "prometheus-port")]
    pub prometheus_port: Option<u16>,
    /// Address the Prometheus endpoint binds to.
    #[arg(long = "prometheus-bind", default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub prometheus_bind: IpAddr,
    /// Interval of progress lines.
    #[arg(long = "report-interval", default_value = "1s", value_parser = parse_duration)]
    pub report_interval: Duration,
    /// Any librdkafka property, e.g. -X linger.ms=5 (repeatable, applied last).
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = parse_property)]
    pub extra: Vec<(String, String)>,
    /// Bound on every blocking client call (metadata, admin, flush).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Messages written first in consume mode when the topic is empty.
    #[arg(long = "fill-count", default_value_t = 500_000)]
    pub fill_count: u64,
    /// No live progress on stderr.
    #[arg(long = "no-progress")]
    pub no_progress: bool,
    /// Sample this broker process's CPU and RSS during the measured phase.
    #[arg(long = "broker-pid")]
    pub broker_pid: Option<u32>,
}

impl RunArgs {
    /// Builds and validates the run configuration.
    pub fn to_config(&self) -> Result<RunConfig> {
        let duration = match (self.duration, self.message_count) {
            (Some(d), _) => d,
            (None, Some(_)) => Duration::ZERO,
            (None, None) => Duration::from_secs(10),
        };
        let cfg = RunConfig {
            bootstrap: self.bootstrap.clone(),
            topic: self.topic.clone(),
            mode: self.mode,
            concurrency: self.concurrency,
            message_size: self.message_size,
            duration,
            warmup: self.warmup,
            message_count: self.message_count,
            acks: self.acks,
            compression: self.compression,
            linger_ms: self.linger_ms,
            batch_size: self.batch_size,
            partitions: self.partitions,
            replication_factor: self.replication_factor,
            create_topic: self.create_topic,
            delete_topic_after: self.delete_topic_after,
            rate_limit: self.rate_limit,
            key_pattern: self.key_pattern.unwrap_or(if self.key_space.is_some() {
                KeyPattern::Sequential
            } else {
                KeyPattern::None
            }),
            key_space: self.key_space,
            payload_pattern: self.payload_pattern,
            validate: self.validate,
            report_interval: self.report_interval,
            extra: self.extra.clone(),
            progress: !self.no_progress,
            timeout: self.timeout,
            fill_count: self.fill_count,
            prometheus: self
                .prometheus_port
                .map(|p| SocketAddr::new(self.prometheus_bind, p)),
            broker_pid: self.broker_pid,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Which cases a comparison runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Suite {
    /// A few short cases (about a minute per target).
    Quick,
    /// The full matrix at 10 s per case.
    Standard,
    /// The full matrix at 30 s per case and a 2-minute sustained run.
    Full,
}

/// One broker to compare: NAME=BOOTSTRAP[,pid=PID].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Display name.
    pub name: String,
    /// Bootstrap servers.
    pub bootstrap: String,
    /// Broker process to sample for CPU/RSS.
    pub pid: Option<u32>,
}

/// Parses `NAME=HOST:PORT[,HOST:PORT...][,pid=PID]`.
pub fn parse_target(text: &str) -> std::result::Result<Target, String> {
    let (name, rest) = text
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=BOOTSTRAP[,pid=PID], got '{text}'"))?;
    let name = name.trim();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(format!(
            "target name '{name}' must be non-empty [A-Za-z0-9._-]"
        ));
    }
    let mut servers = Vec::new();
    let mut pid = None;
    for part in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some(p) = part.strip_prefix("pid=") {
            pid = Some(p.parse().map_err(|_| format!("invalid pid '{p}'"))?);
        } else {
            servers.push(part);
        }
    }
    if servers.is_empty() {
        return Err(format!("target '{name}' has no bootstrap address"));
    }
    Ok(Target {
        name: name.to_string(),
        bootstrap: servers.join(","),
        pid,
    })
}

/// Flags of `compare`.
#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// A broker: NAME=BOOTSTRAP[,pid=PID] (repeat; the first is the baseline of ratios).
    #[arg(long = "target", required = true, value_parser = parse_target)]
    pub targets: Vec<Target>,
    /// Which cases to run.
    #[arg(long, value_enum, default_value = "standard")]
    pub suite: Suite,
    /// Only run these cases: exact names, or prefixes ending in '*' (repeatable).
    #[arg(long = "case")]
    pub cases: Vec<String>,
    /// Override every case's measured duration (e.g. for a smoke test).
    #[arg(short = 'd', long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Override every case's warm-up.
    #[arg(short = 'w', long, value_parser = parse_duration)]
    pub warmup: Option<Duration>,
    /// Skip the integrity check after each case.
    #[arg(long = "no-validate")]
    pub no_validate: bool,
    /// Write the JSON report here.
    #[arg(long = "json-output")]
    pub json_output: Option<PathBuf>,
    /// Write one CSV row per case and target here.
    #[arg(long = "csv-output")]
    pub csv_output: Option<PathBuf>,
    /// Write the self-contained HTML report here.
    #[arg(long = "html-output", default_value = "spate-bench-report.html")]
    pub html_output: PathBuf,
    /// Any librdkafka property for every client (repeatable).
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = parse_property)]
    pub extra: Vec<(String, String)>,
    /// Bound on every blocking client call.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// No live progress on stderr.
    #[arg(long = "no-progress")]
    pub no_progress: bool,
}

impl CompareArgs {
    /// Rejects duplicate target names.
    pub fn check(&self) -> Result<()> {
        for (i, t) in self.targets.iter().enumerate() {
            if self.targets[..i].iter().any(|o| o.name == t.name) {
                return Err(BenchError::Config(format!(
                    "duplicate target name '{}'",
                    t.name
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> std::result::Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("spate-bench").chain(args.iter().copied()))
    }

    #[test]
    fn defaults() {
        let cli = parse(&[]).expect("defaults parse");
        assert!(cli.command.is_none());
        let cfg = cli.run.to_config().expect("valid");
        assert_eq!(cfg.mode, Mode::Produce);
        assert_eq!(cfg.duration, Duration::from_secs(10));
        assert_eq!(cfg.acks, Acks::All);
        assert_eq!(cfg.concurrency, 1);
    }

    #[test]
    fn every_flag() {
        let cli = parse(&[
            "-b",
            "127.0.0.1:19092",
            "-t",
            "bench",
            "-c",
            "8",
            "-s",
            "256",
            "-d",
            "30s",
            "-w",
            "2s",
            "-n",
            "1000",
            "-m",
            "round-trip",
            "--acks",
            "1",
            "--compression",
            "zstd",
            "--linger-ms",
            "5",
            "--batch-size",
            "131072",
            "-p",
            "6",
            "-r",
            "1",
            "--create-topic",
            "--delete-topic-after",
            "--rate-limit",
            "5000",
            "--key-pattern",
            "sequential",
            "--payload-pattern",
            "text",
            "--validate",
            "--csv-output",
            "out.csv",
            "--json-output",
            "out.json",
            "--prometheus-port",
            "9464",
            "--report-interval",
            "500ms",
            "-X",
            "queue.buffering.max.messages=200000",
            "-X",
            "enable.idempotence=false",
        ])
        .expect("parses");
        let cfg = cli.run.to_config().expect("valid");
        assert_eq!(cfg.bootstrap, "127.0.0.1:19092");
        assert_eq!(cfg.concurrency, 8);
        assert_eq!(cfg.mode, Mode::RoundTrip);
        assert_eq!(cfg.acks, Acks::Leader);
        assert_eq!(cfg.compression, Compression::Zstd);
        assert_eq!(cfg.duration, Duration::from_secs(30));
        assert_eq!(cfg.warmup, Duration::from_secs(2));
        assert_eq!(cfg.message_count, Some(1000));
        assert_eq!((cfg.linger_ms, cfg.batch_size), (Some(5), Some(131_072)));
        assert_eq!((cfg.partitions, cfg.replication_factor), (6, 1));
        assert!(cfg.create_topic && cfg.delete_topic_after && cfg.validate);
        assert_eq!(cfg.rate_limit, Some(5000));
        assert_eq!(cfg.key_pattern, KeyPattern::Sequential);
        assert_eq!(cfg.payload_pattern, PayloadPattern::Text);
        assert_eq!(cfg.report_interval, Duration::from_millis(500));
        assert_eq!(cfg.extra.len(), 2);
        assert_eq!(cfg.prometheus.map(|a| a.port()), Some(9464));
        assert_eq!(cli.run.csv_output, Some(PathBuf::from("out.csv")));
    }

    #[test]
    fn count_alone_means_no_time_limit() {
        let cfg = parse(&["-n", "500"])
            .expect("parses")
            .run
            .to_config()
            .expect("valid");
        assert_eq!(cfg.duration, Duration::ZERO);
        assert_eq!(cfg.message_count, Some(500));
    }

    #[test]
    fn key_space_implies_sequential_keys() {
        let cfg = parse(&["--key-space", "50000"])
            .expect("parses")
            .run
            .to_config()
            .expect("valid");
        assert_eq!(cfg.key_pattern, KeyPattern::Sequential);
        assert_eq!(cfg.key_space, Some(50_000));
        let plain = parse(&[]).expect("parses").run.to_config().expect("valid");
        assert_eq!(
            (plain.key_pattern, plain.key_space),
            (KeyPattern::None, None)
        );
        let random = parse(&["--key-space", "10", "--key-pattern", "random"]).expect("parses");
        assert!(random.run.to_config().is_err());
        assert!(parse(&["--key-space", "-1"]).is_err());
    }

    #[test]
    fn rejects_bad_values() {
        assert!(parse(&["--acks", "2"]).is_err());
        assert!(parse(&["-m", "stream"]).is_err());
        assert!(parse(&["--compression", "brotli"]).is_err());
        assert!(parse(&["-X", "novalue"]).is_err());
        assert!(parse(&["-d", "soon"]).is_err());
        let small = parse(&["--validate", "-s", "8"]).expect("parses");
        assert!(small.run.to_config().is_err());
        let zero = parse(&["-c", "0"]).expect("parses");
        assert!(zero.run.to_config().is_err());
    }

    #[test]
    fn compare_targets() {
        let cli = parse(&[
            "compare",
            "--target",
            "kafka=127.0.0.1:19092,pid=123",
            "--target",
            "spate=127.0.0.1:9092,127.0.0.1:9093",
            "--suite",
            "quick",
        ])
        .expect("parses");
        let Some(Command::Compare(c)) = cli.command else {
            panic!("expected compare");
        };
        assert_eq!(c.suite, Suite::Quick);
        assert_eq!(c.targets[0].pid, Some(123));
        assert_eq!(c.targets[1].bootstrap, "127.0.0.1:9092,127.0.0.1:9093");
        assert!(c.check().is_ok());
        assert!(parse(&["compare"]).is_err(), "a target is required");
        assert!(parse_target("nobootstrap").is_err());
        assert!(parse_target("x=,pid=1").is_err());
        assert!(parse_target("x=h:1,pid=abc").is_err());
    }
}
