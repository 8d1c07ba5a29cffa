//! Search counters, read by `/metrics` at scrape time.

use std::sync::atomic::{AtomicI64, Ordering};

use spate_metrics::{Counter, Gauge, Histogram};

/// Per partition index.
#[derive(Debug, Default)]
pub struct IndexMetrics {
    /// Records indexed since start.
    pub indexed_records: Counter,
    /// Records below the high watermark not yet searchable.
    pub lag_records: Gauge,
    /// Wall time (ms) when the index last held everything below the high watermark.
    pub caught_up_at_ms: AtomicI64,
    /// Batches that could not be decoded (their records are skipped).
    pub undecodable_batches: Counter,
    /// JSON values of new fields left out because the mapping reached `search.max.fields`.
    pub unmapped_fields: Counter,
    /// JSON values left out because they did not fit their field's mapped type.
    pub mapping_conflicts: Counter,
    /// Times the index writer failed and indexing went back to the last commit.
    pub writer_recoveries: Counter,
}

impl IndexMetrics {
    /// How long the index has been behind, in seconds (0 when caught up).
    pub fn lag_seconds(&self, now_ms: i64) -> f64 {
        if self.lag_records.get() <= 0 {
            return 0.0;
        }
        (now_ms - self.caught_up_at_ms.load(Ordering::Relaxed)).max(0) as f64 / 1000.0
    }
}

/// Broker-wide.
#[derive(Debug)]
pub struct SearchMetrics {
    /// Commit latency in microseconds.
    pub commit_latency_us: Histogram,
    /// Query latency in microseconds.
    pub query_latency_us: Histogram,
    /// Searches answered with an error.
    pub query_errors: Counter,
    /// Records read to render hits (`_source`, highlights, fields).
    pub records_rendered: Counter,
}

impl Default for SearchMetrics {
    fn default() -> Self {
        Self {
            commit_latency_us: Histogram::latency(),
            query_latency_us: Histogram::latency(),
            query_errors: Counter::default(),
            records_rendered: Counter::default(),
        }
    }
}
