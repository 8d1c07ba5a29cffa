//! The background indexer of one searchable partition: it reads the log from the index's
//! progress up to the high watermark (never above it, never on the produce path), adds the
//! records to the index and commits at least every `commit_interval`. Its steps run on the
//! shared [`IndexingPool`] and it holds an index writer only while it has something to write
//! (see [`crate::pool`]). Under overload it falls behind (the lag metrics show it); producers
//! never wait for it. When the index's writer fails (a full disk, an I/O error) everything
//! since the last commit is dropped and indexing goes on from that commit's progress once the
//! writer works again: progress never passes a record that is not committed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spate_broker::Partition;
use tantivy::IndexWriter;

use crate::document;
use crate::error::SearchError;
use crate::index::PartitionIndex;
use crate::metrics::{IndexMetrics, SearchMetrics};
use crate::pool::{IndexingPool, Waiting, WriterSlot};
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
    /// A writer unused this long (everything committed) is given back.
    pub writer_idle: Duration,
}

impl Default for IndexerSettings {
    fn default() -> Self {
        Self {
            commit_interval: Duration::from_millis(200),
            read_bytes: 1 << 20,
            idle_poll: Duration::from_millis(500),
            step_delay: Duration::from_millis(50),
            writer_idle: Duration::from_secs(5),
        }
    }
}

/// The commit interval while an index is behind its log by more than a step's read.
const BEHIND_COMMIT_INTERVAL: Duration = Duration::from_secs(2);

/// Pause after a failed step before the next try (never a hot loop).
const FAILURE_PAUSE: Duration = Duration::from_millis(500);
/// Longest wait for a writer slot before looking again (a release may be missed).
const SLOT_RECHECK: Duration = Duration::from_millis(50);

/// A running indexer; dropping it does not stop it, [`Indexer::stop`] does.
pub struct Indexer {
    stop: Arc<Stop>,
    done: std::sync::mpsc::Receiver<()>,
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
    async fn pause(&self, d: Duration) {
        if !self.requested() {
            let _ = tokio::time::timeout(d, self.wake.notified()).await;
        }
    }
}

impl Indexer {
    /// Starts indexing `partition` into `index` from `resume_at` (the log start when `None`),
    /// its steps on `pool`, its waits on `runtime`.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        partition: Arc<Partition>,
        index: Arc<PartitionIndex>,
        resume_at: Option<i64>,
        settings: IndexerSettings,
        metrics: Arc<IndexMetrics>,
        shared: Arc<SearchMetrics>,
        pool: Arc<IndexingPool>,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let stop = Arc::new(Stop::default());
        let (done_tx, done) = std::sync::mpsc::channel();
        let run = Run {
            partition,
            index,
            writer: None,
            pool: pool.clone(),
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
            last_write: Instant::now(),
            indexed_last_step: false,
            schema_wait: None,
        };
        runtime.spawn(drive(run, stop.clone(), pool, done_tx));
        Self { stop, done }
    }

    /// Stops the indexer and waits for it (it finishes its current step and commits first).
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

    /// Waits for the indexer to end (call from outside the runtime's threads, or from a
    /// blocking task).
    pub fn join(self) {
        // The sender goes with the driving task, also when the runtime drops it.
        let _ = self.done.recv();
    }
}

/// What one turn on the pool came to.
enum Turn {
    /// There may be more to index at once.
    More,
    /// Caught up: wait for records, the commit deadline or the idle poll.
    Wait,
    /// Work waits for a writer slot.
    NoWriter,
    /// The step failed; tried again after a pause, from the last commit.
    Failed(SearchError),
    /// Stopped: last commit made, writer given back.
    Stopped,
}

