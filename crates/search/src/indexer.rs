//! The background indexer of one searchable partition: a thread that reads the log from the
//! index's progress up to the high watermark (never above it, never on the produce path),
//! adds the records to the index and commits at least every `commit_interval`. Under
//! overload it falls behind (the lag metrics show it); producers never wait for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spate_broker::Partition;
use tantivy::IndexWriter;

use crate::document;
use crate::error::SearchError;
use crate::index::PartitionIndex;
use crate::metrics::{IndexMetrics, SearchMetrics};
use crate::record::decode_batches;

/// How an indexer runs.
#[derive(Debug, Clone, Copy)]
pub struct IndexerSettings {
    /// Longest time indexed records wait for a commit (the freshness bound's main part).
    pub commit_interval: Duration,
    /// Bytes of log read per step.
    pub read_bytes: usize,
    /// Longest sleep between looks at the log when nothing happens (retention, stop).
    pub idle_poll: Duration,
    /// While records keep arriving, the pause between steps once caught up: the indexer
    /// takes what arrived meanwhile in one step instead of waking on every append.
    pub step_delay: Duration,
}

impl Default for IndexerSettings {
    fn default() -> Self {
        Self {
            commit_interval: Duration::from_millis(200),
            read_bytes: 1 << 20,
            idle_poll: Duration::from_millis(500),
            step_delay: Duration::from_millis(50),
        }
    }
}

/// A running indexer; dropping it does not stop it, [`Indexer::stop`] does.
pub struct Indexer {
    stop: Arc<Stop>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The stop request of an indexer: a flag, and a wake-up for an indexer waiting for records
/// (or pausing after a failure), so stopping never waits out a poll interval.
#[derive(Default)]
struct Stop {
    flag: AtomicBool,
    wake: tokio::sync::Notify,
}

impl Stop {
    fn requested(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Waits up to `d`, returning early on a stop request.
    fn pause(&self, rt: &tokio::runtime::Handle, d: Duration) {
        if !self.requested() {
            let _ = rt.block_on(async { tokio::time::timeout(d, self.wake.notified()).await });
        }
    }
}

impl Indexer {
    /// Starts indexing `partition` into `index` from `resume_at` (the log start when `None`).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        partition: Arc<Partition>,
        index: Arc<PartitionIndex>,
        writer: IndexWriter,
        resume_at: Option<i64>,
        settings: IndexerSettings,
        metrics: Arc<IndexMetrics>,
        shared: Arc<SearchMetrics>,
        runtime: tokio::runtime::Handle,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(Stop::default());
        let flag = stop.clone();
        let name = format!("search-{}-{}", index.topic, index.partition);
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            let mut run = Run {
                partition,
                index,
                writer,
                next: resume_at,
                applied_start: i64::MIN,
                settings,
                metrics,
                shared,
                dirty: false,
                last_commit: Instant::now(),
                indexed_last_step: false,
            };
            if let Err(e) = run.run(&flag, &runtime) {
                tracing::error!(topic = %run.index.topic, partition = run.index.partition, error = %e, "search indexer stopped");
            }
        })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the indexer and waits for its thread (it finishes its current step first).
    pub fn stop(self) {
        self.request_stop();
        self.join();
    }

    /// Asks the indexer to stop (after its current step and last commit) without waiting;
    /// many can be asked at once and then joined.
    pub fn request_stop(&self) {
        self.stop.flag.store(true, Ordering::SeqCst);
        // A permit for a wait that has not started yet, or the wake of one that has.
        self.stop.wake.notify_one();
    }

