//! Per-worker counters. Each producer/consumer owns one behind a mutex that only it and the
//! once-per-interval progress reader ever take, so locking stays uncontended.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::histogram::LatencyHistogram;
use crate::validate::SeqSet;

/// Error counts keyed by librdkafka error code name (e.g. `MessageTimedOut`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ErrorCounts(pub BTreeMap<String, u64>);

impl ErrorCounts {
    /// Counts one error.
    pub fn add(&mut self, code: &str) {
        self.add_n(code, 1);
    }

    /// Counts `n` errors.
    pub fn add_n(&mut self, code: &str, n: u64) {
        if let Some(c) = self.0.get_mut(code) {
            *c += n;
        } else {
            self.0.insert(code.to_string(), n);
        }
    }

    /// Adds all counts of `other`.
    pub fn merge(&mut self, other: &ErrorCounts) {
        for (k, v) in &other.0 {
            self.add_n(k, *v);
        }
    }

    /// Total errors.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// The most frequent error code, for one-line messages.
    pub fn top(&self) -> Option<(&str, u64)> {
        self.0
            .iter()
            .max_by_key(|(_, v)| **v)
            .map(|(k, v)| (k.as_str(), *v))
    }
}

/// Counters of one producer.
#[derive(Debug, Default)]
pub struct ProduceStats {
    /// Latency of measured deliveries (enqueue -> delivery report).
    pub latency: LatencyHistogram,
    /// Measured messages accepted into the client queue.
    pub enqueued: u64,
    /// Measured messages with a successful delivery report.
    pub delivered: u64,
    /// Bytes (key + value) of those.
    pub delivered_bytes: u64,
    /// Measured messages with a failed delivery report (or rejected at enqueue).
    pub failed: u64,
    /// Measured messages the client refused to enqueue (included in `failed`).
    pub rejected: u64,
    /// Failures by error code.
    pub errors: ErrorCounts,
    /// Delivery reports of warm-up messages (not measured).
    pub warmup_delivered: u64,
    /// Failed warm-up messages (not measured).
    pub warmup_failed: u64,
    /// Time (ns since epoch) of the last measured delivery report.
    pub last_delivery_ns: u64,
    /// Acknowledged sequences, kept only when validating.
    pub acked: Option<SeqSet>,
    /// Last client-level error (e.g. "all brokers down"), for error messages.
    pub last_client_error: Option<String>,
}

/// Counters of one consumer.
#[derive(Debug, Default)]
pub struct ConsumeStats {
    /// Round-trip latency (produce timestamp -> consumption), when messages carry it.
    pub latency: LatencyHistogram,
    /// Measured messages consumed.
    pub consumed: u64,
    /// Bytes (key + value) of those.
    pub consumed_bytes: u64,
    /// Messages consumed during warm-up.
    pub warmup_consumed: u64,
    /// Consumer errors by code.
    pub errors: ErrorCounts,
    /// Time (ns since epoch) of the last measured message.
    pub last_message_ns: u64,
    /// Time (ns since epoch) of the first measured message.
    pub first_message_ns: Option<u64>,
}

/// A shareable, lockable stats cell.
#[derive(Debug, Default)]
pub struct Shared<T>(Arc<Mutex<T>>);

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(Arc::clone(&self.0))
    }
}

impl<T: Default> Shared<T> {
    /// A fresh cell holding `T::default()`.
    pub fn new() -> Self {
        Shared(Arc::new(Mutex::new(T::default())))
    }
}

impl<T> Shared<T> {
    /// Locks the cell. A panic in another holder leaves plain counters, so poisoning is ignored.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Lets every worker finish its setup (client creation, first connection) before the clock
/// starts, so connection setup is not measured as latency or counted in throughput windows.
#[derive(Debug, Default)]
pub struct StartGate {
    ready: AtomicUsize,
    go: OnceLock<Instant>,
}

impl StartGate {
    /// Called by a worker once set up; blocks until the gate opens. `None` if stopped first.
    pub fn arrive_and_wait(&self, stop: &AtomicBool) -> Option<Instant> {
        self.ready.fetch_add(1, Ordering::SeqCst);
        loop {
            if let Some(e) = self.go.get() {
                return Some(*e);
            }
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Workers that finished setup.
    pub fn ready(&self) -> usize {
        self.ready.load(Ordering::SeqCst)
    }

    /// Opens the gate (idempotent); returns the epoch every worker measures from.
    pub fn open(&self) -> Instant {
        *self.go.get_or_init(Instant::now)
    }

    /// The epoch, once open.
    pub fn epoch(&self) -> Option<Instant> {
        self.go.get().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_counts() {
        let mut a = ErrorCounts::default();
        a.add("MessageTimedOut");
        a.add_n("QueueFull", 3);
        let mut b = ErrorCounts::default();
        b.add("MessageTimedOut");
        a.merge(&b);
        assert_eq!(a.total(), 5);
        assert_eq!(a.top(), Some(("QueueFull", 3)));
        assert_eq!(
            serde_json::to_string(&a).expect("serialises"),
            r#"{"MessageTimedOut":2,"QueueFull":3}"#
        );
    }
}
