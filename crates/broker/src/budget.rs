//! The memory budget for requests and responses in flight.
//!
//! Connections take a [`Permit`] for each request frame before reading its body, and fetches
//! take one for the bytes they may read before reading them (shrunk to what they did read);
//! permits are released when the response has been written. When the budget is spent,
//! connections stop reading and fetches wait for memory (at most until their max_wait):
//! clients see TCP back-pressure and throttle_time_ms, never an error, and the broker's memory
//! stays bounded.

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
        self.budget.release(self.bytes);
    }
}

impl Permit {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `bytes` from now on: what is no longer needed goes back at once; more is taken
    /// whether or not it fits (the memory is already allocated, like [`MemoryBudget::charge`]).
    pub fn resize(&mut self, bytes: usize) {
        if bytes > self.bytes {
            self.budget.add(bytes - self.bytes);
        } else {
            self.budget.release(self.bytes - bytes);
        }
        self.bytes = bytes;
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

    fn add(&self, bytes: usize) {
        let now = self.used.fetch_add(bytes, Ordering::AcqRel) + bytes;
        self.metrics.memory_in_use.add(bytes as i64);
        self.metrics.memory_in_use_peak.raise_to(now as i64);
    }

    fn release(&self, bytes: usize) {
        if bytes > 0 {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
            self.metrics.memory_in_use.add(-(bytes as i64));
            self.freed.notify_waiters();
        }
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
                    self.metrics
                        .memory_in_use_peak
                        .raise_to((used + bytes) as i64);
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
        loop {
            // With no deadline this only returns with a permit.
            if let Some(got) = self.acquire_before(bytes, None).await {
                return got;
            }
        }
    }

    /// Takes `bytes`, waiting until they fit or `deadline` passes (then `None`); returns the
    /// permit and how long it waited.
    pub async fn acquire_before(
        self: &Arc<Self>,
        bytes: usize,
        deadline: Option<tokio::time::Instant>,
    ) -> Option<(Permit, Duration)> {
        if let Some(p) = self.try_acquire(bytes) {
            return Some((p, Duration::ZERO));
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
                return Some((p, waited));
            }
            match deadline {
                Some(at) => {
                    if tokio::time::timeout_at(at, freed).await.is_err() {
                        return None;
                    }
                }
                None => freed.await,
            }
        }
    }

    /// Takes `bytes` whether or not they fit, for memory already allocated (a fetch response):
    /// it is counted, so new requests wait until it is released.
    pub fn charge(self: &Arc<Self>, bytes: usize) -> Permit {
        self.add(bytes);
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

    #[test]
    fn a_resized_permit_gives_back_what_it_no_longer_needs_and_counts_what_it_grew_by() {
        let b = budget(100);
        let mut p = b.try_acquire(80).unwrap();
        p.resize(30);
        assert_eq!(b.used(), 30);
        assert!(b.try_acquire(70).is_some(), "the 50 bytes went back");
        p.resize(120);
        assert_eq!(b.used(), 120);
        drop(p);
        assert_eq!(b.used(), 0);
    }

    #[tokio::test]
    async fn acquire_before_gives_up_at_its_deadline() {
        let b = budget(10);
        let _held = b.try_acquire(10).unwrap();
        let at = tokio::time::Instant::now() + Duration::from_millis(20);
        assert!(b.acquire_before(5, Some(at)).await.is_none());
        assert_eq!(b.used(), 10);
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
