//! Group commit: one background thread turns many appends into few fsyncs.
//!
//! Appenders mark their log dirty; the flusher drains the dirty set, fsyncs each log's dirty
//! files once and publishes the offset now on disk. With `Always` it syncs as soon as work
//! exists (appends arriving during an fsync share the next one); with a group-commit window it
//! first waits for company; with `Interval` it syncs on a timer and nobody waits for it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use spate_metrics::Registry;
use tokio::sync::watch;

use crate::config::FsyncPolicy;
use crate::storage::{Storage, StorageFile};

/// How far a log is on disk, as published to waiting acknowledgements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Everything below this offset is on disk.
    Synced(i64),
    /// An fsync failed: the kernel may have dropped dirty pages, so nothing written since the
    /// last good fsync can be called durable until the log is reopened and recovered.
    Failed,
}

/// Why an acknowledgement cannot say its data is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DurabilityError {
    /// An fsync failed; the log is out of service until restart and recovery.
    #[error("fsync failed; the log is out of service until restart")]
    FsyncFailed,
    /// The log was closed or dropped before the offset became durable.
    #[error("the log closed before the data was on disk")]
    Closed,
}

/// Waits until everything below `offset` is on disk, or the log fails or closes.
pub async fn wait_durable(
    rx: &mut watch::Receiver<Durability>,
    offset: i64,
) -> Result<(), DurabilityError> {
    let seen = rx
        .wait_for(|d| match d {
            Durability::Synced(o) => *o >= offset,
            Durability::Failed => true,
        })
        .await
        .map_err(|_| DurabilityError::Closed)?;
    match *seen {
        Durability::Synced(_) => Ok(()),
        Durability::Failed => Err(DurabilityError::FsyncFailed),
    }
}

/// Per-log durability bookkeeping shared with the flusher thread.
pub(crate) struct SyncState {
    /// Offset after the last batch written to the page cache.
    written: AtomicI64,
    /// Files with writes not yet fsynced.
    dirty: Mutex<Vec<Arc<dyn StorageFile>>>,
    queued: AtomicBool,
    /// Set for good by a failed fsync or write.
    failed: AtomicBool,
    /// A segment file was created or removed since the directory was last synced.
    dir_dirty: AtomicBool,
    /// Bumped by every truncation: an fsync that started before one must not publish the
    /// end offset it saw, which may now name offsets that were cut and written again.
    truncations: AtomicU64,
    durable: watch::Sender<Durability>,
    /// The log's directory.
    path: PathBuf,
    storage: Arc<dyn Storage>,
}

impl SyncState {
    pub(crate) fn new(storage: Arc<dyn Storage>, path: PathBuf, end_offset: i64) -> Arc<Self> {
        Arc::new(Self {
            written: AtomicI64::new(end_offset),
            dirty: Mutex::new(Vec::new()),
            queued: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            dir_dirty: AtomicBool::new(false),
            truncations: AtomicU64::new(0),
            durable: watch::Sender::new(Durability::Synced(end_offset)),
            path,
            storage,
        })
    }

    /// Notes that the directory changed (a new segment): it is synced before the next
    /// durable offset is published, so a new segment's data is never reported durable while
    /// its directory entry could still vanish.
    pub(crate) fn dir_changed(&self) {
        self.dir_dirty.store(true, Ordering::Release);
    }

    /// Takes the log out of service after a failed write or fsync: waiters are told, appends
    /// are refused until the log is reopened and recovered.
    pub(crate) fn fail(&self) {
        self.failed.store(true, Ordering::Release);
        self.durable.send_replace(Durability::Failed);
    }

    /// Notes a write to `file` that ends at `end_offset`. The file goes on the dirty list
    /// before the offset is published, so a flusher that sees the offset also sees the file.
    pub(crate) fn written(&self, file: &Arc<dyn StorageFile>, end_offset: i64) {
        {
            let mut dirty = self.dirty.lock();
            if !dirty.iter().any(|f| Arc::ptr_eq(f, file)) {
                dirty.push(file.clone());
            }
        }
        self.written.store(end_offset, Ordering::Release);
    }

