//! Search counters, read by `/metrics` at scrape time.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, Ordering};

use parking_lot::Mutex;
use spate_metrics::{Counter, Gauge, Histogram};

/// High watermarks remembered per partition to date its oldest unindexed record (at one
/// sample every 100 ms, more than a minute and a half of a steadily moving log).
const HW_SAMPLES: usize = 1024;

/// Per partition index.
#[derive(Debug, Default)]
pub struct IndexMetrics {
    /// Records indexed since start.
    pub indexed_records: Counter,
    /// Records below the high watermark not yet searchable.
    pub lag_records: Gauge,
    /// Age (ms) of the oldest record below the high watermark not searchable yet.
    pub unindexed_age_ms: AtomicI64,
    /// When the high watermark was seen at each value: (offset, wall time ms), oldest first.
    hw_seen: Mutex<VecDeque<(i64, i64)>>,
    /// Batches that could not be decoded (their records are skipped).
    pub undecodable_batches: Counter,
    /// Values in the schema registry's wire format that could not be decoded (unknown
    /// schema id, malformed payload); they are indexed as text.
    pub undecodable_values: Counter,
    /// Times indexing stopped at a schema'd value whose schema id was not known yet.
    pub schema_id_waits: Counter,
    /// JSON values of new fields left out because the mapping reached `search.max.fields`.
    pub unmapped_fields: Counter,
    /// JSON values left out because they did not fit their field's mapped type.
    pub mapping_conflicts: Counter,
    /// Times the index writer failed and indexing went back to the last commit.
    pub writer_recoveries: Counter,
}

impl IndexMetrics {
    /// Age of the oldest record not searchable yet, in seconds (0 when none).
    pub fn lag_seconds(&self) -> f64 {
        self.unindexed_age_ms.load(Ordering::Relaxed) as f64 / 1000.0
    }

    /// Notes the high watermark `hw` at `now_ms` and, with the index searchable up to
    /// `searchable` (the first offset not searchable), answers the age of the oldest record
    /// not searchable yet: it appeared after the last sample that did not reach it.
    pub fn observe(&self, hw: i64, searchable: i64, now_ms: i64) -> i64 {
        let mut seen = self.hw_seen.lock();
        match seen.back() {
            // The log was cut back (a replica's divergent tail): start over.
            Some((last, _)) if hw < *last => {
                seen.clear();
                seen.push_back((hw, now_ms));
            }
            Some((last, _)) if hw == *last => {}
            _ if seen.len() < HW_SAMPLES => seen.push_back((hw, now_ms)),
            _ => {}
        }
        while seen.front().is_some_and(|(o, _)| *o <= searchable) {
            seen.pop_front();
        }
        let age = match seen.front() {
            Some((_, at)) if searchable < hw => (now_ms - at).max(0),
            _ => 0,
        };
        self.unindexed_age_ms.store(age, Ordering::Relaxed);
        age
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_age_is_that_of_the_oldest_record_not_searchable() {
        let m = IndexMetrics::default();
        assert_eq!(m.observe(0, 0, 1_000), 0, "an empty log");
        // Records 0..10 appear at 2 s, 10..20 at 3 s.
        assert_eq!(m.observe(10, 0, 2_000), 0);
        assert_eq!(m.observe(20, 0, 3_000), 1_000);
        assert_eq!(m.observe(20, 0, 4_500), 2_500);
        // The first ten are searchable: the oldest left appeared at 3 s.
        assert_eq!(m.observe(20, 10, 5_000), 2_000);
        assert_eq!(m.observe(20, 20, 5_100), 0, "all searchable");
        assert_eq!(m.lag_seconds(), 0.0);
        // A steady trickle, each record searchable soon after: never an old age.
        for t in 0..50 {
            let at = 6_000 + t * 300;
            m.observe(21 + t, 20 + t, at);
            assert!(m.observe(21 + t, 21 + t, at + 200) == 0);
        }
        // A cut below what was seen starts over.
        assert_eq!(m.observe(5, 3, 30_000), 0);
        assert_eq!(m.observe(5, 3, 30_400), 400);
    }
}
