//! Facts about the machine (for reports) and CPU/RSS sampling of a process via /proc.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::apiversions::ApiRange;

/// /proc/<pid>/stat reports CPU time in USER_HZ, which Linux fixes at 100 for user space.
const USER_HZ: f64 = 100.0;
/// Sampling period of the broker CPU/RSS sampler.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// The machine a run happened on.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SystemInfo {
    /// OS name from /etc/os-release.
    pub os: String,
    /// Kernel release.
    pub kernel: String,
    /// CPU architecture.
    pub arch: String,
    /// CPU model name.
    pub cpu_model: String,
    /// Logical CPUs available to this process.
    pub cpu_count: usize,
    /// Total memory in MiB.
    pub memory_mib: u64,
    /// librdkafka version the client uses.
    pub librdkafka: String,
    /// spate-bench version.
    pub spate_bench: String,
}

/// What a broker says about itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BrokerInfo {
    /// Cluster id from Metadata.
    pub cluster_id: Option<String>,
    /// Brokers listed in Metadata ("id@host:port").
    pub brokers: Vec<String>,
    /// ApiVersions ranges (named where we know the API).
    pub api_versions: Vec<ApiRange>,
    /// Why ApiVersions could not be read, if it could not.
    pub api_versions_error: Option<String>,
}

/// CPU and memory a process used during a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ResourceUsage {
    /// User + system CPU seconds during the run.
    pub cpu_seconds: f64,
    /// cpu_seconds / wall seconds.
    pub avg_cores: f64,
    /// Highest resident set size seen, MiB.
    pub rss_peak_mib: f64,
    /// Mean resident set size, MiB.
    pub rss_avg_mib: f64,
    /// Number of samples taken.
    pub samples: u64,
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Collects system facts; fields that cannot be read stay empty rather than failing a run.
pub fn system_info() -> SystemInfo {
    let os = read("/etc/os-release")
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_else(|| std::env::consts::OS.to_string());
    let kernel = read("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let cpu_model = read("/proc/cpuinfo")
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name") || l.starts_with("Model"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    let memory_mib = read("/proc/meminfo")
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("MemTotal:")).map(kib))
        .map(|k| k / 1024)
        .unwrap_or(0);
    SystemInfo {
        os,
        kernel,
        arch: std::env::consts::ARCH.to_string(),
        cpu_model,
        cpu_count: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory_mib,
        librdkafka: crate::client::librdkafka_version(),
        spate_bench: env!("CARGO_PKG_VERSION").to_string(),
    }
}

/// Parses "  123456 kB" into 123456.
fn kib(s: &str) -> u64 {
    s.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// User + system CPU seconds of a process (`"self"` or a pid).
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = read(&format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may contain spaces; fields after ") " are plain.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 overall: 12 and 13 after the name.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

/// Resident set size of a process in MiB (`field` is "VmRSS" or "VmHWM" for the peak).
pub fn rss_mib(pid: &str, field: &str) -> Option<f64> {
    let status = read(&format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .map(|v| kib(v) as f64 / 1024.0)
}

/// Samples a process's CPU and RSS in a background thread until finished.
pub struct ProcessSampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<ResourceUsage>>,
}

impl ProcessSampler {
    /// Starts sampling `pid`; returns `None` when the process does not exist.
    pub fn start(pid: u32) -> Option<Self> {
        let id = pid.to_string();
        let cpu0 = cpu_seconds(&id)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("broker-sampler".into())
            .spawn(move || {
                let t0 = Instant::now();
                let (mut peak, mut sum, mut n) = (0.0f64, 0.0f64, 0u64);
                let mut cpu_last = cpu0;
                loop {
                    if let Some(r) = rss_mib(&id, "VmRSS") {
                        peak = peak.max(r);
                        sum += r;
                        n += 1;
                    }
                    if let Some(c) = cpu_seconds(&id) {
                        cpu_last = c;
                    }
                    if flag.load(Ordering::Relaxed) {
                        break;
                    }
                    std::thread::sleep(SAMPLE_EVERY);
                }
                let wall = t0.elapsed().as_secs_f64().max(1e-9);
                let cpu = (cpu_last - cpu0).max(0.0);
                ResourceUsage {
                    cpu_seconds: round3(cpu),
                    avg_cores: round3(cpu / wall),
                    rss_peak_mib: round3(peak),
                    rss_avg_mib: round3(if n > 0 { sum / n as f64 } else { 0.0 }),
                    samples: n,
                }
            })
            .ok()?;
        Some(Self {
            stop,
            handle: Some(handle),
        })
    }

    /// Stops sampling and returns what was measured.
    pub fn finish(mut self) -> Option<ResourceUsage> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take()?.join().ok()
    }
}

impl Drop for ProcessSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Rounds to three decimals for stable reports.
pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        assert!(cpu_seconds("self").is_some());
        assert!(rss_mib("self", "VmRSS").is_some_and(|r| r > 0.0));
        let info = system_info();
        assert!(info.cpu_count >= 1);
        assert!(!info.kernel.is_empty());
    }

    #[test]
    fn samples_a_process() {
        let s = ProcessSampler::start(std::process::id()).expect("own pid exists");
        std::thread::sleep(Duration::from_millis(250));
        let u = s.finish().expect("sampler joined");
        assert!(u.samples >= 1);
        assert!(u.rss_peak_mib > 0.0);
    }

    #[test]
    fn missing_process_is_none() {
        assert!(ProcessSampler::start(u32::MAX - 1).is_none());
    }
}
