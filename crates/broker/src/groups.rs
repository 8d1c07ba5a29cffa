//! The shell around the pure group [`Coordinator`]: parks JoinGroup/SyncGroup requests until
//! their answers are released, ticks the coordinator's clock, and keeps committed offsets
//! durable in an internal log (`<data>/internal/__consumer_offsets`), hidden from topic
//! listings and compacted by rewriting it when it holds mostly superseded commits.
//!
//! Time comes from the broker's [`Clock`](crate::time::Clock): the coordinator (sessions,
//! rebalance deadlines) runs on monotonic time, so a wall-clock step cannot evict members;
//! commit timestamps and offset retention use wall time, as Kafka reports and keeps them.
//!
//! In cluster mode the commits go instead to partition 0 of the replicated internal topic
//! `__consumer_offsets`, and the node leading it coordinates every group: a commit is answered
//! once the ISR holds it, and a new leader rebuilds the offsets from its replica of the log.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use spate_groups::consumer_group::{ConsumerGroupConfig, ConsumerGroups, StateRecord};
use spate_groups::record::consumer::{self as consumer_record, AnyKey};
use spate_groups::record::{decode_value, encode_value, OffsetKey, RecordError};
use spate_groups::{Committed, Coordinator, CoordinatorConfig, OffsetStore, Reply, Token};
use spate_log::{wait_durable, Flusher, Log, LogConfig};
use spate_protocol::batch::{self, BatchError, Batches, NewRecord};
use spate_protocol::records::{Compression, RecordBatchDecoder};
use spate_protocol::ResponseError;
use thiserror::Error;
use tokio::sync::oneshot;

use crate::error::{io, BrokerError};
use crate::partition::{AppendError, Appended, Partition, Role};
use crate::time::SharedClock;

mod consumer;

/// Name of the internal offsets log, as in Kafka.
pub const OFFSETS_LOG: &str = "__consumer_offsets";
/// Rewrite the offsets log once it is this large and mostly superseded.
const COMPACT_FROM_BYTES: u64 = 64 << 20;
/// How often the coordinator's clock advances (session and rebalance timeouts resolve to it).
const TICK: Duration = Duration::from_millis(100);

/// Group settings from the broker configuration.
#[derive(Debug, Clone)]
pub struct GroupSettings {
    /// The coordinator's timeouts and limits.
    pub coordinator: CoordinatorConfig,
    /// KIP-848 consumer groups' session timeout, heartbeat interval and size cap.
    pub consumer: ConsumerGroupConfig,
    /// Committed offsets of groups without members expire after this long.
    pub offsets_retention_ms: i64,
    /// Largest metadata string accepted with a commit (offset.metadata.max.bytes).
    pub max_metadata_bytes: usize,
}

impl Default for GroupSettings {
    fn default() -> Self {
        Self {
            coordinator: CoordinatorConfig::default(),
            consumer: ConsumerGroupConfig::default(),
            offsets_retention_ms: 7 * 24 * 3600 * 1000,
            max_metadata_bytes: 4096,
        }
    }
}

struct OffsetsLog {
    log: Log,
    dir: PathBuf,
}

