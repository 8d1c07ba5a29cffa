//! The process's own CPU time, resident memory and open files, read from /proc at scrape time.

/// A snapshot of process resource use.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessStats {
    /// User + system CPU time in seconds.
    pub cpu_seconds: f64,
    /// Resident set size in bytes.
    pub resident_bytes: u64,
    /// Virtual memory size in bytes.
    pub virtual_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// Start time, seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

/// Reads the current process's stats; fields it cannot read stay zero.
pub fn read() -> ProcessStats {
    let mut s = ProcessStats::default();
    let ticks = clock_ticks_per_second();
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
            let f: Vec<&str> = rest.split_whitespace().collect();
            let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            s.cpu_seconds = (num(11) + num(12)) / ticks;
            s.virtual_bytes = num(20) as u64;
            let start_ticks = num(19);
            if let Some(boot) = boot_time() {
                s.start_time_seconds = boot + start_ticks / ticks;
            }
        }
    }
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        if let Some(kb) = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        {
            s.resident_bytes = kb * 1024;
        }
    }
    s.open_fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    s
}

/// USER_HZ, the unit of /proc CPU times: 100 on every mainstream Linux architecture.
fn clock_ticks_per_second() -> f64 {
    100.0
}

fn boot_time() -> Option<f64> {
    std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_own_process() {
        let s = super::read();
        assert!(s.resident_bytes > 0);
        assert!(s.open_fds > 0);
        assert!(s.start_time_seconds > 1_000_000_000.0);
    }
}
