//! A sampled rate, as Kafka measures quota usage: `samples` windows of `window_ms` each; the
//! rate is everything recorded in the live windows over the time they span (at least all but
//! one full window, so one burst right after a quiet period is not read as infinite).

/// How usage is sampled: Kafka's `quota.window.num` (11) and `quota.window.size.seconds` (1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateConfig {
    /// Number of windows kept.
    pub samples: usize,
    /// Length of one window.
    pub window_ms: u64,
}

impl Default for RateConfig {
    fn default() -> Self {
        Self {
            samples: 11,
            window_ms: 1_000,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    start_ms: u64,
    amount: f64,
}

/// Usage of one quota entity over recent windows.
#[derive(Debug, Clone)]
pub struct Rate {
    config: RateConfig,
    samples: Vec<Sample>,
    /// Index of the current (newest) window.
    current: usize,
}

impl Rate {
    /// An empty rate starting at `now_ms`.
    pub fn new(config: RateConfig, now_ms: u64) -> Self {
        let samples = config.samples.max(2);
        Self {
            config: RateConfig { samples, ..config },
            samples: vec![
                Sample {
                    start_ms: now_ms,
                    amount: 0.0,
                };
                1
            ],
            current: 0,
        }
    }

    /// Adds `amount` at `now_ms`.
    pub fn record(&mut self, amount: f64, now_ms: u64) {
        let cur = self.samples[self.current];
        if now_ms >= cur.start_ms + self.config.window_ms {
            // A new window; reuse the oldest slot once all exist.
            let fresh = Sample {
                start_ms: now_ms,
                amount: 0.0,
            };
            if self.samples.len() < self.config.samples {
                self.samples.push(fresh);
                self.current = self.samples.len() - 1;
            } else {
                self.current = (self.current + 1) % self.samples.len();
                self.samples[self.current] = fresh;
            }
        }
        self.samples[self.current].amount += amount;
    }

    /// Per second over the live windows, and the milliseconds they span.
    pub fn measure(&self, now_ms: u64) -> (f64, u64) {
        let horizon = self.config.window_ms * self.config.samples as u64;
        let live = self
            .samples
            .iter()
            .filter(|s| now_ms.saturating_sub(s.start_ms) < horizon);
        let (total, oldest) =
            live.fold((0.0, now_ms), |(t, o), s| (t + s.amount, o.min(s.start_ms)));
        let floor = self.config.window_ms * (self.config.samples as u64 - 1);
        let span = now_ms.saturating_sub(oldest).max(floor).max(1);
        (total * 1_000.0 / span as f64, span)
    }

    /// How long to throttle so the rate falls back to `quota` per second: Kafka's
    /// (observed - quota) / quota x span, capped at the span of all windows.
    pub fn throttle_ms(&self, quota: f64, now_ms: u64) -> u64 {
        let (observed, span) = self.measure(now_ms);
        if quota <= 0.0 || observed <= quota {
            return 0;
        }
        let cap = self.config.window_ms * self.config.samples as u64;
        (((observed - quota) / quota) * span as f64).min(cap as f64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_rate_below_the_quota_is_not_throttled() {
        let mut r = Rate::new(RateConfig::default(), 0);
        for s in 0..30u64 {
            r.record(900.0, s * 1_000);
        }
        let (rate, _) = r.measure(30_000);
        assert!((800.0..=1_000.0).contains(&rate), "{rate}");
        assert_eq!(r.throttle_ms(1_000.0, 30_000), 0);
    }

    #[test]
    fn twice_the_quota_throttles_for_the_span_so_the_average_halves() {
        let mut r = Rate::new(RateConfig::default(), 0);
        for s in 0..=10u64 {
            r.record(2_000.0, s * 1_000);
        }
        let (rate, span) = r.measure(10_999);
        assert_eq!(span, 10_999);
        assert!((rate - 2_000.0).abs() < 1.0, "{rate}");
        // Waiting as long again as the span brings the average down to the quota.
        let t = r.throttle_ms(1_000.0, 10_999);
        assert!((10_900..=11_000).contains(&t), "{t}");
    }

    #[test]
    fn old_windows_stop_counting() {
        let mut r = Rate::new(RateConfig::default(), 0);
        r.record(1_000_000.0, 0);
        assert!(r.throttle_ms(1_000.0, 500) > 0);
        assert_eq!(r.measure(60_000).0, 0.0);
        assert_eq!(r.throttle_ms(1_000.0, 60_000), 0);
    }

    #[test]
    fn a_first_burst_is_spread_over_all_but_one_window() {
        let mut r = Rate::new(RateConfig::default(), 0);
        r.record(10_000.0, 0);
        let (rate, span) = r.measure(1);
        assert_eq!(span, 10_000);
        assert!((rate - 1_000.0).abs() < 1e-9);
    }
}