/// Offsets that could not be turned into a batch for the offsets log.
#[derive(Debug, Error)]
pub enum OffsetsEncodeError {
    /// A key field does not fit the record format (a name longer than 32767 bytes).
    #[error(transparent)]
    Key(#[from] RecordError),
    /// The batch could not be built.
    #[error(transparent)]
    Batch(#[from] BatchError),
}

/// What a compaction starts from: the live offsets as of `upto`, the log end when they were
/// taken. Commits at and after `upto` are copied over at the swap.
struct CompactionPlan {
    store: OffsetStore,
    consumer: Vec<StateRecord>,
    upto: i64,
    size_before: u64,
    dir: PathBuf,
}

/// Groups and committed offsets.
pub struct GroupService {
    settings: GroupSettings,
    coordinator: Mutex<Coordinator>,
    /// KIP-848 consumer groups. Lock order: `log`, `coordinator`, `consumer`, `offsets`.
    consumer: Mutex<ConsumerGroups>,
    waiters: Mutex<HashMap<Token, oneshot::Sender<Reply>>>,
    next_token: AtomicU64,
    offsets: Mutex<OffsetStore>,
    log: Mutex<OffsetsLog>,
    flusher: Flusher,
    clock: SharedClock,
    /// Size from which the offsets log is worth rewriting (a field so tests can lower it).
    compact_from_bytes: u64,
    /// Held while a compaction runs, so two never overlap.
    compacting: Mutex<()>,
    /// Cluster mode: group requests are served only while this node leads the offsets
    /// partition.
    clustered: std::sync::atomic::AtomicBool,
    /// The replicated offsets partition and the epoch this node took it over at.
    replicated: Mutex<Option<(Arc<Partition>, i32)>>,
}

impl GroupService {
    /// Opens the offsets log under `data_dir` and replays it.
    pub fn open(
        data_dir: &Path,
        settings: GroupSettings,
        flusher: Flusher,
        clock: SharedClock,
    ) -> Result<Self, BrokerError> {
        let dir = data_dir.join("internal").join(OFFSETS_LOG);
        recover_compaction(&dir)?;
        let (log, notes) = Log::open(&dir, offsets_log_config(), flusher.clone(), clock.now_ms())?;
        for n in notes {
            tracing::warn!("recovery: {OFFSETS_LOG}: {n}");
        }
        let mut store = OffsetStore::default();
        let nonce = nonce();
        let mut consumer = ConsumerGroups::new(settings.consumer.clone(), nonce);
        replay(&log, &mut store, &mut consumer)?;
        consumer.restored(clock.monotonic_ms());
        Ok(Self {
            coordinator: Mutex::new(Coordinator::new(settings.coordinator.clone(), nonce)),
            consumer: Mutex::new(consumer),
            settings,
            waiters: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(1),
            offsets: Mutex::new(store),
            log: Mutex::new(OffsetsLog { log, dir }),
            flusher,
            clock,
            compact_from_bytes: COMPACT_FROM_BYTES,
            compacting: Mutex::new(()),
            clustered: std::sync::atomic::AtomicBool::new(false),
            replicated: Mutex::new(None),
        })
    }

    /// Cluster mode: from now on groups are coordinated only while this node leads the
    /// replicated offsets partition ([`GroupService::take_over`]).
    pub fn set_clustered(&self) {
        self.clustered.store(true, Ordering::SeqCst);
    }

    /// Whether this node coordinates groups now: always when standalone; in a cluster while
    /// it leads the offsets partition in the epoch it took it over at.
    pub fn is_coordinator(&self) -> bool {
        !self.clustered.load(Ordering::SeqCst) || self.leading().is_some()
    }

    fn leading(&self) -> Option<Arc<Partition>> {
        self.replicated
            .lock()
            .as_ref()
            .filter(|(p, epoch)| p.role() == Role::Leader && p.leader_epoch() == *epoch)
            .map(|(p, _)| p.clone())
    }

    /// This node now leads the offsets partition at `epoch`: rebuilds the committed offsets
    /// from its replica of the log and starts groups afresh (members rejoin, as after any
    /// coordinator move). Does nothing when already taken over at that epoch.
    pub fn take_over(&self, partition: Arc<Partition>, epoch: i32) -> Result<(), BrokerError> {
        if self
            .replicated
            .lock()
            .as_ref()
            .is_some_and(|(_, e)| *e == epoch)
        {
            return Ok(());
        }
        let mut store = OffsetStore::default();
        let mut consumer = ConsumerGroups::new(self.settings.consumer.clone(), nonce());
        let (start, end) = (partition.log_start_offset(), partition.log_end_offset());
        replay_chunks(
            start,
            end,
            |o| partition.read_replica(o, 1 << 20, true),
            Path::new(OFFSETS_LOG),
            &mut store,
            &mut consumer,
        )?;
        consumer.restored(self.clock.monotonic_ms());
        let groups = store.group_ids().count();
        // Under the log lock, like every write, so no commit interleaves with the swap.
        let _order = self.log.lock();
        *self.offsets.lock() = store;
        self.reset_coordinator();
        *self.consumer.lock() = consumer;
        *self.replicated.lock() = Some((partition, epoch));
        tracing::info!(
            epoch,
            groups,
            records_to = end,
            "coordinating consumer groups: offsets rebuilt from the replicated log"
        );
        Ok(())
    }

    /// This node no longer leads the offsets partition: forgets groups and offsets (the new
    /// leader has them).
    pub fn step_down(&self) {
        if self.replicated.lock().take().is_some() {
            let _order = self.log.lock();
            *self.offsets.lock() = OffsetStore::default();
            self.reset_coordinator();
            *self.consumer.lock() = ConsumerGroups::new(self.settings.consumer.clone(), nonce());
            tracing::info!("no longer coordinating consumer groups");
        }
    }

    fn reset_coordinator(&self) {
        *self.coordinator.lock() = Coordinator::new(self.settings.coordinator.clone(), nonce());
        // Parked joins and syncs get no answer from the new coordinator: their senders drop
        // and the handlers answer with a retriable error.
        self.waiters.lock().clear();
    }

    /// The settings in force.
    pub fn settings(&self) -> &GroupSettings {
        &self.settings
    }

    /// Advances the coordinator's clock every 100 ms until the service is dropped.
    pub fn spawn_ticker(self: &Arc<Self>) {
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(s) = weak.upgrade() else { return };
                s.tick();
            }
        });
    }

    /// Lets the coordinator act on the time now: expired sessions, finished rebalance waits.
    pub fn tick(&self) {
        let now = self.clock.monotonic_ms();
        let replies = self.coordinator.lock().tick(now);
        self.deliver(replies);
        let mut log = self.log.lock();
        let records = self.consumer.lock().tick(now);
        if let Err(e) = self.append_consumer(&mut log, &records) {
            tracing::warn!(error = ?e, "recording expired consumer group members failed");
        }
    }

    /// Runs a coordinator call that may park a request; resolves with the parked request's
    /// answer.
    pub fn call(
        &self,
        f: impl FnOnce(&mut Coordinator, i64, Token) -> Vec<Reply>,
    ) -> impl std::future::Future<Output = Option<Reply>> + Send + 'static {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().insert(token, tx);
        let replies = f(
            &mut self.coordinator.lock(),
            self.clock.monotonic_ms(),
            token,
        );
        self.deliver(replies);
        async move { rx.await.ok() }
    }

    /// Reads the coordinator (describe, list...).
    pub fn coordinator<T>(&self, f: impl FnOnce(&Coordinator) -> T) -> T {
        f(&self.coordinator.lock())
    }

    /// Runs a coordinator call that answers at once and may release parked answers
    /// (heartbeat, leave, commit checks). The time given is monotonic, like every time the
    /// coordinator sees.
    pub fn with<T>(&self, f: impl FnOnce(&mut Coordinator, i64) -> (T, Vec<Reply>)) -> T {
        let (out, replies) = f(&mut self.coordinator.lock(), self.clock.monotonic_ms());
        self.deliver(replies);
        out
    }

    fn deliver(&self, replies: Vec<Reply>) {
        if replies.is_empty() {
            return;
        }
        let mut waiters = self.waiters.lock();
        for r in replies {
            let token = match &r {
                Reply::Join(t, _) | Reply::Sync(t, _) => *t,
            };
            if let Some(tx) = waiters.remove(&token) {
                // The client may have gone; its answer has nowhere to go.
                let _ = tx.send(r);
            }
        }
    }

    /// Every group (with members or only committed offsets): id, state, protocol type and
    /// member count.
    pub fn summaries(&self) -> Vec<(String, &'static str, String, usize)> {
        let coordinator = self.coordinator.lock();
        let mut out: Vec<(String, &'static str, String, usize)> = coordinator
            .list()
            .into_iter()
            .map(|(id, state, ptype)| {
                let members = coordinator.describe(&id).map_or(0, |d| d.members.len());
                (id, state.name(), ptype, members)
            })
            .collect();
        for (id, state, members) in self.consumer.lock().list() {
            out.push((id, state.name(), "consumer".to_string(), members));
        }
        for g in self.offsets.lock().group_ids() {
            if !out.iter().any(|(id, ..)| id == g) {
                out.push((
                    g.to_string(),
                    spate_groups::GroupState::Empty.name(),
                    String::new(),
                    0,
                ));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Deletes a group without members and its committed offsets (DeleteGroups).
    pub fn delete_group(&self, id: &str) -> Result<(), ResponseError> {
        let has_offsets = self.offsets.lock().has_group(id);
        let consumer = self.delete_consumer_group(id)?;
        match self.coordinator.lock().delete(id) {
            Err(ResponseError::GroupIdNotFound) if has_offsets || consumer => {}
            other => other?,
        }
        let tombstones: Vec<_> = self
            .offsets
            .lock()
            .group(id)
            .into_iter()
            .map(|(t, p, _)| (t.to_string(), p, None))
            .collect();
        self.write(id, &tombstones).map(|_| ())
    }

    /// Committed offsets, read under the store lock.
    pub fn offsets<T>(&self, f: impl FnOnce(&OffsetStore) -> T) -> T {
        f(&self.offsets.lock())
    }

    /// Writes commits (or, with `None` values, deletions) to the offsets log and applies them.
    /// Returns the offset after the written batch, for durability waits.
    pub fn write(
        &self,
        group: &str,
        entries: &[(String, i32, Option<Committed>)],
    ) -> Result<i64, ResponseError> {
        if entries.is_empty() {
            return Ok(self.log.lock().log.end_offset());
        }
        let batch = encode_batch(group, entries, self.clock.now_ms()).map_err(|e| {
            tracing::warn!(group, error = %e, "cannot encode offsets");
            ResponseError::InvalidCommitOffsetSize
        })?;
        let mut log = self.log.lock();
        let end = self.append_batch(&mut log, &batch)?;
        // Applied under the log lock so the store and the log agree on order.
        let mut store = self.offsets.lock();
        for (topic, partition, value) in entries {
            store.apply(group, topic, *partition, value.clone());
        }
        Ok(end)
    }

    /// Appends a batch to the offsets log (in a cluster, to the replicated offsets partition
    /// this node leads) under the log lock; returns the offset after it.
    fn append_batch(&self, log: &mut OffsetsLog, batch: &[u8]) -> Result<i64, ResponseError> {
        if !self.clustered.load(Ordering::SeqCst) {
            let info = log
                .log
                .append(batch, 0, None, self.clock.now_ms())
                .map_err(|e| {
                    tracing::error!(error = %e, "offsets log append failed");
                    ResponseError::KafkaStorageError
                })?;
            return Ok(info.last_offset + 1);
        }
        let partition = self.leading().ok_or(ResponseError::NotCoordinator)?;
        let header = batch::validate(batch).map_err(|e| {
            tracing::error!(error = %e, "built an invalid offsets batch");
            ResponseError::UnknownServerError
        })?;
        match partition.append(batch, &header, None) {
            Ok(Appended::New { last_offset, .. } | Appended::Duplicate { last_offset, .. }) => {
                Ok(last_offset + 1)
            }
            Err(AppendError::Refused(_)) => Err(ResponseError::NotCoordinator),
            Err(AppendError::Storage(e)) => {
                tracing::error!(error = %e, "offsets partition append failed");
                Err(ResponseError::KafkaStorageError)
            }
        }
    }

    /// Appends consumer group changes (already applied in memory) under the log lock, so
    /// the log holds them in the order they were made. `None` when there was nothing to write.
    fn append_consumer(
        &self,
        log: &mut OffsetsLog,
        records: &[StateRecord],
    ) -> Result<Option<i64>, ResponseError> {
        if records.is_empty() {
            return Ok(None);
        }
        let batch = encode_consumer_batch(records, self.clock.now_ms()).map_err(|e| {
            tracing::warn!(error = %e, "cannot encode consumer group records");
            ResponseError::UnknownServerError
        })?;
        self.append_batch(log, &batch).map(Some)
    }

    /// Waits until the offsets log is durable up to `end`, as the fsync policy promises acks:
    /// REQUEST_TIMED_OUT when the fsync takes over 30 s, KAFKA_STORAGE_ERROR when it failed.
    pub fn durable(
        &self,
        end: i64,
    ) -> impl std::future::Future<Output = Result<(), ResponseError>> + Send + 'static {
        let wait = self.flusher.policy().acks_wait_for_fsync();
        let replicated = if self.clustered.load(Ordering::SeqCst) {
            Some(self.leading())
        } else {
            None
        };
        let mut rx = match &replicated {
            Some(Some(p)) => p.durable_offset(),
            _ => self.log.lock().log.durable_offset(),
        };
        async move {
            if let Some(leading) = replicated {
                // Committed once every in-sync replica holds it, like an acks=all produce.
                let Some(p) = leading else {
                    return Err(ResponseError::NotCoordinator);
                };
                let epoch = p.leader_epoch();
                let mut hw = p.watch_high_watermark();
                let replicated = async {
                    loop {
                        if *hw.borrow_and_update() >= end {
                            return Ok(());
                        }
                        if p.role() != Role::Leader || p.leader_epoch() != epoch {
                            return Err(ResponseError::NotCoordinator);
                        }
                        if hw.changed().await.is_err() {
                            return Err(ResponseError::NotCoordinator);
                        }
                    }
                };
                match tokio::time::timeout(Duration::from_secs(30), replicated).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return Err(ResponseError::RequestTimedOut),
                }
            }
            if !wait {
                return Ok(());
            }
            match tokio::time::timeout(Duration::from_secs(30), wait_durable(&mut rx, end)).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(_)) => Err(ResponseError::KafkaStorageError),
                Err(_) => Err(ResponseError::RequestTimedOut),
            }
        }
    }

    /// Saves the offsets log for a clean shutdown.
    pub fn close(&self) {
        if let Err(e) = self.log.lock().log.close() {
            tracing::warn!(error = %e, "clean shutdown of {OFFSETS_LOG} failed; it will be scanned on start");
        }
    }

    /// Expires offsets of groups without members (offsets.retention.minutes) and compacts the
    /// offsets log when it is mostly superseded records. Called from the retention pass.
    pub fn maintain(&self) {
        let cutoff = self
            .clock
            .now_ms()
            .saturating_sub(self.settings.offsets_retention_ms);
        let expired = {
            let coordinator = self.coordinator.lock();
            let consumer = self.consumer.lock();
            self.offsets.lock().expired(cutoff, |g| {
                !coordinator.has_members(g) && !consumer.has_members(g)
            })
        };
        let mut by_group: HashMap<String, Vec<(String, i32, Option<Committed>)>> = HashMap::new();
        for (g, t, p) in expired {
            by_group.entry(g).or_default().push((t, p, None));
        }
        for (g, entries) in by_group {
            match self.write(&g, &entries) {
                Ok(_) => {
                    tracing::info!(group = %g, offsets = entries.len(), "expired committed offsets")
                }
                Err(e) => tracing::warn!(group = %g, error = ?e, "offset expiry failed"),
            }
        }
        self.forget_empty_consumer_groups();
        if let Err(e) = self.compact_if_worthwhile() {
            tracing::error!(error = %e, "compacting {OFFSETS_LOG} failed");
        }
    }

    /// Rewrites the offsets log with only its live commits when it is mostly superseded ones.
    /// The copy is written without the log lock, so OffsetCommit goes on meanwhile; the lock
    /// is held only to take the live set, and at the end to copy the commits made meanwhile
    /// and swap the logs.
    fn compact_if_worthwhile(&self) -> Result<(), BrokerError> {
        let Some(_running) = self.compacting.try_lock() else {
            return Ok(());
        };
        let Some(plan) = self.plan_compaction() else {
            return Ok(());
        };
        let fresh = self.write_compacted(&plan)?;
        self.swap_in(plan, fresh)
    }

    /// The live offsets and where the log ended when they were taken, if a rewrite is due.
    fn plan_compaction(&self) -> Option<CompactionPlan> {
        let guard = self.log.lock();
        let size = guard.log.size_bytes();
        // Taken under the log lock: `write` applies to the store under it too, so the store
        // is exactly the log up to `upto`.
        let consumer = self.consumer.lock().records();
        let store = self.offsets.lock();
        let live = (store.len() + consumer.len()) as u64 * 128;
        if size < self.compact_from_bytes || size < live.saturating_mul(4) {
            return None;
        }
        Some(CompactionPlan {
            store: store.clone(),
            consumer,
            upto: guard.log.end_offset(),
            size_before: size,
            dir: guard.dir.clone(),
        })
    }

    /// Writes the plan's live offsets and consumer groups into a new log beside the current
    /// one.
    fn write_compacted(&self, plan: &CompactionPlan) -> Result<Log, BrokerError> {
        let fresh = sibling(&plan.dir, "compacting");
        if fresh.exists() {
            std::fs::remove_dir_all(&fresh).map_err(io("remove", &fresh))?;
        }
        let now = self.clock.now_ms();
        let (mut log, _) = Log::open(&fresh, offsets_log_config(), self.flusher.clone(), now)?;
        let mut groups: Vec<&str> = plan.store.group_ids().collect();
        groups.sort_unstable();
        for g in groups {
            let entries: Vec<(String, i32, Option<Committed>)> = plan
                .store
                .group(g)
                .into_iter()
                .map(|(t, p, c)| (t.to_string(), p, Some(c.clone())))
                .collect();
            for chunk in entries.chunks(1000) {
                let batch =
                    encode_batch(g, chunk, now).map_err(|e| BrokerError::CorruptMetadata {
                        path: fresh.clone(),
                        reason: e.to_string(),
                    })?;
                log.append(&batch, 0, None, now)?;
            }
        }
        for chunk in plan.consumer.chunks(1000) {
            let batch =
                encode_consumer_batch(chunk, now).map_err(|e| BrokerError::CorruptMetadata {
                    path: fresh.clone(),
                    reason: e.to_string(),
                })?;
            log.append(&batch, 0, None, now)?;
        }
        Ok(log)
    }

    /// Under the log lock: copies the commits made since the plan, puts the new log in place
    /// of the old one and reopens it.
    fn swap_in(&self, plan: CompactionPlan, mut fresh: Log) -> Result<(), BrokerError> {
        let dir = plan.dir;
        let fresh_dir = sibling(&dir, "compacting");
        let old = sibling(&dir, "old");
        let mut guard = self.log.lock();
        let now = self.clock.now_ms();
        copy_batches(&guard.log, plan.upto, &mut fresh, now)?;
        // Durable (and indexed, for a quick reopen) before it replaces anything.
        fresh.close()?;
        drop(fresh);
        std::fs::rename(&dir, &old).map_err(io("rename", &dir))?;
        if let Err(e) = std::fs::rename(&fresh_dir, &dir) {
            // Put the old log back: it is still the one in use.
            let _ = std::fs::rename(&old, &dir);
            return Err(io("rename", &fresh_dir)(e));
        }
        sync_dir(dir.parent())?;
        let log = match Log::open(&dir, offsets_log_config(), self.flusher.clone(), now) {
            Ok((log, _)) => log,
            Err(e) => {
                // Undo the swap so the open log and the directory agree again; a restart would
                // otherwise pick the new copy and lose what is appended to the old one.
                let _ = std::fs::rename(&dir, &fresh_dir);
                let _ = std::fs::rename(&old, &dir);
                return Err(e.into());
            }
        };
        guard.log = log;
        let after = guard.log.size_bytes();
        drop(guard);
        std::fs::remove_dir_all(&old).map_err(io("remove", &old))?;
        tracing::info!(before = plan.size_before, after, "compacted {OFFSETS_LOG}");
        Ok(())
    }
}

