//! Metrics that cost the hot path one relaxed atomic add.
//!
//! [`Counter`], [`Gauge`] and [`Histogram`] are plain atomics; [`Registry`] holds the
//! broker-wide ones; at scrape time [`text::Writer`] hands their values to the
//! `prometheus-client` crate, which writes the OpenMetrics text.
//! Building without the `enabled` feature turns every update into a no-op.

pub mod process;
pub mod text;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use parking_lot::Mutex;

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`.
    #[inline]
    pub fn add(&self, n: u64) {
        if cfg!(feature = "enabled") {
            self.0.fetch_add(n, Ordering::Relaxed);
        }
    }
    /// Adds one.
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }
    /// Current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    /// Adds `n` (which may be negative).
    #[inline]
    pub fn add(&self, n: i64) {
        if cfg!(feature = "enabled") {
            self.0.fetch_add(n, Ordering::Relaxed);
        }
    }
    /// Sets the value.
    #[inline]
    pub fn set(&self, v: i64) {
        if cfg!(feature = "enabled") {
            self.0.store(v, Ordering::Relaxed);
        }
    }
    /// Raises the value to `v` if it is lower (a high-water mark).
    #[inline]
    pub fn raise_to(&self, v: i64) {
        if cfg!(feature = "enabled") {
            self.0.fetch_max(v, Ordering::Relaxed);
        }
    }
    /// Current value.
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Upper bounds (inclusive) of latency buckets, in microseconds: 50 µs to 10 s.
pub const LATENCY_BUCKETS_US: &[u64] = &[
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 10_000_000,
];
/// Upper bounds of count buckets (e.g. appends per fsync).
pub const COUNT_BUCKETS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096];

/// A fixed-bucket histogram.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [u64],
    buckets: Vec<AtomicU64>,
    sum: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// A histogram with these inclusive upper bounds (plus +Inf).
    pub fn new(bounds: &'static [u64]) -> Self {
        Self {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// A latency histogram in microseconds.
    pub fn latency() -> Self {
        Self::new(LATENCY_BUCKETS_US)
    }

    /// Records one observation.
    #[inline]
    pub fn observe(&self, v: u64) {
        if cfg!(feature = "enabled") {
            let i = self.bounds.partition_point(|b| *b < v);
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
            self.sum.fetch_add(v, Ordering::Relaxed);
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// (upper bound or None for +Inf, cumulative count) pairs, then sum and count.
    pub fn snapshot(&self) -> (Vec<(Option<u64>, u64)>, u64, u64) {
        let mut acc = 0;
        let cumulative = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                acc += b.load(Ordering::Relaxed);
                (self.bounds.get(i).copied(), acc)
            })
            .collect();
        (
            cumulative,
            self.sum.load(Ordering::Relaxed),
            self.count.load(Ordering::Relaxed),
        )
    }
}

/// A request taking at least this long (µs) is counted as slow and leaves an exemplar.
pub const SLOW_REQUEST_US: u64 = 100_000;

/// Labels of an exemplar: which request it was.
pub type ExemplarLabels = Vec<(String, String)>;

/// Slow requests of one API, with the last one as an OpenMetrics exemplar (peer and
/// correlation id, so it can be found in the client's logs). Only slow requests take its lock.
pub type SlowRequests = prometheus_client::metrics::exemplar::CounterWithExemplar<ExemplarLabels>;

/// Highest Kafka API key tracked individually.
pub const MAX_API_KEY: usize = 100;

/// Broker-wide metrics.
#[derive(Debug)]
pub struct Registry {
    /// Requests handled, by API key.
    pub requests: Vec<Counter>,
    /// Time from a request's arrival to its response being ready, by API key (µs).
    pub request_latency: Vec<Histogram>,
    /// Requests that took at least [`SLOW_REQUEST_US`], by API key, with an exemplar.
    pub slow_requests: Vec<SlowRequests>,
    errors: Mutex<BTreeMap<(i16, i16), u64>>,
    /// Connections currently open.
    pub connections_open: Gauge,
    /// Connections accepted since start.
    pub connections_accepted: Counter,
    /// Connections refused because a connection limit was reached.
    pub connections_rejected: Counter,
    /// Bytes of produce requests and fetch responses currently held.
    pub memory_in_use: Gauge,
    /// The highest `memory_in_use` since start.
    pub memory_in_use_peak: Gauge,
    /// The limit on `memory_in_use`.
    pub memory_limit: Gauge,
    /// Total time requests waited for memory (µs).
    pub throttle_us: Counter,
    /// Requests that had to wait for memory.
    pub throttled_requests: Counter,
    /// fsync duration (µs).
    pub fsync_latency: Histogram,
    /// Logs made durable per flusher round (group commit batch size).
    pub group_commit_batch: Histogram,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            requests: (0..=MAX_API_KEY).map(|_| Counter::default()).collect(),
            request_latency: (0..=MAX_API_KEY).map(|_| Histogram::latency()).collect(),
            slow_requests: (0..=MAX_API_KEY).map(|_| SlowRequests::default()).collect(),
            errors: Mutex::new(BTreeMap::new()),
            connections_open: Gauge::default(),
            connections_accepted: Counter::default(),
            connections_rejected: Counter::default(),
            memory_in_use: Gauge::default(),
            memory_in_use_peak: Gauge::default(),
            memory_limit: Gauge::default(),
            throttle_us: Counter::default(),
            throttled_requests: Counter::default(),
            fsync_latency: Histogram::latency(),
            group_commit_batch: Histogram::new(COUNT_BUCKETS),
        }
    }
}

impl Registry {
    /// Counts a request of `api_key` that took `micros`.
    #[inline]
    pub fn request(&self, api_key: i16, micros: u64) {
        let i = (api_key.max(0) as usize).min(MAX_API_KEY);
        self.requests[i].inc();
        self.request_latency[i].observe(micros);
    }

    /// [`Registry::request`] for a request from `peer` with `correlation_id`: a slow one is
    /// also counted with an exemplar naming it.
    #[inline]
    pub fn request_from(&self, api_key: i16, micros: u64, peer: &str, correlation_id: i32) {
        self.request(api_key, micros);
        if cfg!(feature = "enabled") && micros >= SLOW_REQUEST_US {
            let i = (api_key.max(0) as usize).min(MAX_API_KEY);
            let labels = vec![
                ("peer".to_owned(), peer.to_owned()),
                ("correlation_id".to_owned(), correlation_id.to_string()),
            ];
            self.slow_requests[i].inc_by(1, Some(labels), Some(std::time::SystemTime::now()));
        }
    }

    /// Counts an error code returned by `api_key` (errors are off the fast path).
    pub fn error(&self, api_key: i16, code: i16) {
        if cfg!(feature = "enabled") && code != 0 {
            *self.errors.lock().entry((api_key, code)).or_insert(0) += 1;
        }
    }

    /// Error counts by (API key, error code).
    pub fn errors(&self) -> Vec<((i16, i16), u64)> {
        self.errors.lock().iter().map(|(k, v)| (*k, *v)).collect()
    }
}

#[cfg(all(test, feature = "enabled"))]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[10, 100]);
        for v in [5, 10, 50, 1000] {
            h.observe(v);
        }
        let (b, sum, count) = h.snapshot();
        assert_eq!(b, vec![(Some(10), 2), (Some(100), 3), (None, 4)]);
        assert_eq!((sum, count), (1065, 4));
    }

    #[test]
    fn registry_counts_requests_and_errors() {
        let r = Registry::default();
        r.request(0, 120);
        r.request(0, 80);
        r.error(0, 2);
        r.error(0, 2);
        r.error(0, 0);
        assert_eq!(r.requests[0].get(), 2);
        assert_eq!(r.errors(), vec![((0, 2), 2)]);
    }
}
