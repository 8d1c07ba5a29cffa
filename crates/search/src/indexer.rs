//! The background indexer of one topic's index on this node: for each partition of the topic
//! this node holds, it reads the log from that partition's progress up to its high watermark
//! (never above it, never on the produce path), adds the records to the topic's index and
//! commits every partition's progress at once, at least every `commit_interval`. Its steps run
//! on the shared [`IndexingPool`] and it holds an index writer only while it has something to
//! write (see [`crate::pool`]). The pool's threads (and tantivy's, which they start) run at
//! idle priority, so they never touch a partition: each turn's log reads are made before it on
//! the runtime, at normal priority ([`Look`]); an idle thread holding a partition's lock would
//! keep producers waiting while it gets no CPU. Under overload it falls behind (the lag metrics show it);
//! producers never wait for it. When the index's writer fails (a full disk, an I/O error)
//! everything since the last commit is dropped and indexing goes on from that commit's
//! progress once the writer works again: progress never passes a record that is not
//! committed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use spate_broker::Partition;
use tantivy::IndexWriter;

use crate::document;
use crate::error::SearchError;
use crate::index::TopicIndex;
use crate::mapping::TopicMapping;
use crate::metrics::{IndexMetrics, SearchMetrics};
use crate::pool::{IndexingPool, Waiting, WriterSlot};
use crate::record::decode_batches;

/// How an indexer runs.
#[derive(Debug, Clone, Copy)]
pub struct IndexerSettings {
    /// Longest time indexed records wait for a commit (the freshness bound's main part).
    pub commit_interval: Duration,
    /// Bytes of log read per partition per step.
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

/// Most log bytes read for one turn over all partitions (what a turn holds in memory).
const TURN_READ_BYTES: usize = 8 << 20;

/// Pause after a failed step before the next try (never a hot loop).
const FAILURE_PAUSE: Duration = Duration::from_millis(500);
/// Longest wait for a writer slot before looking again (a release may be missed).
const SLOT_RECHECK: Duration = Duration::from_millis(50);

/// One partition an indexer indexes: its log, and its figures.
#[derive(Clone)]
pub struct Feed {
    /// The partition's log.
    pub partition: Arc<Partition>,
    /// Its figures.
    pub metrics: Arc<IndexMetrics>,
}

/// A running indexer; dropping it does not stop it, [`Indexer::stop`] does.
pub struct Indexer {
    stop: Arc<Stop>,
    done: std::sync::mpsc::Receiver<()>,
    /// A new set of partitions to index, taken at the next turn.
    feeds: Arc<Mutex<Option<Vec<Feed>>>>,
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
    /// Starts indexing `feeds` into `index`, each partition from its committed progress (its
    /// log start when it has none), its steps on `pool`, its waits on `runtime`.
    pub fn start(
        index: Arc<TopicIndex>,
        feeds: Vec<Feed>,
        settings: IndexerSettings,
        shared: Arc<SearchMetrics>,
        pool: Arc<IndexingPool>,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let stop = Arc::new(Stop::default());
        let (done_tx, done) = std::sync::mpsc::channel();
        let wanted = Arc::new(Mutex::new(Some(feeds)));
        let mapping = TopicMapping::clone(&index.schema.dynamic.load());
        let run = Run {
            published_fields: mapping.fields.len(),
            mapping,
            spans: BTreeMap::new(),
            rotate: 0,
            index,
            writer: None,
            pool: pool.clone(),
            cursors: BTreeMap::new(),
            wanted: wanted.clone(),
            to_remove: BTreeSet::new(),
            removing: BTreeSet::new(),
            failed: false,
            settings,
            shared,
            dirty: false,
            last_commit: Instant::now(),
            last_write: Instant::now(),
            indexed_last_step: false,
        };
        runtime.spawn(drive(run, stop.clone(), pool, done_tx));
        Self {
            stop,
            done,
            feeds: wanted,
        }
    }