    /// Waits for the indexer's thread to end.
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Run {
    partition: Arc<Partition>,
    index: Arc<PartitionIndex>,
    writer: IndexWriter,
    next: Option<i64>,
    applied_start: i64,
    settings: IndexerSettings,
    metrics: Arc<IndexMetrics>,
    shared: Arc<SearchMetrics>,
    dirty: bool,
    last_commit: Instant,
    /// The last step indexed at least one record.
    indexed_last_step: bool,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Run {
    fn run(&mut self, stop: &Stop, rt: &tokio::runtime::Handle) -> Result<(), SearchError> {
        let mut hw_watch = self.partition.watch_high_watermark();
        self.metrics
            .caught_up_at_ms
            .store(now_ms(), Ordering::Relaxed);
        let mut failures = 0u32;
        while !stop.requested() {
            // Moves of the high watermark from here on wake the wait below.
            hw_watch.borrow_and_update();
            match self.step() {
                Ok(true) => {
                    failures = 0;
                    continue;
                }
                Ok(false) => failures = 0,
                Err(e) => {
                    // A failed read or write is retried after a pause, never in a hot loop.
                    failures += 1;
                    if failures == 1 || failures % 60 == 0 {
                        tracing::warn!(topic = %self.index.topic, partition = self.index.partition, error = %e, "search indexing step failed; retrying");
                    }
                    stop.pause(rt, Duration::from_millis(500));
                    continue;
                }
            }
            // Caught up: wait for new records, or the commit deadline, or the idle poll.
            let wait = if self.dirty {
                self.settings
                    .commit_interval
                    .saturating_sub(self.last_commit.elapsed())
            } else {
                self.settings.idle_poll
            };
            if self.indexed_last_step {
                // Records are flowing: gather them for a while rather than waking on each
                // append. Each wake-up cost a context switch here and a wake on the
                // appending thread, per indexer, per produce request (in a cluster 3 nodes x
                // the partitions' indexers, on the producers' cores).
                stop.pause(rt, wait.min(self.settings.step_delay));
            } else if !stop.requested() {
                let _ = rt.block_on(async {
                    tokio::time::timeout(wait, async {
                        tokio::select! {
                            _ = hw_watch.changed() => {}
                            _ = stop.wake.notified() => {}
                        }
                    })
                    .await
                });
            }
        }
        if self.dirty {
            if let Some(next) = self.next {
                self.commit(next)?;
            }
        }
        Ok(())
    }

    fn commit(&mut self, next: i64) -> Result<(), SearchError> {
        let started = Instant::now();
        self.index.commit(&mut self.writer, next)?;
        self.shared
            .commit_latency_us
            .observe(started.elapsed().as_micros() as u64);
        self.dirty = false;
        self.last_commit = Instant::now();
        Ok(())
    }

    /// One step; true when there may be more to index at once.
    fn step(&mut self) -> Result<bool, SearchError> {
        // Normal priority while the partition's lock may be held (the reads below).
        let mut boost = Some(crate::priority::Boost::new());
        let hw = self.partition.high_watermark();
        let start = self.partition.log_start_offset();
        let end = self.partition.log_end_offset();
        let mut next = self.next.unwrap_or(start);
        if let Some(cut) = self.partition.take_lowest_cut() {
            if cut < next {
                // The log lost records this index holds, and may have new ones at their
                // offsets already: drop everything from the cut and index again from there.
                self.index.delete_from(&self.writer, cut)?;
                next = cut.max(start);
                self.dirty = true;
            }
        }
        if start > self.applied_start {
            // Retention removed segments: their records leave the index too.
            if self.applied_start != i64::MIN || next > start {
                self.index.delete_below(&self.writer, start)?;
                self.dirty = true;
            }
            self.applied_start = start;
        }
        if next < start {
            next = start;
            self.dirty = true;
        }
        if next > end {
            // The log was cut below what was indexed (a replica's divergent tail).
            self.index.delete_from(&self.writer, end)?;
            next = end;
            self.dirty = true;
        }
        self.next = Some(next);
        self.indexed_last_step = false;
        let mut more = false;
        if next < hw {
            let read = self
                .partition
                .read(next, self.settings.read_bytes, true)
                .map_err(|e| SearchError::Index {
                    reason: format!("reading offset {next}: {e}"),
                })?;
            boost = None;
            let decoded = decode_batches(&read.records, next);
            for (base, reason) in &decoded.undecodable {
                self.metrics.undecodable_batches.inc();
                tracing::warn!(topic = %self.index.topic, partition = self.index.partition, base_offset = base, reason = %reason, "batch cannot be decoded; its records are not searchable");
            }
            let mut added = 0u64;
            for r in decoded.records.iter().filter(|r| r.offset < hw) {
                let (doc, skipped) = document::build_counted(
                    &self.index.schema,
                    &self.index.settings,
                    self.index.partition,
                    r,
                );
                self.metrics.unmapped_fields.add(skipped.unmapped);
                self.metrics.mapping_conflicts.add(skipped.conflicts);
                self.index.add(&self.writer, doc)?;
                added += 1;
            }
            self.metrics.indexed_records.add(added);
            self.indexed_last_step = added > 0;
            if let Some(n) = decoded.next_offset {
                next = n.min(hw).max(next);
                self.next = Some(next);
                self.dirty = true;
                more = next < hw;
            }
        }
        drop(boost);
        self.metrics.lag_records.set((hw - next).max(0));
        if self.dirty && self.last_commit.elapsed() >= self.settings.commit_interval {
            self.commit(next)?;
        }
        if next >= hw && !self.dirty {
            self.metrics
                .caught_up_at_ms
                .store(now_ms(), Ordering::Relaxed);
        }
        Ok(more)
    }
}