/// Takes the indexer's turns on the pool, and waits between them on the runtime.
async fn drive(
    mut run: Run,
    stop: Arc<Stop>,
    pool: Arc<IndexingPool>,
    _done: std::sync::mpsc::Sender<()>,
) {
    let mut hw_watch = run.partition.watch_high_watermark();
    let mut failures = 0u32;
    // Counted as waiting for a writer slot from a turn that found none to one that found one.
    let mut waiting: Option<Waiting> = None;
    loop {
        // Moves of the high watermark from here on wake the wait below.
        hw_watch.borrow_and_update();
        let stopping = stop.requested();
        let Some((back, turn)) = pool
            .run(move || {
                let turn = run.turn(stopping);
                (run, turn)
            })
            .await
        else {
            // The pool closed under us: nothing more can be written.
            return;
        };
        run = back;
        if !matches!(turn, Turn::NoWriter) {
            waiting = None;
        }
        match turn {
            Turn::Stopped => return,
            Turn::More => failures = 0,
            Turn::NoWriter => {
                let slots = pool.writers.clone();
                waiting.get_or_insert_with(|| slots.wait_guard());
                let released = slots.released.notified();
                tokio::select! {
                    _ = released => {}
                    _ = tokio::time::sleep(SLOT_RECHECK) => {}
                    _ = stop.wake.notified() => {}
                }
            }
            Turn::Failed(e) => {
                failures += 1;
                if failures == 1 || failures % 60 == 0 {
                    tracing::warn!(topic = %run.index.topic, partition = run.index.partition, error = %e, "search indexing step failed; retrying from the last commit");
                }
                stop.pause(FAILURE_PAUSE).await;
            }
            Turn::Wait => {
                failures = 0;
                let wait = if run.dirty {
                    run.settings
                        .commit_interval
                        .saturating_sub(run.last_commit.elapsed())
                } else {
                    run.settings.idle_poll
                };
                if run.indexed_last_step {
                    // Records are flowing: gather them for a while rather than waking on
                    // each append. Each wake-up cost a context switch here and a wake on the
                    // appending thread, per indexer, per produce request.
                    stop.pause(wait.min(run.settings.step_delay)).await;
                } else if !stop.requested() {
                    let _ = tokio::time::timeout(wait, async {
                        tokio::select! {
                            _ = hw_watch.changed() => {}
                            _ = stop.wake.notified() => {}
                        }
                    })
                    .await;
                }
            }
        }
    }
}

/// An open writer and its slot (the slot is given back after the writer is closed).
struct OpenWriter {
    writer: IndexWriter,
    _slot: WriterSlot,
}

struct Run {
    partition: Arc<Partition>,
    index: Arc<PartitionIndex>,
    /// Held only while there is something to write.
    writer: Option<OpenWriter>,
    pool: Arc<IndexingPool>,
    next: Option<i64>,
    applied_start: i64,
    /// The lowest log cut whose deletions are queued but not committed yet.
    uncommitted_cut: Option<i64>,
    /// A cut not applied yet: taken from the partition, or dropped by a failure.
    lost_cut: Option<i64>,
    /// The last step failed: the writer is recovered before the next one.
    failed: bool,
    settings: IndexerSettings,
    metrics: Arc<IndexMetrics>,
    shared: Arc<SearchMetrics>,
    dirty: bool,
    last_commit: Instant,
    /// When the writer last took a document or a deletion.
    last_write: Instant,
    /// The last step indexed at least one record.
    indexed_last_step: bool,
    /// The offset of a schema'd value whose schema id the registry does not know yet, and
    /// since when indexing waits for it (see [`SCHEMA_ID_WAIT`]).
    schema_wait: Option<(i64, Instant)>,
}

/// How long indexing under `search.value.format=schema` waits for a schema id the registry
/// does not know yet (a node whose copy of `_schemas` lags the topic's records) before the
/// value is indexed as text, as a value that cannot be decoded is.
const SCHEMA_ID_WAIT: Duration = Duration::from_secs(30);

impl Run {
    /// Whether `r` is a schema'd value whose schema id the registry does not know yet, to be
    /// indexed once it does (or as text after [`SCHEMA_ID_WAIT`]).
    fn waits_for_schema(&mut self, r: &crate::record::LogRecord) -> bool {
        if self.index.settings.format != spate_broker::search_config::ValueFormat::Schema {
            return false;
        }
        let (Some(decoder), Some(v)) = (self.index.decoder.as_deref(), r.value.as_deref()) else {
            return false;
        };
        if !crate::record::has_schema_header(v) || !decoder.awaits_schema(v) {
            self.schema_wait = None;
            return false;
        }
        let since = match self.schema_wait {
            Some((offset, since)) if offset == r.offset => since,
            _ => {
                tracing::info!(topic = %self.index.topic, partition = self.index.partition, offset = r.offset, "a schema id the registry does not know yet: indexing waits for it");
                self.metrics.schema_id_waits.inc();
                let now = Instant::now();
                self.schema_wait = Some((r.offset, now));
                now
            }
        };
        since.elapsed() < SCHEMA_ID_WAIT
    }
}