    /// The partitions to index from now on (a replica came to this node or left it); a
    /// partition left out has its documents deleted.
    pub fn set_feeds(&self, feeds: Vec<Feed>) {
        *self.feeds.lock() = Some(feeds);
        self.stop.wake.notify_one();
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
    let mut failures = 0u32;
    // Counted as waiting for a writer slot from a turn that found none to one that found one.
    let mut waiting: Option<Waiting> = None;
    loop {
        let stopping = stop.requested();
        if !stopping && !run.failed {
            run.apply_feeds();
        }
        // Moves of a high watermark from here on wake the wait below.
        for c in run.cursors.values_mut() {
            c.hw.borrow_and_update();
        }
        if !stopping && !run.failed {
            // At normal priority, on the runtime: the turn's threads never read a partition.
            run.look();
        }
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
                    tracing::warn!(topic = %run.index.topic, error = %e, "search indexing step failed; retrying from the last commit");
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
                    // Idle: woken by the first partition whose high watermark moves. Only
                    // here: a watch per partition while records flow would wake a task on
                    // every append.
                    let moves: Vec<_> = run
                        .cursors
                        .values_mut()
                        .map(|c| {
                            Box::pin(async move {
                                // A partition gone (its watch closed) wakes nothing.
                                if c.hw.changed().await.is_err() {
                                    std::future::pending::<()>().await
                                }
                            })
                        })
                        .collect();
                    let any_moved = async {
                        if moves.is_empty() {
                            std::future::pending::<()>().await
                        } else {
                            let _ = futures::future::select_all(moves).await;
                        }
                    };
                    let _ = tokio::time::timeout(wait, async {
                        tokio::select! {
                            _ = any_moved => {}
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

/// What a partition showed before a turn: its offsets, and the records the turn indexes.
struct Look {
    hw: i64,
    start: i64,
    end: i64,
    /// Records read from the offset given (whole batches), or why they could not be.
    read: Option<(i64, Result<bytes::Bytes, String>)>,
}

/// Where indexing of one partition stands.
struct Cursor {
    feed: Feed,
    /// The offset of the next record to index (`None`: the log start).
    next: Option<i64>,
    applied_start: i64,
    /// The lowest log cut whose deletions are queued but not committed yet.
    uncommitted_cut: Option<i64>,
    /// A cut not applied yet: taken from the partition, or dropped by a failure.
    lost_cut: Option<i64>,
    /// The offset of a schema'd value whose schema id the registry does not know yet, and
    /// since when indexing waits for it (see [`SCHEMA_ID_WAIT`]).
    schema_wait: Option<(i64, Instant)>,
    /// The partition's high watermark, watched while the indexer is idle.
    hw: tokio::sync::watch::Receiver<i64>,
    /// What the partition showed before this turn (none for one added since).
    look: Option<Look>,
}

struct Run {
    index: Arc<TopicIndex>,
    /// The topic's dynamic mapping as this indexer extends it; published to queries whole.
    mapping: TopicMapping,
    /// Fields of the mapping last published.
    published_fields: usize,
    /// Event time bounds of the documents added this turn, published before they commit.
    spans: BTreeMap<i32, (i64, i64)>,
    /// Which partition reads first in the next turn's look (each gets its turn at the
    /// read budget).
    rotate: usize,
    /// Held only while there is something to write.
    writer: Option<OpenWriter>,
    pool: Arc<IndexingPool>,
    /// The partitions indexed, by number.
    cursors: BTreeMap<i32, Cursor>,
    /// A new set of partitions, from [`Indexer::set_feeds`].
    wanted: Arc<Mutex<Option<Vec<Feed>>>>,
    /// Partitions whose documents are to be deleted (the replica left this node).
    to_remove: BTreeSet<i32>,
    /// Partitions whose deletion is queued in the writer but not committed yet.
    removing: BTreeSet<i32>,
    /// The last step failed: the writer is recovered before the next one.
    failed: bool,
    settings: IndexerSettings,
    shared: Arc<SearchMetrics>,
    dirty: bool,
    last_commit: Instant,
    /// When the writer last took a document or a deletion.
    last_write: Instant,
    /// The last step indexed at least one record.
    indexed_last_step: bool,
}

/// How long indexing under `search.value.format=schema` waits for a schema id the registry
/// does not know yet (a node whose copy of `_schemas` lags the topic's records) before the
/// value is indexed as text, as a value that cannot be decoded is.
const SCHEMA_ID_WAIT: Duration = Duration::from_secs(30);

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

impl Cursor {
    fn new(feed: Feed, next: Option<i64>) -> Self {
        let hw = feed.partition.watch_high_watermark();
        Self {
            feed,
            next,
            applied_start: i64::MIN,
            uncommitted_cut: None,
            lost_cut: None,
            schema_wait: None,
            hw,
            look: None,
        }
    }

    fn partition(&self) -> i32 {
        self.feed.partition.index
    }

    /// Looks at the partition (on the runtime, at normal priority): its offsets, the cuts it
    /// made, and up to `read_bytes` of records (at most `budget`, which it lowers) from where
    /// this turn will index.
    fn look(&mut self, read_bytes: usize, budget: &mut usize) {
        let p = &self.feed.partition;
        let (hw, start, end) = (p.high_watermark(), p.log_start_offset(), p.log_end_offset());
        self.lost_cut = min_cut(self.lost_cut, p.take_lowest_cut());
        let from = self.planned_next(start, end);
        // Records read for a turn that did not take them (it found no writer slot) are
        // taken as they are, not read again at every look while the turn waits.
        if let Some(Look {
            read: Some((at, Ok(records))),
            ..
        }) = self.look.take()
        {
            if at == from && from < hw {
                *budget = budget.saturating_sub(records.len().max(1));
                self.look = Some(Look {
                    hw,
                    start,
                    end,
                    read: Some((from, Ok(records))),
                });
                return;
            }
        }
        let read = (from < hw && *budget > 0).then(|| {
            let read = p
                .read(from, read_bytes.min(*budget), true)
                .map(|r| r.records)
                .map_err(|e| format!("reading partition {} at offset {from}: {e}", p.index));
            if let Ok(b) = &read {
                *budget = budget.saturating_sub(b.len().max(1));
            }
            (from, read)
        });
        self.look = Some(Look {
            hw,
            start,
            end,
            read,
        });
    }

    /// Where this turn indexes from: the progress, moved to a cut below it and into the
    /// log's bounds.
    fn planned_next(&self, start: i64, end: i64) -> i64 {
        let mut next = self.next.unwrap_or(start);
        if let Some(cut) = self.lost_cut.filter(|c| *c < next) {
            next = cut.max(start);
        }
        next.clamp(start, end.max(start))
    }

    /// Whether this partition has something to write: records, a retention or a cut.
    fn has_work(&mut self) -> bool {
        let Some(look) = &self.look else {
            return false;
        };
        let (hw, start, end) = (look.hw, look.start, look.end);
        let next = self.next.unwrap_or(start);
        let retention =
            start > self.applied_start && (self.applied_start != i64::MIN || next > start);
        let work = next < hw || next > end || retention || self.lost_cut.is_some_and(|c| c < next);
        if !work {
            self.applied_start = self.applied_start.max(start);
            self.feed.metrics.lag_records.set(0.max(hw - next));
        }
        work
    }

    /// Whether `r` is a schema'd value whose schema id the registry does not know yet, to be
    /// indexed once it does (or as text after [`SCHEMA_ID_WAIT`]).
    fn waits_for_schema(&mut self, index: &TopicIndex, r: &crate::record::LogRecord) -> bool {
        if index.settings.format != spate_broker::search_config::ValueFormat::Schema {
            return false;
        }
        let (Some(decoder), Some(v)) = (index.decoder.as_deref(), r.value.as_deref()) else {
            return false;
        };
        if !crate::record::has_schema_header(v) || !decoder.awaits_schema(v) {
            self.schema_wait = None;
            return false;
        }
        let since = match self.schema_wait {
            Some((offset, since)) if offset == r.offset => since,
            _ => {
                tracing::info!(topic = %index.topic, partition = self.partition(), offset = r.offset, "a schema id the registry does not know yet: indexing waits for it");
                self.feed.metrics.schema_id_waits.inc();
                let now = Instant::now();
                self.schema_wait = Some((r.offset, now));
                now
            }
        };
        since.elapsed() < SCHEMA_ID_WAIT
    }

    /// One step of this partition with `writer`, from what its look saw: its cuts and
    /// retention queued, then the records read added (their event time bounds in `spans`,
    /// new fields in `mapping`). Answers whether it wrote anything (`dirty`) and whether more
    /// records wait.
    fn step(
        &mut self,
        index: &TopicIndex,
        writer: &IndexWriter,
        mapping: &mut TopicMapping,
        spans: &mut BTreeMap<i32, (i64, i64)>,
    ) -> Result<(bool, bool), SearchError> {
        let p = self.partition();
        let Some(look) = self.look.take() else {
            // Added since the last look: its turn comes next.
            return Ok((false, true));
        };
        let (hw, start, end) = (look.hw, look.start, look.end);
        let mut dirty = false;
        let mut next = self.next.unwrap_or(start);
        if let Some(cut) = self.lost_cut.take() {
            if cut < next {
                // The log lost records this index holds, and may have new ones at their
                // offsets already: drop everything from the cut and index again from there.
                index.delete_from(writer, p, cut)?;
                self.uncommitted_cut = min_cut(self.uncommitted_cut, Some(cut));
                next = cut.max(start);
                dirty = true;
            }
        }
        if start > self.applied_start {
            // Retention removed segments: their records leave the index too.
            let retention = self.applied_start != i64::MIN || next > start;
            if retention {
                index.delete_below(writer, p, start)?;
                dirty = true;
            }
            self.applied_start = start;
        }
        if next < start {
            next = start;
            dirty = true;
        }
        if next > end {
            // The log was cut below what was indexed (a replica's divergent tail).
            index.delete_from(writer, p, end)?;
            self.uncommitted_cut = min_cut(self.uncommitted_cut, Some(end));
            next = end;
            dirty = true;
        }
        self.next = Some(next);
        let mut more = false;
        let mut added = 0u64;
        let records = match look.read {
            // Read from where this step stands (the look planned the same cuts and bounds).
            Some((from, read)) if from == next => Some(read),
            _ => None,
        };
        if next < hw && records.is_none() {
            // Nothing read for it this turn (the turn's read budget was spent): next turn.
            more = true;
        }
        if let Some(read) = records {
            let read = read.map_err(|reason| SearchError::Index { reason })?;
            let decoded = decode_batches(&read, next);
            for (base, reason) in &decoded.undecodable {
                self.feed.metrics.undecodable_batches.inc();
                tracing::warn!(topic = %index.topic, partition = p, base_offset = base, reason = %reason, "batch cannot be decoded; its records are not searchable");
            }
            let mut stopped = None;
            let mut span: Option<(i64, i64)> = spans.get(&p).copied();
            for r in decoded.records.iter().filter(|r| r.offset < hw) {
                if self.waits_for_schema(index, r) {
                    stopped = Some(r.offset);
                    break;
                }
                let (doc, skipped) = document::build_counted(
                    &index.schema,
                    mapping,
                    &index.settings,
                    index.decoder.as_deref(),
                    p,
                    r,
                );
                let at = skipped.event_ms;
                span = Some(span.map_or((at, at), |(lo, hi)| (lo.min(at), hi.max(at))));
                let m = &self.feed.metrics;
                m.undecodable_values.add(skipped.undecodable);
                m.unmapped_fields.add(skipped.unmapped);
                m.mapping_conflicts.add(skipped.conflicts);
                index.add(writer, doc)?;
                added += 1;
            }
            if let Some(span) = span {
                spans.insert(p, span);
            }
            self.feed.metrics.indexed_records.add(added);
            if let Some(n) = stopped.or(decoded.next_offset) {
                let reached = n.min(hw).max(next);
                dirty |= reached > next;
                next = reached;
                self.next = Some(next);
                more = stopped.is_none() && next < hw;
            }
        }
        self.feed.metrics.lag_records.set((hw - next).max(0));
        Ok((dirty || added > 0, more))
    }
}

impl Run {
    /// Takes a new set of partitions from [`Indexer::set_feeds`], if one came.
    fn apply_feeds(&mut self) {
        let Some(feeds) = self.wanted.lock().take() else {
            return;
        };
        let committed: BTreeSet<i32> = self.index.committed_partitions().into_iter().collect();
        let wanted: BTreeSet<i32> = feeds.iter().map(|f| f.partition.index).collect();
        let gone: Vec<i32> = self
            .cursors
            .keys()
            .copied()
            .filter(|p| !wanted.contains(p))
            .collect();
        for p in gone {
            self.cursors.remove(&p);
            self.to_remove.insert(p);
        }
        // Stored for a partition this node no longer holds (it left while the node was down).
        for p in committed.difference(&wanted) {
            if !self.removing.contains(p) {
                self.to_remove.insert(*p);
            }
        }
        for feed in feeds {
            let p = feed.partition.index;
            if let Some(c) = self.cursors.get_mut(&p) {
                c.feed.metrics = feed.metrics;
                continue;
            }
            // A partition whose documents are still being deleted starts from its log start
            // once they are (the deletion is queued before its first records).
            let deleting = self.to_remove.contains(&p) || self.removing.contains(&p);
            let next = if deleting {
                None
            } else {
                Some(self.index.committed_offset_of(p)).filter(|o| *o >= 0)
            };
            let cursor = Cursor::new(feed, next);
            self.cursors.insert(p, cursor);
        }
    }

    /// Looks at every partition before a turn (see [`Cursor::look`]), the first to read
    /// moving round at each turn so that all get their share of the read budget.
    fn look(&mut self) {
        let keys: Vec<i32> = self.cursors.keys().copied().collect();
        if keys.is_empty() {
            return;
        }
        let mut budget = TURN_READ_BYTES.max(self.settings.read_bytes);
        let first = self.rotate % keys.len();
        self.rotate = self.rotate.wrapping_add(1);
        for k in keys[first..].iter().chain(&keys[..first]) {
            if let Some(c) = self.cursors.get_mut(k) {
                c.look(self.settings.read_bytes, &mut budget);
            }
        }
    }

    /// Makes what this turn mapped visible before its documents can be: new fields to
    /// queries, event time bounds to pruning.
    fn publish(&mut self) {
        if self.mapping.fields.len() != self.published_fields {
            self.published_fields = self.mapping.fields.len();
            self.index
                .schema
                .dynamic
                .store(Arc::new(self.mapping.clone()));
        }
        self.index.widen_spans(&self.spans);
        self.spans.clear();
    }

    /// Each indexed partition's progress, as a commit records it.
    fn progress(&self) -> BTreeMap<i32, i64> {
        self.cursors
            .iter()
            .filter_map(|(p, c)| c.next.map(|n| (*p, n)))
            .collect()
    }

    /// One turn on a pool thread.
    fn turn(&mut self, stopping: bool) -> Turn {
        if stopping {
            if self.dirty && !self.failed {
                if let Err(e) = self.commit() {
                    tracing::error!(topic = %self.index.topic, error = %e, "search index: the last commit failed; indexing resumes from the one before");
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
            // The looks were made from the progress before the failure: look again.
            return Turn::More;
        }
        match self.step() {
            Ok(Step::More) => Turn::More,
            Ok(Step::NoWriter) => Turn::NoWriter,
            Ok(Step::CaughtUp) => {
                // Everything written is committed: the writer goes back when another
                // index waits for one, or once unused a while.
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

    fn commit(&mut self) -> Result<(), SearchError> {
        let started = Instant::now();
        let progress = self.progress();
        let index = self.index.clone();
        let writer =
            self.writer
                .as_mut()
                .map(|w| &mut w.writer)
                .ok_or_else(|| SearchError::Index {
                    reason: "no index writer".into(),
                })?;
        index.commit(writer, progress)?;
        self.shared
            .commit_latency_us
            .observe(started.elapsed().as_micros() as u64);
        self.dirty = false;
        self.removing.clear();
        for c in self.cursors.values_mut() {
            c.uncommitted_cut = None;
        }
        self.last_commit = Instant::now();
        Ok(())
    }

    /// Drops what the writer held since the last commit and goes back to that commit's
    /// progress; deletions queued since (retention, log cuts, partitions gone) are queued
    /// again by the next step.
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
        self.to_remove.append(&mut self.removing);
        for (p, c) in self.cursors.iter_mut() {
            c.look = None;
            c.feed.metrics.writer_recoveries.inc();
            c.next = if self.to_remove.contains(p) {
                None
            } else {
                committed.get(p).copied()
            };
            c.applied_start = i64::MIN;
            c.lost_cut = min_cut(c.lost_cut, c.uncommitted_cut.take());
        }
        tracing::info!(topic = %self.index.topic, "search index writer recovered; indexing again from the last commit");
        self.dirty = false;
        self.last_commit = Instant::now();
        Ok(())
    }

    /// One step over every partition; the caller waits when it answers `CaughtUp`.
    fn step(&mut self) -> Result<Step, SearchError> {
        let dirty = self.dirty;
        let mut work = dirty || !self.to_remove.is_empty();
        for c in self.cursors.values_mut() {
            // Every cursor looks (each takes its partition's cuts), not only the first.
            work |= c.has_work();
        }
        self.indexed_last_step = false;
        if !work {
            return Ok(Step::CaughtUp);
        }
        if self.writer.is_none() {
            let Some(slot) = self.pool.writers.try_take() else {
                return Ok(Step::NoWriter);
            };
            // tantivy's threads inherit the indexing priority of the thread making them.
            let writer = self.index.new_writer()?;
            self.writer = Some(OpenWriter {
                writer,
                _slot: slot,
            });
        }
        self.last_write = Instant::now();
        let index = self.index.clone();
        let Some(open) = self.writer.as_ref() else {
            return Ok(Step::NoWriter);
        };
        let writer = &open.writer;
        // Removals first: a partition that came back is indexed again after its old
        // documents are gone.
        for p in std::mem::take(&mut self.to_remove) {
            index.delete_partition(writer, p)?;
            self.removing.insert(p);
            self.dirty = true;
        }
        let mut more = false;
        for c in self.cursors.values_mut() {
            let before = c.feed.metrics.indexed_records.get();
            let (wrote, pending) = c.step(&index, writer, &mut self.mapping, &mut self.spans)?;
            self.dirty |= wrote;
            self.indexed_last_step |= c.feed.metrics.indexed_records.get() > before;
            more |= pending;
        }
        self.publish();
        // Caught up while another index waits for a writer: commit now and let it go
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
            self.commit()?;
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

    /// A one-thread pool with one writer slot.
    fn one_thread_pool() -> Arc<IndexingPool> {
        IndexingPool::start(
            crate::pool::PoolSettings {
                threads: 1,
                max_open_writers: 1,
            },
            || {},
        )
        .unwrap()
    }

    /// An indexer of `index` for `feeds` on `pool`, with short intervals.
    fn start_on(pool: &Arc<IndexingPool>, index: &Arc<TopicIndex>, feeds: Vec<Feed>) -> Indexer {
        Indexer::start(
            index.clone(),
            feeds,
            IndexerSettings {
                commit_interval: Duration::from_millis(20),
                read_bytes: 1 << 20,
                idle_poll: Duration::from_millis(20),
                step_delay: Duration::from_millis(5),
                writer_idle: Duration::from_secs(5),
            },
            Arc::new(SearchMetrics::default()),
            pool.clone(),
            &tokio::runtime::Handle::current(),
        )
    }

    /// An indexer of `index` for partition `p` on a one-thread pool.
    fn start(
        p: &Arc<Partition>,
        index: &Arc<TopicIndex>,
    ) -> (Indexer, Arc<IndexMetrics>, Arc<IndexingPool>) {
        let metrics = Arc::new(IndexMetrics::default());
        let pool = one_thread_pool();
        let feed = Feed {
            partition: p.clone(),
            metrics: metrics.clone(),
        };
        (start_on(&pool, index, vec![feed]), metrics, pool)
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
        let opened = TopicIndex::open_on(
            &dir.path().join("index"),
            "full",
            &settings,
            MIN_WRITER_MEMORY_BYTES,
            false,
            &move |d| Ok(Box::new(FullDisk::open(d, disk.clone())?)),
        )
        .unwrap();
        let index = Arc::new(opened.index);
        let (indexer, metrics, pool) = start(&p, &index);
        append(&p, &["a1", "a2", "a3"]);
        until("the first records are committed", || {
            index.committed_offset_of(0) == 3
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
            index.committed_offset_of(0),
            3,
            "progress passed records that were never committed"
        );

        // Space is back: every record is searchable, each once.
        full.store(false, Ordering::SeqCst);
        until("the records written meanwhile are committed", || {
            index.committed_offset_of(0) == 6
        })
        .await;
        assert_eq!(index.searcher().num_docs(), 6, "records lost or repeated");
        tokio::task::spawn_blocking(move || indexer.stop())
            .await
            .unwrap();
        pool.close();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn partitions_share_one_index_and_a_replica_that_leaves_takes_its_documents_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let broker = broker(&dir);
        let topic = broker
            .topics
            .create("moves", 2, TopicConfig::default(), false)
            .unwrap()
            .unwrap();
        let (p0, p1) = (topic.partition(0).unwrap(), topic.partition(1).unwrap());
        let at = dir.path().join("index");
        let settings = crate::testing::json_settings();
        let open =
            || TopicIndex::open(&at, "moves", &settings, MIN_WRITER_MEMORY_BYTES, false).unwrap();
        let pool = one_thread_pool();
        let feed = |p: &Arc<Partition>| Feed {
            partition: p.clone(),
            metrics: Arc::default(),
        };
        let start = |index: &Arc<TopicIndex>, feeds| start_on(&pool, index, feeds);
        let index = Arc::new(open().index);
        let indexer = start(&index, vec![feed(&p0), feed(&p1)]);
        append(&p0, &["a", "b", "c"]);
        append(&p1, &["x", "y"]);
        until("both partitions are committed in one index", || {
            index.committed_offset_of(0) == 3 && index.committed_offset_of(1) == 2
        })
        .await;
        assert_eq!(index.searcher().num_docs(), 5);

        // Partition 1's replica leaves this node: its documents and progress go.
        indexer.set_feeds(vec![feed(&p0)]);
        until("partition 1's documents are deleted", || {
            index.committed_partitions() == [0] && index.searcher().num_docs() == 3
        })
        .await;
        assert_eq!(index.span(1), None, "a partition gone keeps no time bounds");
        // It comes back: indexed again from its log start, each record once.
        indexer.set_feeds(vec![feed(&p0), feed(&p1)]);
        until("partition 1 is indexed again", || {
            index.committed_offset_of(1) == 2 && index.searcher().num_docs() == 5
        })
        .await;
        tokio::task::spawn_blocking(move || indexer.stop())
            .await
            .unwrap();
        drop(index);

        // After a restart each partition resumes from its own committed progress...
        let reopened = open();
        assert_eq!(reopened.progress, BTreeMap::from([(0, 3), (1, 2)]));
        // ...and a partition whose replica left while the node was down is dropped.
        let index = Arc::new(reopened.index);
        let indexer = start(&index, vec![feed(&p0)]);
        until(
            "the departed partition's documents are deleted at start",
            || index.committed_partitions() == [0] && index.searcher().num_docs() == 3,
        )
        .await;
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
        let mut opened = TopicIndex::open(
            &dir.path().join("index"),
            "late",
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
        let (indexer, metrics, pool) = start(&p, &index);
        append(
            &p,
            &[
                "plain text first",
                "\0\0\0\0\x01{\"user\": \"ann\"}",
                "\0\0\0\0\x01{\"user\": \"bob\"}",
            ],
        );
        until("indexing stops at the unknown id", || {
            metrics.schema_id_waits.get() == 1 && index.committed_offset_of(0) == 1
        })
        .await;
        // Waiting, not indexing the values as text: nothing past the unknown id is searchable.
        assert_eq!(index.searcher().num_docs(), 1);
        // Only the plain text value (no header) counts as not decodable.
        assert_eq!(metrics.undecodable_values.get(), 1);

        // The registry learns the id: both values are indexed by field, none as text.
        known.store(true, Ordering::SeqCst);
        until("the values are indexed once their schema is known", || {
            index.committed_offset_of(0) == 3
        })
        .await;
        assert_eq!(index.searcher().num_docs(), 3);
        assert_eq!(metrics.undecodable_values.get(), 1);
        assert!(index.schema.dynamic.load().fields.contains_key("user"));
        tokio::task::spawn_blocking(move || indexer.stop())
            .await
            .unwrap();
        pool.close();
    }
}
