//! The result model of a run and of a comparison, and its writers (console, JSON, CSV, HTML).

pub mod console;
pub mod csv;
pub mod html;
pub mod json;

use serde::Serialize;

use crate::config::{Mode, RunConfig};
use crate::histogram::LatencySummary;
use crate::stats::ErrorCounts;
use crate::sysinfo::{BrokerInfo, ResourceUsage, SystemInfo};
use crate::validate::ValidationReport;

/// Bytes per MiB: throughput is reported in MiB/s and labelled so.
pub const MIB: f64 = 1024.0 * 1024.0;

/// Producer-side results. Only delivery reports count: a message sitting in the client's
/// queue is neither delivered nor failed.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ProduceSummary {
    /// Measured messages handed to the client (accepted or rejected at enqueue).
    pub attempted: u64,
    /// Successful delivery reports (acknowledged by the broker, per --acks).
    pub delivered: u64,
    /// Failed delivery reports plus enqueue rejections.
    pub failed: u64,
    /// delivered / (delivered + failed); 1.0 when nothing was attempted.
    pub success_rate: f64,
    /// Key + value bytes delivered.
    pub bytes: u64,
    /// Delivered messages per second over the measured window.
    pub msgs_per_sec: f64,
    /// Delivered MiB per second over the measured window.
    pub mib_per_sec: f64,
    /// Measured window: warm-up end to the last delivery report.
    pub elapsed_s: f64,
    /// Failures by error code.
    pub errors: ErrorCounts,
    /// Messages delivered during warm-up (excluded above).
    pub warmup_delivered: u64,
    /// Enqueue-to-delivery-report latency.
    pub latency_us: Option<LatencySummary>,
}

/// Consumer-side results.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ConsumeSummary {
    /// Measured messages consumed.
    pub consumed: u64,
    /// Key + value bytes consumed.
    pub bytes: u64,
    /// Messages per second over the measured window.
    pub msgs_per_sec: f64,
    /// MiB per second over the measured window.
    pub mib_per_sec: f64,
    /// Measured window.
    pub elapsed_s: f64,
    /// Consumer errors by code.
    pub errors: ErrorCounts,
    /// Produce-timestamp-to-consumption latency (round-trip mode).
    pub latency_us: Option<LatencySummary>,
}

/// One timed admin/metadata operation kind.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OpSummary {
    /// Operation name (Metadata, CreateTopics, DeleteTopics, ListOffsets).
    pub op: String,
    /// Successful calls.
    pub ok: u64,
    /// Failed calls by error code.
    pub errors: ErrorCounts,
    /// Successful calls per second.
    pub ops_per_sec: f64,
    /// Call latency.
    pub latency_us: Option<LatencySummary>,
}

/// What the benchmark client itself used (to show the harness is not the bottleneck).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClientUsage {
    /// CPU seconds (user + system) of the spate-bench process during the run.
    pub cpu_seconds: f64,
    /// Peak resident memory of the spate-bench process in MiB.
    pub rss_peak_mib: f64,
    /// librdkafka version string.
    pub librdkafka: String,
}

/// Everything one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// Always "spate-bench".
    pub tool: String,
    /// spate-bench version.
    pub version: String,
    /// Run mode.
    pub mode: Mode,
    /// Unix time (ms) the run started.
    pub started_unix_ms: u64,
    /// True when Ctrl-C (or an abort) cut the run short.
    pub interrupted: bool,
    /// The configuration used.
    pub config: RunConfig,
    /// Producer results (produce and round-trip modes).
    pub produce: Option<ProduceSummary>,
    /// Consumer results (consume and round-trip modes).
    pub consume: Option<ConsumeSummary>,
    /// Timed operations (metadata mode).
    pub operations: Vec<OpSummary>,
    /// Integrity results (with --validate).
    pub validation: Option<ValidationReport>,
    /// Resources used by the benchmark client.
    pub client: ClientUsage,
    /// Broker CPU/RSS during the measured phase (with --broker-pid).
    pub broker_resources: Option<ResourceUsage>,
    /// Things the reader should know (e.g. "acks=0: delivered means written to the socket").
    pub notes: Vec<String>,
}

impl RunReport {
    /// The headline rate of the run: delivered msgs/s, else consumed msgs/s, else ops/s.
    pub fn headline_rate(&self) -> f64 {
        if let Some(p) = &self.produce {
            return p.msgs_per_sec;
        }
        if let Some(c) = &self.consume {
            return c.msgs_per_sec;
        }
        self.operations.iter().map(|o| o.ops_per_sec).sum()
    }