/// Appends every batch of `from` at and after `start` to `to`, in order.
fn copy_batches(from: &Log, start: i64, to: &mut Log, now: i64) -> Result<(), BrokerError> {
    let end = from.end_offset();
    let mut offset = start.max(from.start_offset());
    // Each round copies at least one batch and moves `offset` past it, or stops.
    while offset < end {
        let chunk = from.read(offset, 1 << 20, end, true)?;
        let mut copied = false;
        for (at, h) in Batches::new(&chunk.records) {
            to.append(&chunk.records[at..at + h.total_len()], 0, None, now)?;
            offset = h.next_offset();
            copied = true;
        }
        if !copied {
            break;
        }
    }
    Ok(())
}

fn sync_dir(dir: Option<&Path>) -> Result<(), BrokerError> {
    if let Some(d) = dir {
        std::fs::File::open(d)
            .and_then(|f| f.sync_all())
            .map_err(io("fsync", d))?;
    }
    Ok(())
}

fn offsets_log_config() -> LogConfig {
    LogConfig {
        segment_bytes: 16 << 20,
        retention_ms: -1,
        retention_bytes: -1,
        ..LogConfig::default()
    }
}

fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut name = dir
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".{suffix}"));
    dir.with_file_name(name)
}

/// Finishes or undoes a compaction a crash interrupted: a half-written copy is discarded; a
/// swap that renamed the old log aside but not the new one into place is reverted.
fn recover_compaction(dir: &Path) -> Result<(), BrokerError> {
    let fresh = sibling(dir, "compacting");
    let old = sibling(dir, "old");
    if !dir.exists() && old.exists() {
        std::fs::rename(&old, dir).map_err(io("rename", &old))?;
    }
    for leftover in [fresh, old] {
        if leftover.exists() {
            std::fs::remove_dir_all(&leftover).map_err(io("remove", &leftover))?;
        }
    }
    Ok(())
}

