//! The background indexer of one searchable partition: a thread that reads the log from the
//! index's progress up to the high watermark (never above it, never on the produce path),
//! adds the records to the index and commits at least every `commit_interval`. Under
//! overload it falls behind (the lag metrics show it); producers never wait for it. When the
//! index's writer fails (a full disk, an I/O error) everything since the last commit is
//! dropped and indexing goes on from that commit's progress once the writer works again:
//! progress never passes a record that is not committed.

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
                writer: Some(writer),
                next: resume_at,
                applied_start: i64::MIN,
                uncommitted_cut: None,
                lost_cut: None,
                failed: false,
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
    /// `None` only while a failed writer could not be replaced yet.
    writer: Option<IndexWriter>,
    next: Option<i64>,
    applied_start: i64,
    /// The lowest log cut whose deletions are queued but not committed yet.
    uncommitted_cut: Option<i64>,
    /// A cut whose queued deletions a failure dropped: queued again by the next step.
    lost_cut: Option<i64>,
    /// The last step failed: the writer is recovered before the next one.
    failed: bool,
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

/// The lower of two optional cuts.
fn min_cut(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
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
            if self.failed {
                match self.recover() {
                    Ok(()) => self.failed = false,
                    Err(e) => {
                        failures += 1;
                        if failures == 1 || failures % 60 == 0 {
                            tracing::warn!(topic = %self.index.topic, partition = self.index.partition, error = %e, "search index writer cannot recover yet; retrying");
                        }
                        stop.pause(rt, Duration::from_millis(500));
                        continue;
                    }
                }
            }
            match self.step() {
                Ok(true) => {
                    failures = 0;
                    continue;
                }
                Ok(false) => failures = 0,
                Err(e) => {
                    // A failed read or write is retried after a pause, never in a hot loop,
                    // from the last commit (what the writer held since may be lost).
                    self.failed = true;
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
        if self.dirty && !self.failed {
            if let Some(next) = self.next {
                self.commit(next)?;
            }
        }
        Ok(())
    }

    fn writer(&mut self) -> Result<&mut IndexWriter, SearchError> {
        self.writer.as_mut().ok_or_else(|| SearchError::Index {
            reason: "the index writer failed and is not recovered".into(),
        })
    }

    fn commit(&mut self, next: i64) -> Result<(), SearchError> {
        let started = Instant::now();
        let index = self.index.clone();
        index.commit(self.writer()?, next)?;
        self.shared
            .commit_latency_us
            .observe(started.elapsed().as_micros() as u64);
        self.dirty = false;
        self.uncommitted_cut = None;
        self.last_commit = Instant::now();
        Ok(())
    }

    /// Drops what the writer held since the last commit and goes back to that commit's
    /// progress; deletions queued since (retention, log cuts) are queued again by the next
    /// step.
    fn recover(&mut self) -> Result<(), SearchError> {
        let committed = self.index.recover(&mut self.writer)?;
        self.metrics.writer_recoveries.inc();
        tracing::info!(topic = %self.index.topic, partition = self.index.partition, resume_at = ?committed, "search index writer recovered; indexing again from the last commit");
        self.next = committed;
        self.dirty = false;
        self.applied_start = i64::MIN;
        self.lost_cut = min_cut(self.lost_cut, self.uncommitted_cut.take());
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
        let index = self.index.clone();
        if let Some(cut) = min_cut(self.partition.take_lowest_cut(), self.lost_cut.take()) {
            if cut < next {
                // The log lost records this index holds, and may have new ones at their
                // offsets already: drop everything from the cut and index again from there.
                index.delete_from(self.writer()?, cut)?;
                self.uncommitted_cut = min_cut(self.uncommitted_cut, Some(cut));
                next = cut.max(start);
                self.dirty = true;
            }
        }
        if start > self.applied_start {
            // Retention removed segments: their records leave the index too.
            if self.applied_start != i64::MIN || next > start {
                index.delete_below(self.writer()?, start)?;
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
            index.delete_from(self.writer()?, end)?;
            self.uncommitted_cut = min_cut(self.uncommitted_cut, Some(end));
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
                index.add(self.writer()?, doc)?;
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use spate_broker::search_config::{SearchSettings, ValueFormat};
    use spate_broker::TopicConfig;

    use super::*;
    use crate::index::MIN_WRITER_MEMORY_BYTES;
    use crate::testing::{append, broker, FullDisk};

    async fn until(what: &str, mut ok: impl FnMut() -> bool) {
        // Generous: this bounds a hang, it measures nothing.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ok() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_disk_neither_loses_nor_repeats_records_once_space_is_back() {
        let dir = tempfile::tempdir().unwrap();
        let broker = broker(&dir);
        let topic = broker
            .topics
            .create("full", 1, TopicConfig::default(), false)
            .unwrap()
            .unwrap();
        let p = topic.partition(0).unwrap();
        let settings = SearchSettings {
            enabled: true,
            format: ValueFormat::Json,
            fields: Vec::new(),
            store_value: false,
            max_fields: 1000,
        };
        let full = Arc::new(AtomicBool::new(false));
        let disk = full.clone();
        let opened = PartitionIndex::open_on(
            &dir.path().join("index"),
            "full",
            0,
            &settings,
            MIN_WRITER_MEMORY_BYTES,
            &move |d| Ok(Box::new(FullDisk::open(d, disk.clone())?)),
        )
        .unwrap();
        let index = Arc::new(opened.index);
        let metrics = Arc::new(IndexMetrics::default());
        let indexer = Indexer::start(
            p.clone(),
            index.clone(),
            opened.writer,
            opened.resume_at,
            IndexerSettings {
                commit_interval: Duration::from_millis(20),
                read_bytes: 1 << 20,
                idle_poll: Duration::from_millis(50),
                step_delay: Duration::from_millis(5),
            },
            metrics.clone(),
            Arc::new(SearchMetrics::default()),
            tokio::runtime::Handle::current(),
        )
        .unwrap();
        append(&p, &["a1", "a2", "a3"]);
        until("the first records are committed", || {
            index.committed_offset() == 3
        })
        .await;

        // The disk fills: commits fail, the writer loses what it held, and is recovered.
        full.store(true, Ordering::SeqCst);
        append(&p, &["b1", "b2", "b3"]);
        until("a failed commit is recovered from", || {
            metrics.writer_recoveries.get() >= 1
        })
        .await;
        assert_eq!(
            index.committed_offset(),
            3,
            "progress passed records that were never committed"
        );

        // Space is back: every record is searchable, each once.
        full.store(false, Ordering::SeqCst);
        until("the records written meanwhile are committed", || {
            index.committed_offset() == 6
        })
        .await;
        assert_eq!(index.searcher().num_docs(), 6, "records lost or repeated");
        indexer.stop();
    }
}
