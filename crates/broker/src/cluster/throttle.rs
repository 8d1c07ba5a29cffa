//! Replication throttling (Kafka's `follower.replication.throttled.rate` with a topic's
//! `follower.replication.throttled.replicas`): a follower fetching replicas that are being
//! moved stays under a byte rate, so a reassignment does not starve producers of disk and
//! network. Replicas not listed are never slowed.

use std::time::Instant;

use parking_lot::Mutex;

/// A token bucket over bytes: refills at `rate` bytes per second, holds at most one second's
/// worth, and may go into debt by one response; while in debt, throttled partitions are left
/// out of fetches.
#[derive(Debug)]
pub(super) struct ByteRate {
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    rate: u64,
    tokens: f64,
    refilled: Instant,
}

impl ByteRate {
    pub(super) fn new() -> Self {
        Self {
            state: Mutex::new(Bucket {
                rate: 0,
                tokens: 0.0,
                refilled: Instant::now(),
            }),
        }
    }

    /// Whether throttled replicas may fetch now at `rate` bytes per second (the rate can
    /// change between calls: a dynamic config).
    pub(super) fn may_fetch(&self, rate: u64, now: Instant) -> bool {
        let mut b = self.state.lock();
        b.refill(rate, now);
        b.tokens > 0.0
    }

    /// Counts `bytes` fetched for throttled replicas.
    pub(super) fn record(&self, bytes: usize) {
        self.state.lock().tokens -= bytes as f64;
    }
}

impl Bucket {
    fn refill(&mut self, rate: u64, now: Instant) {
        if rate != self.rate {
            // A new rate starts with a full second's allowance.
            self.rate = rate;
            self.tokens = rate as f64;
            self.refilled = now;
            return;
        }
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens = (self.tokens + elapsed * rate as f64).min(rate as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_bucket_in_debt_refuses_until_the_rate_has_paid_it_back() {
        let t0 = Instant::now();
        let r = ByteRate::new();
        assert!(r.may_fetch(1000, t0));
        r.record(3000);
        assert!(!r.may_fetch(1000, t0 + Duration::from_millis(1500)));
        assert!(r.may_fetch(1000, t0 + Duration::from_millis(2100)));
    }

    #[test]
    fn the_allowance_never_exceeds_one_second_of_rate() {
        let t0 = Instant::now();
        let r = ByteRate::new();
        assert!(r.may_fetch(1000, t0));
        assert!(r.may_fetch(1000, t0 + Duration::from_secs(60)));
        r.record(1001);
        assert!(!r.may_fetch(1000, t0 + Duration::from_secs(60)));
    }
}