fn replay(
    log: &Log,
    store: &mut OffsetStore,
    consumer: &mut ConsumerGroups,
) -> Result<(), BrokerError> {
    let end = log.end_offset();
    replay_chunks(
        log.start_offset(),
        end,
        |o| log.read(o, 1 << 20, end, true),
        log.dir(),
        store,
        consumer,
    )
}

/// Applies every commit and consumer group record in `[start, end)`, read a chunk at a time
/// by `read`.
fn replay_chunks(
    start: i64,
    end: i64,
    read: impl Fn(i64) -> Result<spate_log::ReadResult, spate_log::LogError>,
    origin: &Path,
    store: &mut OffsetStore,
    consumer: &mut ConsumerGroups,
) -> Result<(), BrokerError> {
    let mut offset = start;
    let mut skipped = 0usize;
    while offset < end {
        let chunk = read(offset)?;
        if chunk.records.is_empty() {
            break;
        }
        let mut buf = chunk.records.clone();
        let sets =
            RecordBatchDecoder::decode_all(&mut buf).map_err(|e| BrokerError::CorruptMetadata {
                path: origin.to_path_buf(),
                reason: e.to_string(),
            })?;
        for set in sets {
            for r in set.records {
                offset = offset.max(r.offset + 1);
                let Some(key) = r.key.and_then(|k| consumer_record::decode_key(k).ok()) else {
                    skipped += 1;
                    continue;
                };
                if let AnyKey::Offset(key) = key {
                    let value = match r.value {
                        None => None,
                        Some(v) => match decode_value(v) {
                            Ok(c) => Some(c),
                            Err(_) => {
                                skipped += 1;
                                continue;
                            }
                        },
                    };
                    store.apply(&key.group, &key.topic, key.partition, value);
                    continue;
                }
                match consumer_record::decode(&key, r.value) {
                    Ok(Some(record)) => consumer.replay(record),
                    Ok(None) => {}
                    Err(_) => skipped += 1,
                }
            }
        }
    }
    if skipped > 0 {
        tracing::warn!(skipped, "unreadable records in {OFFSETS_LOG} were ignored");
    }
    Ok(())
}