    /// Resets after truncation: everything below `end_offset` counts as durable (truncation
    /// only removes data, and a failed log is never reset).
    pub(crate) fn reset(&self, end_offset: i64) {
        self.truncations.fetch_add(1, Ordering::SeqCst);
        self.written.store(end_offset, Ordering::Release);
        if !self.failed() {
            self.durable.send_replace(Durability::Synced(end_offset));
        }
    }

    /// True once an fsync of this log failed.
    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// How far the log is on disk now.
    pub(crate) fn durable_now(&self) -> Durability {
        *self.durable.borrow()
    }

    /// Subscribes to the durable offset.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Durability> {
        self.durable.subscribe()
    }

    /// Fsyncs this log's dirty files and publishes the new durable offset. A failure is final:
    /// after a failed fsync the kernel may have dropped the dirty pages and marked them clean,
    /// so a later fsync that succeeds proves nothing ("fsyncgate"). Every waiter is woken with
    /// `Failed` and the log refuses further appends until it is reopened.
    pub(crate) fn sync(&self, metrics: &Registry) {
        self.queued.store(false, Ordering::SeqCst);
        if self.failed() {
            return;
        }
        let generation = self.truncations.load(Ordering::SeqCst);
        let end = self.written.load(Ordering::Acquire);
        let files = std::mem::take(&mut *self.dirty.lock());
        if self.dir_dirty.swap(false, Ordering::AcqRel) {
            if let Err(e) = self.storage.sync_dir(&self.path) {
                tracing::error!(
                    path = %self.path.display(),
                    error = %e,
                    "fsync of the log directory failed; the log is out of service until restart"
                );
                self.fail();
                return;
            }
        }
        for f in &files {
            let started = Instant::now();
            let synced = f.sync_data();
            metrics
                .fsync_latency
                .observe(started.elapsed().as_micros() as u64);
            if let Err(e) = synced {
                tracing::error!(
                    path = %self.path.display(),
                    error = %e,
                    "fsync failed; the log is out of service until restart and recovery"
                );
                self.fail();
                return;
            }
        }
        self.durable.send_if_modified(|d| match d {
            _ if self.truncations.load(Ordering::SeqCst) != generation => false,
            Durability::Synced(o) if end > *o => {
                *d = Durability::Synced(end);
                true
            }
            _ => false,
        });
    }
}

/// Work the flusher thread runs off the append path (sealing a segment).
pub(crate) type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Queue {
    syncs: Vec<Arc<SyncState>>,
    jobs: Vec<Job>,
}

struct Inner {
    policy: FsyncPolicy,
    metrics: Arc<Registry>,
    queue: Mutex<Queue>,
    wake: Condvar,
    stop: AtomicBool,
}

/// Handle to the broker-wide flusher thread.
#[derive(Clone)]
pub struct Flusher {
    inner: Arc<Inner>,
}

impl Flusher {
    /// Starts the flusher for `policy`.
    pub fn start(policy: FsyncPolicy) -> std::io::Result<Self> {
        Self::with_metrics(policy, Arc::new(Registry::default()))
    }

    /// Starts the flusher, recording fsync latency and group-commit batch sizes in `metrics`.
    /// Fails when the thread cannot be started: acknowledgements that wait for fsync would
    /// otherwise wait forever, so the caller must not serve.
    pub fn with_metrics(policy: FsyncPolicy, metrics: Arc<Registry>) -> std::io::Result<Self> {
        let inner = Self::inner(policy, metrics);
        // Even with `Never` the thread runs: it seals rolled segments off the append path.
        let worker = inner.clone();
        std::thread::Builder::new()
            .name("spate-flusher".into())
            .spawn(move || run(&worker))?;
        Ok(Self { inner })
    }

