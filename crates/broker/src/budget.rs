//! The memory budget for requests and responses in flight.
//!
//! Connections take a [`Permit`] for each request frame before reading its body, and fetches
//! take one for the bytes they return; permits are released when the response has been
//! written. When the budget is spent, connections stop reading: clients see TCP back-pressure
//! and throttle_time_ms, never an error, and the broker's memory stays bounded.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spate_metrics::Registry;
use tokio::sync::Notify;

/// A bounded pool of bytes.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: usize,
    used: AtomicUsize,
    freed: Notify,
    metrics: Arc<Registry>,
}

/// Bytes held from a [`MemoryBudget`] until dropped.
#[derive(Debug)]
pub struct Permit {
    budget: Arc<MemoryBudget>,
    bytes: usize,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
            self.budget.metrics.memory_in_use.add(-(self.bytes as i64));
            self.budget.freed.notify_waiters();
        }
    }
}

impl Permit {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize, metrics: Arc<Registry>) -> Arc<Self> {
        metrics.memory_limit.set(limit as i64);
        Arc::new(Self {
            limit,
            used: AtomicUsize::new(0),
            freed: Notify::new(),
            metrics,
        })
    }

    /// The limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes currently held.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Takes `bytes` if they fit. A single request larger than the whole budget is admitted
    /// when nothing else is held, so it cannot wait forever.
    pub fn try_acquire(self: &Arc<Self>, bytes: usize) -> Option<Permit> {
        let mut used = self.used.load(Ordering::Acquire);
        loop {
            let fits = used + bytes <= self.limit || used == 0;
            if !fits {
                return None;
            }
            match self.used.compare_exchange_weak(
                used,
                used + bytes,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.metrics.memory_in_use.add(bytes as i64);
                    return Some(Permit {
                        budget: self.clone(),
                        bytes,
                    });
                }
                Err(now) => used = now,
            }
        }
    }

    /// Takes `bytes`, waiting until they fit; returns the permit and how long it waited.
    pub async fn acquire(self: &Arc<Self>, bytes: usize) -> (Permit, Duration) {
        if let Some(p) = self.try_acquire(bytes) {
            return (p, Duration::ZERO);
        }
        let started = Instant::now();
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Register before re-checking so a release in between still wakes us.
            freed.as_mut().enable();
            if let Some(p) = self.try_acquire(bytes) {
                let waited = started.elapsed();
                self.metrics.throttled_requests.inc();
                self.metrics.throttle_us.add(waited.as_micros() as u64);
                return (p, waited);
            }
            freed.await;
        }
    }

    /// Takes `bytes` whether or not they fit, for memory already allocated (a fetch response):
    /// it is counted, so new requests wait until it is released.
    pub fn charge(self: &Arc<Self>, bytes: usize) -> Permit {
        self.used.fetch_add(bytes, Ordering::AcqRel);
        self.metrics.memory_in_use.add(bytes as i64);
        Permit {
            budget: self.clone(),
            bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(limit: usize) -> Arc<MemoryBudget> {
        MemoryBudget::new(limit, Arc::new(Registry::default()))
    }

    #[test]
    fn permits_are_bounded_and_released_on_drop() {
        let b = budget(100);
        let a = b.try_acquire(60).unwrap();
        assert!(b.try_acquire(50).is_none());
        let c = b.try_acquire(40).unwrap();
        assert_eq!(b.used(), 100);
        drop(a);
        drop(c);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn an_oversized_request_is_admitted_alone() {
        let b = budget(10);
        let big = b.try_acquire(50).unwrap();
        assert!(b.try_acquire(1).is_none());
        drop(big);
        assert!(b.try_acquire(1).is_some());
    }

    #[tokio::test]
    async fn acquire_waits_for_a_release() {
        let b = budget(10);
        let held = b.try_acquire(10).unwrap();
        let b2 = b.clone();
        let waiter = tokio::spawn(async move { b2.acquire(5).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        drop(held);
        let (p, waited) = waiter.await.unwrap();
        assert_eq!(p.bytes(), 5);
        assert!(waited > Duration::ZERO);
    }
}