/// A batch of consumer group records for the offsets log.
fn encode_consumer_batch(records: &[StateRecord], now: i64) -> Result<Bytes, OffsetsEncodeError> {
    let records = records
        .iter()
        .map(|r| {
            let (key, value) = consumer_record::encode(r)?;
            Ok(NewRecord {
                key: Some(key),
                value,
                timestamp: now,
            })
        })
        .collect::<Result<Vec<_>, OffsetsEncodeError>>()?;
    Ok(batch::build(&records, None, Compression::None)?)
}

/// Distinguishes member ids made by this run from those of earlier runs.
fn nonce() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn encode_batch(
    group: &str,
    entries: &[(String, i32, Option<Committed>)],
    now: i64,
) -> Result<Bytes, OffsetsEncodeError> {
    let records = entries
        .iter()
        .map(|(topic, partition, value)| {
            let key = OffsetKey {
                group: group.to_string(),
                topic: topic.clone(),
                partition: *partition,
            }
            .encode()?;
            Ok(NewRecord {
                key: Some(key),
                value: value.as_ref().map(encode_value),
                timestamp: now,
            })
        })
        .collect::<Result<Vec<_>, OffsetsEncodeError>>()?;
    Ok(batch::build(&records, None, Compression::None)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{now_ms, Clock, ManualClock, SystemClock};
    use spate_groups::{JoinRequest, SyncRequest};
    use spate_log::FsyncPolicy;

    fn open(dir: &Path, flusher: &Flusher) -> GroupService {
        GroupService::open(
            dir,
            GroupSettings::default(),
            flusher.clone(),
            SystemClock::shared(),
        )
        .unwrap()
    }

    fn committed(offset: i64) -> Option<Committed> {
        Some(Committed {
            offset,
            leader_epoch: 2,
            metadata: Some("m".into()),
            commit_timestamp_ms: now_ms(),
        })
    }

    #[test]
    fn commits_survive_reopen_and_deletes_stick() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let svc = open(dir.path(), &flusher);
        svc.write(
            "g",
            &[
                ("t".into(), 0, committed(10)),
                ("t".into(), 1, committed(20)),
            ],
        )
        .unwrap();
        svc.write("g", &[("t".into(), 0, committed(11))]).unwrap();
        svc.write("g", &[("t".into(), 1, None)]).unwrap();
        drop(svc);
        let svc = open(dir.path(), &flusher);
        svc.offsets(|s| {
            assert_eq!(s.get("g", "t", 0).map(|c| c.offset), Some(11));
            assert!(s.get("g", "t", 1).is_none());
            assert_eq!(
                s.get("g", "t", 0)
                    .and_then(|c| c.metadata.clone())
                    .as_deref(),
                Some("m")
            );
        });
    }

    #[test]
    fn interrupted_compaction_is_undone() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let svc = open(dir.path(), &flusher);
        svc.write("g", &[("t".into(), 0, committed(10))]).unwrap();
        drop(svc);
        let main = dir.path().join("internal").join(OFFSETS_LOG);
        std::fs::rename(&main, sibling(&main, "old")).unwrap();
        std::fs::create_dir_all(sibling(&main, "compacting")).unwrap();
        let svc = open(dir.path(), &flusher);
        svc.offsets(|s| assert_eq!(s.get("g", "t", 0).map(|c| c.offset), Some(10)));
        assert!(!sibling(&main, "compacting").exists());
    }

    fn manual(dir: &Path, clock: &Arc<ManualClock>) -> GroupService {
        let mut settings = GroupSettings::default();
        settings.coordinator.initial_rebalance_delay_ms = 0;
        GroupService::open(
            dir,
            settings,
            Flusher::start(FsyncPolicy::Never).unwrap(),
            clock.clone(),
        )
        .unwrap()
    }

    /// Joins one consumer to `group` and completes the rebalance as its leader.
    fn stable_member(svc: &GroupService, group: &str, session_timeout_ms: i32) {
        let join = JoinRequest {
            group_id: group.into(),
            session_timeout_ms,
            rebalance_timeout_ms: session_timeout_ms,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"meta"))],
            ..JoinRequest::default()
        };
        let answer = svc.call(move |c, now, token| c.join(now, token, join));
        svc.tick();
        let Some(Reply::Join(_, joined)) = futures::executor::block_on(answer) else {
            panic!("no join answer");
        };
        assert_eq!(joined.error, None);
        let sync = SyncRequest {
            group_id: group.into(),
            generation_id: joined.generation_id,
            member_id: joined.member_id.clone(),
            assignments: vec![(joined.member_id, Bytes::from_static(b"all"))],
            ..SyncRequest::default()
        };
        let answer = svc.call(move |c, now, token| c.sync(now, token, sync));
        let Some(Reply::Sync(_, synced)) = futures::executor::block_on(answer) else {
            panic!("no sync answer");
        };
        assert_eq!(synced.error, None);
    }

    #[test]
    fn a_wall_clock_step_of_hours_evicts_no_member_but_elapsed_time_does() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let svc = manual(dir.path(), &clock);
        stable_member(&svc, "g", 10_000);
        clock.step_wall(6 * 3600 * 1000);
        svc.tick();
        clock.step_wall(-12 * 3600 * 1000);
        svc.tick();
        assert!(
            svc.coordinator(|c| c.has_members("g")),
            "a wall-clock step is not elapsed time"
        );
        clock.advance(9_999);
        svc.tick();
        assert!(svc.coordinator(|c| c.has_members("g")));
        clock.advance(2);
        svc.tick();
        assert!(
            !svc.coordinator(|c| c.has_members("g")),
            "the session ran out on the monotonic clock"
        );
    }

    #[test]
    fn offsets_of_empty_groups_expire_by_wall_clock_commit_time() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let svc = manual(dir.path(), &clock);
        let retention = svc.settings().offsets_retention_ms;
        let at = |offset| {
            Some(Committed {
                offset,
                leader_epoch: -1,
                metadata: None,
                commit_timestamp_ms: clock.now_ms(),
            })
        };
        svc.write("old", &[("t".into(), 0, at(1))]).unwrap();
        clock.step_wall(retention / 2);
        svc.write("new", &[("t".into(), 0, at(2))]).unwrap();
        clock.step_wall(retention / 2 + 1);
        svc.maintain();
        svc.offsets(|s| {
            assert!(s.get("old", "t", 0).is_none(), "older than retention");
            assert_eq!(s.get("new", "t", 0).map(|c| c.offset), Some(2));
        });
    }

    fn commit_many(svc: &GroupService, group: &str, rounds: i64) {
        for round in 0..rounds {
            let entries: Vec<_> = (0..50)
                .map(|p| ("topic".to_string(), p, committed(round * 100 + p as i64)))
                .collect();
            svc.write(group, &entries).unwrap();
        }
    }

    fn offset_of(svc: &GroupService, group: &str, partition: i32) -> Option<i64> {
        svc.offsets(|s| s.get(group, "topic", partition).map(|c| c.offset))
    }

    #[test]
    fn commits_made_while_the_offsets_log_is_rewritten_survive_the_swap_and_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let mut svc = open(dir.path(), &flusher);
        svc.compact_from_bytes = 1;
        commit_many(&svc, "a", 40);
        let before = svc.log.lock().log.size_bytes();
        let plan = svc
            .plan_compaction()
            .expect("mostly superseded: worth a rewrite");
        // OffsetCommit goes on while the copy is built, and after it is built.
        commit_many(&svc, "b", 2);
        let fresh = svc.write_compacted(&plan).unwrap();
        svc.write("a", &[("topic".into(), 7, committed(999_999))])
            .unwrap();
        svc.write("a", &[("topic".into(), 8, None)]).unwrap();
        svc.swap_in(plan, fresh).unwrap();
        let after = svc.log.lock().log.size_bytes();
        assert!(after < before / 4, "{after} of {before} bytes left");
        let check = |svc: &GroupService| {
            assert_eq!(offset_of(svc, "a", 7), Some(999_999));
            assert_eq!(offset_of(svc, "a", 8), None);
            assert_eq!(offset_of(svc, "a", 9), Some(3909));
            assert_eq!(offset_of(svc, "b", 3), Some(103));
        };
        check(&svc);
        svc.write("c", &[("topic".into(), 0, committed(5))])
            .unwrap();
        drop(svc);
        let svc = open(dir.path(), &flusher);
        check(&svc);
        assert_eq!(offset_of(&svc, "c", 0), Some(5));
        let main = dir.path().join("internal").join(OFFSETS_LOG);
        assert!(!sibling(&main, "old").exists() && !sibling(&main, "compacting").exists());
    }

    #[test]
    fn maintain_compacts_a_mostly_superseded_offsets_log() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let mut svc = open(dir.path(), &flusher);
        svc.compact_from_bytes = 1;
        commit_many(&svc, "a", 40);
        let before = svc.log.lock().log.size_bytes();
        svc.maintain();
        assert!(svc.log.lock().log.size_bytes() < before / 4);
        drop(svc);
        let svc = open(dir.path(), &flusher);
        assert_eq!(offset_of(&svc, "a", 49), Some(3949));
    }

    fn consumer_join(svc: &GroupService, group: &str, member: &str) -> i32 {
        use spate_groups::consumer_group::{HeartbeatRequest, TopicPartitions, TopicsView};
        let topics =
            TopicsView::from([("topic".to_string(), (uuid::Uuid::from_bytes([1; 16]), 4))]);
        let (answer, end) = svc.consumer_heartbeat(
            &topics,
            HeartbeatRequest {
                version: 1,
                group_id: group.into(),
                member_id: member.into(),
                member_epoch: 0,
                rebalance_timeout_ms: 10_000,
                subscribed_topic_names: Some(vec!["topic".into()]),
                owned: Some(TopicPartitions::new()),
                ..HeartbeatRequest::default()
            },
        );
        assert!(end.is_some(), "a join is written to the offsets log");
        answer.expect("joined").member_epoch
    }

    #[test]
    fn consumer_groups_survive_a_rewrite_of_the_offsets_log_and_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let mut svc = open(dir.path(), &flusher);
        svc.compact_from_bytes = 1;
        assert_eq!(consumer_join(&svc, "cg", "m"), 1);
        commit_many(&svc, "a", 40);
        let before = svc.log.lock().log.size_bytes();
        svc.maintain();
        assert!(svc.log.lock().log.size_bytes() < before / 4, "compacted");
        drop(svc);
        let svc = open(dir.path(), &flusher);
        let d = svc.consumer(|c| c.describe("cg")).expect("group rebuilt");
        assert_eq!(d.members.len(), 1);
        assert_eq!(d.members[0].member.epoch, 1);
        assert_eq!(
            d.members[0]
                .member
                .assigned
                .values()
                .map(|p| p.len())
                .sum::<usize>(),
            4
        );
    }

    #[test]
    fn empty_consumer_groups_without_offsets_are_forgotten_and_others_kept() {
        use spate_groups::consumer_group::{HeartbeatRequest, LEAVE_EPOCH};
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let svc = open(dir.path(), &flusher);
        for g in ["gone", "kept"] {
            consumer_join(&svc, g, "m");
            let (left, _) = svc.consumer_heartbeat(
                &Default::default(),
                HeartbeatRequest {
                    version: 1,
                    group_id: g.into(),
                    member_id: "m".into(),
                    member_epoch: LEAVE_EPOCH,
                    ..HeartbeatRequest::default()
                },
            );
            assert_eq!(left.unwrap().member_epoch, LEAVE_EPOCH);
        }
        svc.write("kept", &[("topic".into(), 0, committed(3))])
            .unwrap();
        svc.maintain();
        assert!(!svc.consumer(|c| c.contains("gone")));
        assert!(svc.consumer(|c| c.contains("kept")));
        drop(svc);
        let svc = open(dir.path(), &flusher);
        assert!(
            !svc.consumer(|c| c.contains("gone")),
            "the deletion is durable"
        );
    }
}