    /// A flusher with no thread: queued fsyncs and segment seals run only when
    /// [`Flusher::flush_now`] is called. A deterministic simulation decides that moment in
    /// its own virtual time instead of racing a background thread.
    pub fn manual(policy: FsyncPolicy) -> Self {
        Self {
            inner: Self::inner(policy, Arc::new(Registry::default())),
        }
    }

    fn inner(policy: FsyncPolicy, metrics: Arc<Registry>) -> Arc<Inner> {
        Arc::new(Inner {
            policy,
            metrics,
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        })
    }

    /// Runs every queued segment seal and fsync here and now, whatever the policy (the
    /// background write-back of a manual flusher).
    pub fn flush_now(&self) {
        let pending = std::mem::take(&mut *self.inner.queue.lock());
        for job in pending.jobs {
            job();
        }
        for s in pending.syncs {
            s.sync(&self.inner.metrics);
        }
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
            self.inner.queue.lock().syncs.push(state.clone());
            self.inner.wake.notify_one();
        }
    }

    /// Runs `job` on the flusher thread (or here, after shutdown).
    pub(crate) fn submit(&self, job: Job) {
        if self.inner.stop.load(Ordering::SeqCst) {
            job();
            return;
        }
        self.inner.queue.lock().jobs.push(job);
        self.inner.wake.notify_one();
    }

    /// Syncs everything outstanding and stops the thread.
    pub fn shutdown(&self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.wake.notify_one();
        let pending = std::mem::take(&mut *self.inner.queue.lock());
        for job in pending.jobs {
            job();
        }
        for s in pending.syncs {
            s.sync(&self.inner.metrics);
        }
    }
}

fn run(inner: &Inner) {
    let mut next_interval = match inner.policy {
        FsyncPolicy::Interval { every } => Some(Instant::now() + every),
        _ => None,
    };
    loop {
        let (jobs, syncs) = {
            let mut q = inner.queue.lock();
            loop {
                if inner.stop.load(Ordering::SeqCst) || !q.jobs.is_empty() {
                    break;
                }
                match (inner.policy, next_interval) {
                    (FsyncPolicy::Interval { .. }, Some(at)) => {
                        if Instant::now() >= at {
                            break;
                        }
                        inner.wake.wait_until(&mut q, at);
                    }
                    (FsyncPolicy::Never, _) => {
                        inner.wake.wait_for(&mut q, Duration::from_secs(1));
                    }
                    _ => {
                        if !q.syncs.is_empty() {
                            break;
                        }
                        inner.wake.wait_for(&mut q, Duration::from_secs(1));
                    }
                }
            }
            if let FsyncPolicy::GroupCommit { window } = inner.policy {
                if !q.syncs.is_empty() && q.jobs.is_empty() && !window.is_zero() {
                    drop(q);
                    std::thread::sleep(window);
                    q = inner.queue.lock();
                }
            }
            let jobs = std::mem::take(&mut q.jobs);
            let due = match (inner.policy, next_interval) {
                (FsyncPolicy::Interval { .. }, Some(at)) => Instant::now() >= at,
                (FsyncPolicy::Never, _) => false,
                _ => true,
            };
            let syncs = if due || inner.stop.load(Ordering::SeqCst) {
                std::mem::take(&mut q.syncs)
            } else {
                Vec::new()
            };
            (jobs, syncs)
        };
        for job in jobs {
            job();
        }
        if !syncs.is_empty() {
            inner.metrics.group_commit_batch.observe(syncs.len() as u64);
        }
        for s in &syncs {
            s.sync(&inner.metrics);
        }
        if let (FsyncPolicy::Interval { every }, Some(at)) = (inner.policy, next_interval) {
            if Instant::now() >= at {
                next_interval = Some(Instant::now() + every);
            }
        }
        if inner.stop.load(Ordering::SeqCst) {
            return;
        }
    }
}
