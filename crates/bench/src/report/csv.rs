//! CSV writer: one row per run (and per case and target in a comparison).

use std::io::Write;
use std::path::Path;

use crate::error::{BenchError, Result};
use crate::report::{CompareReport, RunReport};
use crate::sysinfo::ResourceUsage;

/// Column names, in order.
pub const HEADER: &[&str] = &[
    "case",
    "target",
    "mode",
    "message_size",
    "concurrency",
    "acks",
    "compression",
    "attempted",
    "delivered",
    "failed",
    "success_rate",
    "produce_msgs_per_sec",
    "produce_mib_per_sec",
    "consumed",
    "consume_msgs_per_sec",
    "consume_mib_per_sec",
    "latency_kind",
    "p50_us",
    "p90_us",
    "p95_us",
    "p99_us",
    "p999_us",
    "max_us",
    "errors",
    "validation",
    "client_cpu_s",
    "broker_cpu_s",
    "broker_rss_peak_mib",
    "interrupted",
];

/// Quotes a field when it contains a separator, quote or newline.
fn field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// One CSV row (no newline) for a run.
pub fn row(case: &str, target: &str, r: &RunReport, broker: Option<&ResourceUsage>) -> String {
    let c = &r.config;
    let p = r.produce.as_ref();
    let co = r.consume.as_ref();
    let lat = r.headline_latency();
    let latency_kind = if r.mode == crate::config::Mode::RoundTrip
        && co.and_then(|c| c.latency_us.as_ref()).is_some()
    {
        "round-trip"
    } else if p.and_then(|p| p.latency_us.as_ref()).is_some() {
        "produce"
    } else if lat.is_some() {
        "operation"
    } else {
        ""
    };
    let opt = |v: Option<String>| v.unwrap_or_default();
    let validation = match &r.validation {
        Some(v) if v.passed => "passed",
        Some(_) => "FAILED",
        None => "",
    };
    let cells: Vec<String> = vec![
        case.to_string(),
        target.to_string(),
        r.mode.as_str().to_string(),
        c.message_size.to_string(),
        c.concurrency.to_string(),
        c.acks.as_str().to_string(),
        c.compression.as_str().to_string(),
        opt(p.map(|p| p.attempted.to_string())),
        opt(p.map(|p| p.delivered.to_string())),
        opt(p.map(|p| p.failed.to_string())),
        opt(p.map(|p| format!("{:.6}", p.success_rate))),
        opt(p.map(|p| format!("{:.1}", p.msgs_per_sec))),
        opt(p.map(|p| format!("{:.3}", p.mib_per_sec))),
        opt(co.map(|c| c.consumed.to_string())),
        opt(co.map(|c| format!("{:.1}", c.msgs_per_sec))),
        opt(co.map(|c| format!("{:.3}", c.mib_per_sec))),
        latency_kind.to_string(),
        opt(lat.map(|l| l.p50_us.to_string())),
        opt(lat.map(|l| l.p90_us.to_string())),
        opt(lat.map(|l| l.p95_us.to_string())),
        opt(lat.map(|l| l.p99_us.to_string())),
        opt(lat.map(|l| l.p999_us.to_string())),
        opt(lat.map(|l| l.max_us.to_string())),
        r.error_total().to_string(),
        validation.to_string(),
        format!("{:.3}", r.client.cpu_seconds),
        opt(broker.map(|b| format!("{:.3}", b.cpu_seconds))),
        opt(broker.map(|b| format!("{:.1}", b.rss_peak_mib))),
        r.interrupted.to_string(),
    ];
    cells.iter().map(|c| field(c)).collect::<Vec<_>>().join(",")
}

/// The header line (no newline).
pub fn header() -> String {
    HEADER.join(",")
}

/// A single run as CSV text (header + row).
pub fn run_csv(r: &RunReport) -> String {
    format!("{}\n{}\n", header(), row("", "", r, None))
}

/// A comparison as CSV text: one row per case and target that produced a result.
pub fn compare_csv(c: &CompareReport) -> String {
    let mut out = header() + "\n";
    for case in &c.cases {
        for res in &case.results {
            if let Some(run) = &res.run {
                out += &row(&case.name, &res.target, run, res.broker_resources.as_ref());
                out.push('\n');
            }
        }
    }
    out
}

/// Appends a run's row to `path`, writing the header first when the file is new or empty,
/// so repeated runs build one table.
pub fn append_run(r: &RunReport, path: &Path) -> Result<()> {
    let io = |e| BenchError::io(format!("writing {}", path.display()), e);
    let fresh = std::fs::metadata(path).map_or(true, |m| m.len() == 0);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    let text = if fresh {
        run_csv(r)
    } else {
        row("", "", r, None) + "\n"
    };
    f.write_all(text.as_bytes()).map_err(io)
}

/// Writes a comparison as CSV.
pub fn write_compare(c: &CompareReport, path: &Path) -> Result<()> {
    std::fs::write(path, compare_csv(c))
        .map_err(|e| BenchError::io(format!("writing {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(field("plain"), "plain");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
