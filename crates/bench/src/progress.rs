//! Live progress: an in-place status line on a terminal, plain periodic lines otherwise.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use crate::report::{fmt_us, thousands, MIB};

/// Cumulative counters of the running phase at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Phase name ("produce", "fill", "verify", "round-trip", "consume", "metadata").
    pub phase: String,
    /// Time since the phase started.
    pub elapsed: Duration,
    /// Successful delivery reports (including warm-up).
    pub delivered: u64,
    /// Bytes of those.
    pub delivered_bytes: u64,
    /// Failed deliveries and consumer/operation errors.
    pub errors: u64,
    /// Messages consumed (including warm-up).
    pub consumed: u64,
    /// Bytes of those.
    pub consumed_bytes: u64,
    /// Completed operations (metadata mode).
    pub operations: u64,
    /// p99 latency so far (µs), when computed for this snapshot.
    pub p99_us: Option<u64>,
}

/// Rates between two snapshots.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rates {
    /// Delivered (or consumed when nothing is produced, or operations) per second.
    pub per_sec: f64,
    /// MiB per second of the same.
    pub mib_per_sec: f64,
}

/// Computes the rate of the phase's main counter between `prev` and `cur`.
pub fn rates(prev: &Snapshot, cur: &Snapshot) -> Rates {
    let dt = cur.elapsed.saturating_sub(prev.elapsed).as_secs_f64();
    if dt <= 0.0 {
        return Rates::default();
    }
    let (n, b) = if cur.delivered > 0 || prev.delivered > 0 {
        (
            cur.delivered.saturating_sub(prev.delivered),
            cur.delivered_bytes.saturating_sub(prev.delivered_bytes),
        )
    } else if cur.consumed > 0 {
        (
            cur.consumed.saturating_sub(prev.consumed),
            cur.consumed_bytes.saturating_sub(prev.consumed_bytes),
        )
    } else {
        (cur.operations.saturating_sub(prev.operations), 0)
    };
    Rates {
        per_sec: n as f64 / dt,
        mib_per_sec: b as f64 / MIB / dt,
    }
}

/// One progress line (no newline).
pub fn format_line(s: &Snapshot, r: Rates) -> String {
    let mut line = format!("[{:>7.1}s] {:<10}", s.elapsed.as_secs_f64(), s.phase);
    if s.operations > 0 && s.delivered == 0 && s.consumed == 0 {
        line += &format!(
            " ops {:>9} ({:>9.0} op/s)",
            thousands(s.operations),
            r.per_sec
        );
    } else {
        if s.delivered > 0 || s.consumed == 0 {
            line += &format!(" delivered {:>12}", thousands(s.delivered));
        }
        if s.consumed > 0 {
            line += &format!(" consumed {:>12}", thousands(s.consumed));
        }
        line += &format!(
            " | {:>10} msg/s {:>8.1} MiB/s",
            thousands(r.per_sec.round() as u64),
            r.mib_per_sec
        );
    }
    if let Some(p) = s.p99_us {
        line += &format!(" | p99 {:>9}", fmt_us(p));
    }
    line += &format!(" | errors {}", thousands(s.errors));
    line
}

/// Writes progress lines to stderr (the caller decides when).
pub struct Progress {
    enabled: bool,
    tty: bool,
    last: Snapshot,
    dirty: bool,
}

impl Progress {
    /// A progress writer; disabled writers print nothing.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            tty: std::io::stderr().is_terminal(),
            last: Snapshot::default(),
            dirty: false,
        }
    }

    /// Prints one line for `snap` with rates since the previous line of the same phase.
    pub fn update(&mut self, snap: &Snapshot) {
        if !self.enabled {
            return;
        }
        if snap.phase != self.last.phase {
            self.last = Snapshot {
                phase: snap.phase.clone(),
                ..Snapshot::default()
            };
        }
        let line = format_line(snap, rates(&self.last, snap));
        let mut err = std::io::stderr().lock();
        // A closed stderr must not end the benchmark, so write errors are ignored.
        let _ = if self.tty {
            write!(err, "\r\x1b[2K{line}")
        } else {
            writeln!(err, "{line}")
        };
        let _ = err.flush();
        self.dirty = self.tty;
        self.last = snap.clone();
    }

    /// Ends the in-place line so the summary starts on a fresh line.
    pub fn finish(&mut self) {
        if self.dirty {
            let _ = writeln!(std::io::stderr());
            self.dirty = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_and_line() {
        let a = Snapshot {
            phase: "produce".into(),
            elapsed: Duration::from_secs(1),
            delivered: 1_000,
            delivered_bytes: 1_024_000,
            ..Snapshot::default()
        };
        let b = Snapshot {
            elapsed: Duration::from_secs(2),
            delivered: 3_000,
            delivered_bytes: 3_072_000,
            p99_us: Some(1_500),
            errors: 2,
            ..a.clone()
        };
        let r = rates(&a, &b);
        assert_eq!(r.per_sec, 2_000.0);
        assert!((r.mib_per_sec - 1.953).abs() < 0.01);
        let line = format_line(&b, r);
        assert!(line.contains("delivered        3,000"), "{line}");
        assert!(line.contains("2,000 msg/s"), "{line}");
        assert!(line.contains("p99   1.50 ms"), "{line}");
        assert!(line.ends_with("errors 2"), "{line}");
    }

    #[test]
    fn operations_line() {
        let s = Snapshot {
            phase: "metadata".into(),
            elapsed: Duration::from_secs(2),
            operations: 40,
            ..Snapshot::default()
        };
        let line = format_line(&s, rates(&Snapshot::default(), &s));
        assert!(line.contains("ops        40 (       20 op/s)"), "{line}");
    }
}