    /// The headline latency of the run (round-trip for round-trip, else produce, else ops).
    pub fn headline_latency(&self) -> Option<&LatencySummary> {
        if self.mode == Mode::RoundTrip {
            if let Some(l) = self.consume.as_ref().and_then(|c| c.latency_us.as_ref()) {
                return Some(l);
            }
        }
        if let Some(l) = self.produce.as_ref().and_then(|p| p.latency_us.as_ref()) {
            return Some(l);
        }
        self.operations.iter().find_map(|o| o.latency_us.as_ref())
    }

    /// The headline MiB/s of the run.
    pub fn headline_mib(&self) -> f64 {
        if let Some(p) = &self.produce {
            return p.mib_per_sec;
        }
        self.consume.as_ref().map(|c| c.mib_per_sec).unwrap_or(0.0)
    }

    /// Total errors across sides and operations.
    pub fn error_total(&self) -> u64 {
        self.produce.as_ref().map(|p| p.errors.total()).unwrap_or(0)
            + self.consume.as_ref().map(|c| c.errors.total()).unwrap_or(0)
            + self
                .operations
                .iter()
                .map(|o| o.errors.total())
                .sum::<u64>()
    }
}

/// One target of a comparison.
#[derive(Clone, Debug, Serialize)]
pub struct TargetReport {
    /// Name given on the command line.
    pub name: String,
    /// Bootstrap address.
    pub bootstrap: String,
    /// Broker pid sampled for CPU/RSS, if given.
    pub pid: Option<u32>,
    /// What the broker said about itself (ApiVersions, Metadata).
    pub broker: Option<BrokerInfo>,
}

/// One target's result in one case.
#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    /// Target name.
    pub target: String,
    /// The measured run (None when the run failed; see `error`).
    pub run: Option<RunReport>,
    /// Why the run failed.
    pub error: Option<String>,
    /// Broker CPU/RSS during the run, when its pid was given.
    pub broker_resources: Option<ResourceUsage>,
}

/// One case of a suite with every target's result.
#[derive(Clone, Debug, Serialize)]
pub struct CaseReport {
    /// Short id, e.g. "produce-1kb-x4".
    pub name: String,
    /// What the case measures.
    pub description: String,
    /// Results in target order.
    pub results: Vec<CaseResult>,
}

/// A whole comparison.
#[derive(Clone, Debug, Serialize)]
pub struct CompareReport {
    /// Always "spate-bench".
    pub tool: String,
    /// spate-bench version.
    pub version: String,
    /// Suite name.
    pub suite: String,
    /// Unix time (ms) the comparison started.
    pub started_unix_ms: u64,
    /// Machine the comparison ran on.
    pub system: SystemInfo,
    /// Targets in command-line order (the first is the baseline of ratios).
    pub targets: Vec<TargetReport>,
    /// Cases in suite order.
    pub cases: Vec<CaseReport>,
    /// True when Ctrl-C cut the comparison short.
    pub interrupted: bool,
}

/// Formats a count with thousands separators ("1,234,567").
pub fn thousands(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Formats microseconds for humans: "850 µs", "12.3 ms", "1.52 s".
pub fn fmt_us(us: u64) -> String {
    if us < 1_000 {
        format!("{us} µs")
    } else if us < 1_000_000 {
        format!("{:.2} ms", us as f64 / 1_000.0)
    } else {
        format!("{:.2} s", us as f64 / 1_000_000.0)
    }
}

/// A success rate as a percentage that never rounds a failure up to "100%".
pub fn pct(rate: f64) -> String {
    if rate >= 1.0 {
        return "100%".into();
    }
    for decimals in 2..=6 {
        let s = format!("{:.*}", decimals, rate * 100.0);
        if !s.starts_with("100") {
            return s + "%";
        }
    }
    "99.999999%".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_never_hide_failures() {
        assert_eq!(pct(1.0), "100%");
        assert_eq!(pct(0.5), "50.00%");
        assert_eq!(pct(1_000_000.0 / 1_000_003.0), "99.9997%");
        assert_eq!(pct(0.0), "0.00%");
    }

    #[test]
    fn formatting() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(fmt_us(850), "850 µs");
        assert_eq!(fmt_us(12_345), "12.35 ms");
        assert_eq!(fmt_us(1_520_000), "1.52 s");
    }
}
