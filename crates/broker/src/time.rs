//! Time as the broker sees it: a clock passed in, so tests can drive it and a wall-clock step
//! cannot expire what should only expire with elapsed time.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Where the broker reads time from.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch: Kafka timestamps, retention by age.
    fn now_ms(&self) -> i64;
    /// Milliseconds on a clock that never goes backwards or jumps: timeouts and sessions.
    fn monotonic_ms(&self) -> i64;
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// The operating system's clocks.
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A system clock whose monotonic time starts at 0 now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }

    /// A shared system clock.
    pub fn shared() -> SharedClock {
        Arc::new(Self::new())
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        now_ms()
    }

    fn monotonic_ms(&self) -> i64 {
        self.origin.elapsed().as_millis() as i64
    }
}

/// A clock that moves only when told to, for tests.
#[derive(Debug)]
pub struct ManualClock {
    wall_ms: AtomicI64,
    monotonic_ms: AtomicI64,
}

impl ManualClock {
    /// A manual clock at wall time `wall_ms` and monotonic time 0.
    pub fn new(wall_ms: i64) -> Arc<Self> {
        Arc::new(Self {
            wall_ms: AtomicI64::new(wall_ms),
            monotonic_ms: AtomicI64::new(0),
        })
    }

    /// Lets `ms` pass on both clocks.
    pub fn advance(&self, ms: i64) {
        self.wall_ms.fetch_add(ms, Ordering::SeqCst);
        self.monotonic_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Steps the wall clock only (an NTP correction): elapsed time does not change.
    pub fn step_wall(&self, ms: i64) {
        self.wall_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.wall_ms.load(Ordering::SeqCst)
    }

    fn monotonic_ms(&self) -> i64 {
        self.monotonic_ms.load(Ordering::SeqCst)
    }
}

/// Milliseconds since the Unix epoch from the system clock.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_wall_step_leaves_monotonic_time_alone() {
        let c = ManualClock::new(1_000);
        c.advance(50);
        c.step_wall(-10_000);
        assert_eq!(c.now_ms(), -8_950);
        assert_eq!(c.monotonic_ms(), 50);
    }
}
