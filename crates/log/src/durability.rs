//! Group commit: one background thread turns many appends into few fsyncs.
//!
//! Appenders mark their log dirty; the flusher drains the dirty set, fsyncs each log's dirty
//! files once and publishes the offset now on disk. With `Always` it syncs as soon as work
//! exists (appends arriving during an fsync share the next one); with a group-commit window it
//! first waits for company; with `Interval` it syncs on a timer and nobody waits for it.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use spate_metrics::Registry;
use tokio::sync::watch;

use crate::config::FsyncPolicy;

/// Per-log durability bookkeeping shared with the flusher thread.
pub(crate) struct SyncState {
    /// Offset after the last batch written to the page cache.
    written: AtomicI64,
    /// Files with writes not yet fsynced.
    dirty: Mutex<Vec<Arc<File>>>,
    queued: AtomicBool,
    durable: watch::Sender<i64>,
    path: PathBuf,
}

impl SyncState {
    pub(crate) fn new(path: PathBuf, end_offset: i64) -> Arc<Self> {
        Arc::new(Self {
            written: AtomicI64::new(end_offset),
            dirty: Mutex::new(Vec::new()),
            queued: AtomicBool::new(false),
            durable: watch::Sender::new(end_offset),
            path,
        })
    }

    /// Notes a write to `file` that ends at `end_offset`. The file goes on the dirty list
    /// before the offset is published, so a flusher that sees the offset also sees the file.
    pub(crate) fn written(&self, file: &Arc<File>, end_offset: i64) {
        {
            let mut dirty = self.dirty.lock();
            if !dirty.iter().any(|f| Arc::ptr_eq(f, file)) {
                dirty.push(file.clone());
            }
        }
        self.written.store(end_offset, Ordering::Release);
    }

    /// Resets after truncation or recovery: everything up to `end_offset` counts as durable.
    pub(crate) fn reset(&self, end_offset: i64) {
        self.written.store(end_offset, Ordering::Release);
        self.durable.send_replace(end_offset);
    }

    /// Subscribes to the durable offset.
    pub(crate) fn subscribe(&self) -> watch::Receiver<i64> {
        self.durable.subscribe()
    }

    fn sync(&self, metrics: &Registry) {
        self.queued.store(false, Ordering::SeqCst);
        let end = self.written.load(Ordering::Acquire);
        let files = std::mem::take(&mut *self.dirty.lock());
        for f in &files {
            let started = Instant::now();
            let synced = f.sync_data();
            metrics
                .fsync_latency
                .observe(started.elapsed().as_micros() as u64);
            if let Err(e) = synced {
                // Leave the offset where it was: waiting producers time out rather than
                // being told their data is safe.
                tracing::error!(path = %self.path.display(), error = %e, "fsync failed");
                self.dirty.lock().extend(files.iter().cloned());
                return;
            }
        }
        self.durable.send_if_modified(|d| {
            let advanced = end > *d;
            if advanced {
                *d = end;
            }
            advanced
        });
    }
}

struct Inner {
    policy: FsyncPolicy,
    metrics: Arc<Registry>,
    queue: Mutex<Vec<Arc<SyncState>>>,
    wake: Condvar,
    stop: AtomicBool,
}

/// Handle to the broker-wide flusher thread.
#[derive(Clone)]
pub struct Flusher {
    inner: Arc<Inner>,
}

impl Flusher {
    /// Starts the flusher for `policy`; `Never` starts no thread.
    pub fn start(policy: FsyncPolicy) -> Self {
        Self::with_metrics(policy, Arc::new(Registry::default()))
    }

    /// Starts the flusher, recording fsync latency and group-commit batch sizes in `metrics`.
    pub fn with_metrics(policy: FsyncPolicy, metrics: Arc<Registry>) -> Self {
        let inner = Arc::new(Inner {
            policy,
            metrics,
            queue: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        if policy != FsyncPolicy::Never {
            let worker = inner.clone();
            let spawned = std::thread::Builder::new()
                .name("spate-flusher".into())
                .spawn(move || run(&worker));
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start the flusher thread");
            }
        }
        Self { inner }
    }

    /// The policy this flusher enforces.
    pub fn policy(&self) -> FsyncPolicy {
        self.inner.policy
    }

    pub(crate) fn mark_dirty(&self, state: &Arc<SyncState>) {
        if self.inner.policy == FsyncPolicy::Never {
            return;
        }
        if !state.queued.swap(true, Ordering::SeqCst) {
            self.inner.queue.lock().push(state.clone());
            self.inner.wake.notify_one();
        }
    }

    /// Syncs everything outstanding and stops the thread.
    pub fn shutdown(&self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.wake.notify_one();
        let pending = std::mem::take(&mut *self.inner.queue.lock());
        for s in pending {
            s.sync(&self.inner.metrics);
        }
    }
}

fn run(inner: &Inner) {
    loop {
        let batch = {
            let mut q = inner.queue.lock();
            match inner.policy {
                FsyncPolicy::Interval { every } => {
                    let until = Instant::now() + every;
                    while Instant::now() < until && !inner.stop.load(Ordering::SeqCst) {
                        inner.wake.wait_until(&mut q, until);
                    }
                }
                _ => {
                    while q.is_empty() && !inner.stop.load(Ordering::SeqCst) {
                        inner.wake.wait_for(&mut q, Duration::from_secs(1));
                    }
                }
            }
            if let FsyncPolicy::GroupCommit { window } = inner.policy {
                if !q.is_empty() && !window.is_zero() {
                    drop(q);
                    std::thread::sleep(window);
                    q = inner.queue.lock();
                }
            }
            std::mem::take(&mut *q)
        };
        if !batch.is_empty() {
            inner.metrics.group_commit_batch.observe(batch.len() as u64);
        }
        for s in &batch {
            s.sync(&inner.metrics);
        }
        if inner.stop.load(Ordering::SeqCst) {
            return;
        }
    }
}