/// The lower of two optional cuts.
fn min_cut(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What a step came to, short of failing.
enum Step {
    More,
    CaughtUp,
    NoWriter,
}

impl Run {
    /// One turn on a pool thread.
    fn turn(&mut self, stopping: bool) -> Turn {
        if stopping {
            if self.dirty && !self.failed {
                if let Some(next) = self.next {
                    if let Err(e) = self.commit(next) {
                        tracing::error!(topic = %self.index.topic, partition = self.index.partition, error = %e, "search index: the last commit failed; indexing resumes from the one before");
                    }
                }
            }
            self.writer = None;
            return Turn::Stopped;
        }
        if self.failed {
            if let Err(e) = self.recover() {
                return Turn::Failed(e);
            }
            self.failed = false;
        }
        match self.step() {
            Ok(Step::More) => Turn::More,
            Ok(Step::NoWriter) => Turn::NoWriter,
            Ok(Step::CaughtUp) => {
                // Everything written is committed: the writer goes back when another
                // partition waits for one, or once unused a while.
                let idle = self.last_write.elapsed() >= self.settings.writer_idle;
                if !self.dirty && (idle || self.pool.writers.contended()) {
                    self.writer = None;
                }
                Turn::Wait
            }
            Err(e) => {
                self.failed = true;
                Turn::Failed(e)
            }
        }
    }

    fn writer(&mut self) -> Result<&mut IndexWriter, SearchError> {
        self.last_write = Instant::now();
        self.writer
            .as_mut()
            .map(|w| &mut w.writer)
            .ok_or_else(|| SearchError::Index {
                reason: "no index writer".into(),
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
        if let Some(w) = self.writer.as_mut() {
            // tantivy's rollback makes a new writer from the old one's directory lock. When
            // that fails the lock is gone with it: the writer is dropped (rolling it back again
            // would find no lock and panic) and a new one made when there is work.
            if w.writer.rollback().is_err() {
                self.writer = None;
            }
        }
        let committed = self.index.reload_progress()?;
        self.metrics.writer_recoveries.inc();
        tracing::info!(topic = %self.index.topic, partition = self.index.partition, resume_at = ?committed, "search index writer recovered; indexing again from the last commit");
        self.next = committed;
        self.dirty = false;
        self.applied_start = i64::MIN;
        self.lost_cut = min_cut(self.lost_cut, self.uncommitted_cut.take());
        self.last_commit = Instant::now();
        Ok(())
    }

    /// One step; the caller waits when it answers `CaughtUp`.
    fn step(&mut self) -> Result<Step, SearchError> {
        // Normal priority while the partition's lock may be held (the reads below).
        let mut boost = Some(crate::priority::Boost::new());
        let hw = self.partition.high_watermark();
        let start = self.partition.log_start_offset();
        let end = self.partition.log_end_offset();
        self.lost_cut = min_cut(self.lost_cut, self.partition.take_lowest_cut());
        let mut next = self.next.unwrap_or(start);
        // Retention removed segments: their records leave the index too.
        let retention =
            start > self.applied_start && (self.applied_start != i64::MIN || next > start);
        let work = self.dirty
            || next < hw
            || next > end
            || retention
            || self.lost_cut.is_some_and(|c| c < next);
        if !work {
            drop(boost);
            self.applied_start = self.applied_start.max(start);
            self.indexed_last_step = false;
            self.metrics.lag_records.set(0.max(hw - next));
            return Ok(Step::CaughtUp);
        }
        if self.writer.is_none() {
            drop(boost.take());
            let Some(slot) = self.pool.writers.try_take() else {
                return Ok(Step::NoWriter);
            };
            // Made outside the boost: tantivy's threads inherit the indexing priority.
            let writer = self.index.new_writer()?;
            self.writer = Some(OpenWriter {
                writer,
                _slot: slot,
            });
            boost = Some(crate::priority::Boost::new());
        }
        let index = self.index.clone();
        if let Some(cut) = self.lost_cut.take() {
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
            if retention {
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
            let mut stopped = None;
            for r in decoded.records.iter().filter(|r| r.offset < hw) {
                if self.waits_for_schema(r) {
                    stopped = Some(r.offset);
                    break;
                }
                let (doc, skipped) = document::build_counted(
                    &self.index.schema,
                    &self.index.settings,
                    self.index.decoder.as_deref(),
                    self.index.partition,
                    r,
                );
                self.metrics.undecodable_values.add(skipped.undecodable);
                self.metrics.unmapped_fields.add(skipped.unmapped);
                self.metrics.mapping_conflicts.add(skipped.conflicts);
                index.add(self.writer()?, doc)?;
                added += 1;
            }
            self.metrics.indexed_records.add(added);
            self.indexed_last_step = added > 0;
            if let Some(n) = stopped.or(decoded.next_offset) {
                let reached = n.min(hw).max(next);
                self.dirty |= reached > next;
                next = reached;
                self.next = Some(next);
                more = stopped.is_none() && next < hw;
            }
        }
        drop(boost);
        self.metrics.lag_records.set((hw - next).max(0));
        // Caught up while another partition waits for a writer: commit now and let it go
        // rather than hold it until the commit interval is over.
        let hand_over = !more && self.pool.writers.contended();
        // Far behind, a commit every interval makes nothing fresh but costs a small segment
        // each (its term dictionaries built, then merged again and again): commit less often
        // until caught up.
        let interval = if more {
            self.settings.commit_interval.max(BEHIND_COMMIT_INTERVAL)
        } else {
            self.settings.commit_interval
        };
        if self.dirty && (hand_over || self.last_commit.elapsed() >= interval) {
            self.commit(next)?;
        }
        Ok(if more { Step::More } else { Step::CaughtUp })
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

    /// An indexer of `index` for partition `p` on a one-thread pool, with short intervals.
    fn start(
        p: &Arc<Partition>,
        index: &Arc<PartitionIndex>,
        resume_at: Option<i64>,
    ) -> (Indexer, Arc<IndexMetrics>, Arc<IndexingPool>) {
        let metrics = Arc::new(IndexMetrics::default());
        let pool = IndexingPool::start(
            crate::pool::PoolSettings {
                threads: 1,
                max_open_writers: 1,
            },
            || {},
        )
        .unwrap();
        let indexer = Indexer::start(
            p.clone(),
            index.clone(),
            resume_at,
            IndexerSettings {
                commit_interval: Duration::from_millis(20),
                read_bytes: 1 << 20,
                idle_poll: Duration::from_millis(20),
                step_delay: Duration::from_millis(5),
                writer_idle: Duration::from_secs(5),
            },
            metrics.clone(),
            Arc::new(SearchMetrics::default()),
            pool.clone(),
            &tokio::runtime::Handle::current(),
        );
        (indexer, metrics, pool)
    }

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
        let settings = crate::testing::json_settings();
        let full = Arc::new(AtomicBool::new(false));
        let disk = full.clone();
        let opened = PartitionIndex::open_on(
            &dir.path().join("index"),
            "full",
            0,
            &settings,
            MIN_WRITER_MEMORY_BYTES,
            false,
            &move |d| Ok(Box::new(FullDisk::open(d, disk.clone())?)),
        )
        .unwrap();
        let index = Arc::new(opened.index);
        let (indexer, metrics, pool) = start(&p, &index, opened.resume_at);
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
        tokio::task::spawn_blocking(move || indexer.stop())
            .await
            .unwrap();
        pool.close();
    }

    /// Knows schema id 1 (JSON after the 5-byte header) once `known` is set.
    struct LateRegistry {
        known: Arc<AtomicBool>,
    }

    impl crate::record::ValueDecoder for LateRegistry {
        fn decode(&self, value: &[u8]) -> Option<Result<serde_json::Value, String>> {
            (self.known.load(Ordering::SeqCst) && value.get(..5) == Some(&[0, 0, 0, 0, 1]))
                .then(|| serde_json::from_slice(&value[5..]).map_err(|e| e.to_string()))
        }

        fn awaits_schema(&self, value: &[u8]) -> bool {
            !self.known.load(Ordering::SeqCst) && value.get(..5) == Some(&[0, 0, 0, 0, 1])
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_schema_id_not_known_yet_is_waited_for_then_its_values_are_indexed_by_field() {
        let dir = tempfile::tempdir().unwrap();
        let broker = broker(&dir);
        let topic = broker
            .topics
            .create("late", 1, TopicConfig::default(), false)
            .unwrap()
            .unwrap();
        let p = topic.partition(0).unwrap();
        let settings = SearchSettings {
            format: ValueFormat::Schema,
            ..crate::testing::json_settings()
        };
        let mut opened = PartitionIndex::open(
            &dir.path().join("index"),
            "late",
            0,
            &settings,
            MIN_WRITER_MEMORY_BYTES,
            false,
        )
        .unwrap();
        let known = Arc::new(AtomicBool::new(false));
        opened.index.decoder = Some(Arc::new(LateRegistry {
            known: known.clone(),
        }));
        let index = Arc::new(opened.index);
        let (indexer, metrics, pool) = start(&p, &index, opened.resume_at);
        append(
            &p,
            &[
                "plain text first",
                "\0\0\0\0\x01{\"user\": \"ann\"}",
                "\0\0\0\0\x01{\"user\": \"bob\"}",
            ],
        );
        until("indexing stops at the unknown id", || {
            metrics.schema_id_waits.get() == 1 && index.committed_offset() == 1
        })
        .await;
        // Waiting, not indexing the values as text: nothing past the unknown id is searchable.
        assert_eq!(index.searcher().num_docs(), 1);
        // Only the plain text value (no header) counts as not decodable.
        assert_eq!(metrics.undecodable_values.get(), 1);

        // The registry learns the id: both values are indexed by field, none as text.
        known.store(true, Ordering::SeqCst);
        until("the values are indexed once their schema is known", || {
            index.committed_offset() == 3
        })
        .await;
        assert_eq!(index.searcher().num_docs(), 3);
        assert_eq!(metrics.undecodable_values.get(), 1);
        assert!(index.schema.dynamic.read().fields.contains_key("user"));
        tokio::task::spawn_blocking(move || indexer.stop())
            .await
            .unwrap();
        pool.close();
    }
}
