//! HDR latency histograms at microsecond precision and their serialisable summaries.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Largest latency tracked (one hour, in µs); larger samples are clamped, never dropped.
pub const MAX_TRACKABLE_US: u64 = 3_600_000_000;
/// Three significant digits: 0.1% value error, which is below the noise of any broker.
const SIGNIFICANT_DIGITS: u8 = 3;
/// The percentiles drawn as latency curves in the HTML report.
pub const CURVE_PERCENTILES: [f64; 13] = [
    0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 100.0,
];

/// A latency histogram in microseconds.
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    inner: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram covering 1 µs ..= one hour.
    pub fn new() -> Self {
        let inner = Histogram::new_with_bounds(1, MAX_TRACKABLE_US, SIGNIFICANT_DIGITS)
            .expect("static histogram bounds are valid");
        Self { inner }
    }

    /// Records one sample; values beyond the range are clamped so counts stay exact.
    pub fn record_us(&mut self, value_us: u64) {
        self.inner.saturating_record(value_us.min(MAX_TRACKABLE_US));
    }

    /// Records a sample given in nanoseconds (rounded to the nearest µs).
    pub fn record_ns(&mut self, value_ns: u64) {
        self.record_us(value_ns.saturating_add(500) / 1000);
    }

    /// Adds all samples of `other`.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        // Both sides were built with the same bounds, so `add` cannot fail on range.
        let merged = self.inner.add(&other.inner);
        debug_assert!(merged.is_ok(), "histograms with equal bounds always merge");
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.inner.len()
    }

    /// True when no sample was recorded.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Value at a percentile in 0..=100, in µs.
    pub fn percentile_us(&self, percentile: f64) -> u64 {
        self.inner.value_at_percentile(percentile)
    }

    /// Clears all samples (used between warm-up and measurement).
    pub fn reset(&mut self) {
        self.inner.reset();
    }

    /// The summary that goes into reports, or `None` when there are no samples.
    pub fn summary(&self) -> Option<LatencySummary> {
        if self.inner.is_empty() {
            return None;
        }
        let h = &self.inner;
        Some(LatencySummary {
            count: h.len(),
            min_us: h.min(),
            mean_us: round2(h.mean()),
            stddev_us: round2(h.stdev()),
            p50_us: h.value_at_percentile(50.0),
            p90_us: h.value_at_percentile(90.0),
            p95_us: h.value_at_percentile(95.0),
            p99_us: h.value_at_percentile(99.0),
            p999_us: h.value_at_percentile(99.9),
            max_us: h.max(),
            curve: CURVE_PERCENTILES
                .iter()
                .map(|&p| PercentilePoint {
                    percentile: p,
                    latency_us: h.value_at_percentile(p),
                })
                .collect(),
        })
    }
}

/// Rounds to two decimals so reports (and golden files) stay stable and readable.
fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// One point of a latency percentile curve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PercentilePoint {
    /// Percentile in 0..=100.
    pub percentile: f64,
    /// Latency at that percentile in µs.
    pub latency_us: u64,
}

/// Latency percentiles of one run, all in microseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Number of samples.
    pub count: u64,
    /// Smallest sample.
    pub min_us: u64,
    /// Mean.
    pub mean_us: f64,
    /// Standard deviation.
    pub stddev_us: f64,
    /// Median.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 95th percentile.
    pub p95_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest sample.
    pub max_us: u64,
    /// Percentile curve at [`CURVE_PERCENTILES`].
    pub curve: Vec<PercentilePoint>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_histogram_has_no_summary() {
        assert!(LatencyHistogram::new().summary().is_none());
    }

    #[test]
    fn percentiles_of_uniform_samples() {
        let mut h = LatencyHistogram::new();
        for v in 1..=10_000u64 {
            h.record_us(v);
        }
        let s = h.summary().expect("samples recorded");
        assert_eq!(s.count, 10_000);
        assert_eq!(s.min_us, 1);
        // 3 significant digits: values are exact to within 0.1%.
        let close = |got: u64, want: u64| (got as f64 - want as f64).abs() <= want as f64 * 0.001;
        assert!(close(s.p50_us, 5_000), "p50 {}", s.p50_us);
        assert!(close(s.p90_us, 9_000), "p90 {}", s.p90_us);
        assert!(close(s.p99_us, 9_900), "p99 {}", s.p99_us);
        assert!(close(s.p999_us, 9_990), "p999 {}", s.p999_us);
        assert!(close(s.max_us, 10_000), "max {}", s.max_us);
        assert_eq!(s.curve.len(), CURVE_PERCENTILES.len());
        assert!(s
            .curve
            .windows(2)
            .all(|w| w[0].latency_us <= w[1].latency_us));
    }

    #[test]
    fn huge_values_are_clamped_not_dropped() {
        let mut h = LatencyHistogram::new();
        h.record_us(u64::MAX);
        h.record_us(5);
        assert_eq!(h.len(), 2);
        assert!(h.summary().expect("two samples").max_us >= MAX_TRACKABLE_US / 2);
    }

    #[test]
    fn nanoseconds_round_to_microseconds() {
        let mut h = LatencyHistogram::new();
        h.record_ns(1_499);
        h.record_ns(1_500);
        assert_eq!(h.percentile_us(0.0), 1);
        assert_eq!(h.percentile_us(100.0), 2);
    }

    #[test]
    fn merge_adds_counts() {
        let mut a = LatencyHistogram::new();
        let mut b = LatencyHistogram::new();
        a.record_us(10);
        b.record_us(1_000);
        b.record_us(2_000);
        a.merge(&b);
        assert_eq!(a.len(), 3);
        assert_eq!(a.summary().expect("samples").min_us, 10);
        a.reset();
        assert!(a.is_empty());
    }
}
