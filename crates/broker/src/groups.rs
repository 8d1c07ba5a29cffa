//! The shell around the pure group [`Coordinator`]: parks JoinGroup/SyncGroup requests until
//! their answers are released, ticks the coordinator's clock, and keeps committed offsets and
//! KIP-848 group state durable in the internal topic `__consumer_offsets`.
//!
//! As in Kafka, `__consumer_offsets` has `offsets.topic.num.partitions` partitions (50 by
//! default) and a group lives in the one its id hashes to (Java's `String.hashCode`, made
//! non-negative, modulo the count): its records are written there, and the broker holding that
//! partition coordinates it. Standalone, every partition is local. In a cluster the topic is
//! replicated like any other, each node coordinates the groups of the partitions it leads, a
//! commit is answered once the ISR holds it, and a new leader rebuilds that partition's groups
//! from its replica of the log.
//!
//! A partition is kept small without log compaction: when it is mostly superseded records, the
//! live ones are written again at its end and its log start is moved up to them, which deletes
//! the older segments (on followers too, as DeleteRecords does).
//!
//! Time comes from the broker's [`Clock`](crate::time::Clock): the coordinator (sessions,
//! rebalance deadlines) runs on monotonic time, so a wall-clock step cannot evict members;
//! commit timestamps and offset retention use wall time, as Kafka reports and keeps them.

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
use spate_protocol::batch::{self, BatchError, NewRecord};
use spate_protocol::records::{Compression, RecordBatchDecoder};
use spate_protocol::ResponseError;
use thiserror::Error;
use tokio::sync::oneshot;

use crate::error::{io, BrokerError};
use crate::partition::{AppendError, Appended, Partition, Role};
use crate::registry::TopicRegistry;
use crate::time::SharedClock;
use crate::topic_config::TopicConfig;

mod consumer;

/// Name of the internal offsets topic, as in Kafka.
pub const OFFSETS_LOG: &str = "__consumer_offsets";
/// Kafka's default `offsets.topic.num.partitions`.
pub const DEFAULT_OFFSETS_PARTITIONS: i32 = 50;
/// How often the coordinator's clock advances (session and rebalance timeouts resolve to it).
const TICK: Duration = Duration::from_millis(100);

/// Whether `topic` is internal: listed with `is_internal`, readable, but not produced to,
/// deleted or resized by clients.
pub fn is_internal(topic: &str) -> bool {
    topic == OFFSETS_LOG || topic == spate_txn::TXN_LOG || topic == crate::share::SHARE_STATE_LOG
}

/// Refuses deleting or resizing an internal topic (groups are mapped onto its partitions),
/// with the error every path answers: INVALID_TOPIC_EXCEPTION naming the topic.
pub fn refuse_internal(topic: &str) -> Result<(), crate::registry::TopicError> {
    if is_internal(topic) {
        return Err(internal_topic_error(topic));
    }
    Ok(())
}

/// [`refuse_internal`]'s answer as the (error code, message) pair cluster admin builds.
pub(crate) fn internal_refusal(topic: &str) -> (i16, String) {
    let e = internal_topic_error(topic);
    (e.code.code(), e.message)
}

fn internal_topic_error(topic: &str) -> crate::registry::TopicError {
    crate::registry::TopicError::new(
        ResponseError::InvalidTopicException,
        format!("{topic} is an internal topic: it cannot be deleted or resized"),
    )
}

/// The offsets partition of `group` among `partitions`, as Kafka maps it: the group id's
/// Java `String.hashCode` (over UTF-16 code units), made non-negative, modulo the count.
pub fn offsets_partition_for(group: &str, partitions: usize) -> usize {
    spate_protocol::java_hash_partition(group, partitions)
}

/// The topic configuration of `__consumer_offsets` and `__transaction_state`, as Kafka's:
/// compacted (the log cleaner keeps each key's latest record), never deleted by age or size.
pub fn offsets_topic_config(segment_bytes: u64) -> TopicConfig {
    let mut c = TopicConfig::default();
    for (k, v) in [
        ("cleanup.policy", "compact".to_string()),
        ("retention.ms", "-1".to_string()),
        ("retention.bytes", "-1".to_string()),
        ("segment.bytes", segment_bytes.to_string()),
    ] {
        // Every value here is valid for its key.
        let _ = c.set(k, &v);
    }
    c
}

/// Standalone: an internal topic created by an earlier version (kept small by rewrites of its
/// own, no cleanup policy) becomes compacted, as [`offsets_topic_config`] creates it now. A
/// cleanup policy someone set on purpose is left alone.
pub(crate) fn compact_internal_topic(
    topics: &TopicRegistry,
    topic: &crate::registry::Topic,
) -> Result<(), BrokerError> {
    let mut config = topic.config();
    if config.overrides().contains_key("cleanup.policy") {
        return Ok(());
    }
    config
        .set("cleanup.policy", "compact")
        .map_err(|e| BrokerError::Cluster(e.to_string()))?;
    topics
        .set_config(topic, config)
        .map_err(|e| BrokerError::Cluster(format!("cannot compact {}: {e}", topic.name)))?;
    tracing::info!(topic = %topic.name, "internal topic is compacted from now on");
    Ok(())
}

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
    /// Partitions `__consumer_offsets` is created with (offsets.topic.num.partitions); an
    /// existing topic keeps its count.
    pub offsets_partitions: i32,
    /// Segment size of `__consumer_offsets` (offsets.topic.segment.bytes).
    pub offsets_segment_bytes: u64,
}

impl Default for GroupSettings {
    fn default() -> Self {
        Self {
            coordinator: CoordinatorConfig::default(),
            consumer: ConsumerGroupConfig::default(),
            offsets_retention_ms: 7 * 24 * 3600 * 1000,
            max_metadata_bytes: 4096,
            offsets_partitions: DEFAULT_OFFSETS_PARTITIONS,
            offsets_segment_bytes: 16 << 20,
        }
    }
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

/// An offsets partition this node writes to.
struct Led {
    partition: Arc<Partition>,
    /// The leader epoch it was taken over at (standalone: the partition's epoch).
    epoch: i32,
    /// Commits written to a replicated partition and not yet below its high watermark, in
    /// log order: they enter the offset store only once committed, so OffsetFetch never
    /// returns an offset that a failover would lose (Kafka's pending offset commits).
    unreplicated: Vec<UnreplicatedCommit>,
    /// Offsets committed inside transactions (TxnOffsetCommit) whose marker is not written
    /// yet, by producer id: a commit marker makes them the group's, an abort drops them.
    txn_pending: TxnPending,
}

/// Transactional offset commits awaiting their marker, by producer id: group and entries.
type TxnPending = HashMap<i64, Vec<(String, Vec<(String, i32, Option<Committed>)>)>>;

/// Offset commits written at offsets below `end`, waiting for the high watermark.
struct UnreplicatedCommit {
    end: i64,
    group: String,
    entries: Vec<(String, i32, Option<Committed>)>,
}

impl Led {
    /// Moves the commits now below the high watermark into `store`, oldest first.
    fn apply_replicated(&mut self, store: &mut OffsetStore) {
        if self.unreplicated.is_empty() {
            return;
        }
        let hw = self.partition.high_watermark();
        let ready = self.unreplicated.iter().take_while(|c| c.end <= hw).count();
        for c in self.unreplicated.drain(..ready) {
            for (topic, partition, value) in c.entries {
                store.apply(&c.group, &topic, partition, value);
            }
        }
    }
}

/// The offsets partitions, by index. Its lock orders every write: records reach the logs in
/// the order their changes were applied in memory.
struct OffsetsPartitions {
    /// Partitions of `__consumer_offsets` (0 until it exists).
    count: usize,
    led: Vec<Option<Led>>,
}

/// Where a write went, for waiting until it is durable ([`GroupService::durable`]).
#[derive(Clone)]
pub struct Written {
    pub(crate) partition: Arc<Partition>,
    pub(crate) epoch: i32,
    /// The offset after the written records.
    pub end: i64,
}

/// Groups and committed offsets.
pub struct GroupService {
    settings: GroupSettings,
    coordinator: Mutex<Coordinator>,
    /// KIP-848 consumer groups. Lock order: `partitions`, `coordinator`, `consumer`,
    /// `offsets`.
    consumer: Mutex<ConsumerGroups>,
    waiters: Mutex<HashMap<Token, oneshot::Sender<Reply>>>,
    next_token: AtomicU64,
    offsets: Mutex<OffsetStore>,
    partitions: Mutex<OffsetsPartitions>,
    flusher: Flusher,
    clock: SharedClock,
    /// Cluster mode: offsets partitions are led (and groups coordinated) as the cluster's
    /// leader elections decide.
    clustered: std::sync::atomic::AtomicBool,
}

impl GroupService {
    /// A service with no offsets partitions yet: a cluster node, until it leads some.
    pub fn new(settings: GroupSettings, flusher: Flusher, clock: SharedClock) -> Self {
        let nonce = nonce();
        Self {
            coordinator: Mutex::new(Coordinator::new(settings.coordinator.clone(), nonce)),
            consumer: Mutex::new(ConsumerGroups::new(settings.consumer.clone(), nonce)),
            settings,
            waiters: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(1),
            offsets: Mutex::new(OffsetStore::default()),
            partitions: Mutex::new(OffsetsPartitions {
                count: 0,
                led: Vec::new(),
            }),
            flusher,
            clock,
            clustered: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Standalone: opens `__consumer_offsets` in `topics` (created on first start), moves in
    /// the commits of the single offsets log earlier versions kept under `internal/`, and
    /// serves every group from it.
    pub fn open_standalone(
        data_dir: &Path,
        topics: &TopicRegistry,
        settings: GroupSettings,
        flusher: Flusher,
        clock: SharedClock,
    ) -> Result<Self, BrokerError> {
        let topic = match topics.get(OFFSETS_LOG) {
            Some(t) => {
                compact_internal_topic(topics, &t)?;
                t
            }
            None => topics
                .create(
                    OFFSETS_LOG,
                    settings.offsets_partitions.max(1),
                    offsets_topic_config(settings.offsets_segment_bytes),
                    false,
                )
                .map_err(|e| BrokerError::Cluster(format!("cannot create {OFFSETS_LOG}: {e}")))?
                .ok_or_else(|| BrokerError::Cluster(format!("{OFFSETS_LOG} was not created")))?,
        };
        let svc = Self::new(settings, flusher, clock);
        let partitions = topic.partitions();
        {
            let mut parts = svc.partitions.lock();
            parts.count = topic.partition_count().max(0) as usize;
            parts.led = (0..parts.count).map(|_| None).collect();
            let mut store = svc.offsets.lock();
            let mut consumer = svc.consumer.lock();
            for p in partitions {
                let txn_pending = replay_partition(&p, &mut store, &mut consumer)?;
                let Some(slot) = parts.led.get_mut(p.index.max(0) as usize) else {
                    continue;
                };
                *slot = Some(Led {
                    epoch: p.leader_epoch(),
                    partition: p,
                    unreplicated: Vec::new(),
                    txn_pending,
                });
            }
        }
        svc.migrate_single_log(data_dir)?;
        svc.consumer.lock().restored(svc.clock.monotonic_ms());
        Ok(svc)
    }

    /// Moves the commits of the single offsets log of earlier versions
    /// (`<data>/internal/__consumer_offsets`) into the partitions, then removes it. A crash
    /// midway leaves the old log in place and the move is redone: writing the same state
    /// twice changes nothing.
    fn migrate_single_log(&self, data_dir: &Path) -> Result<(), BrokerError> {
        let dir = data_dir.join("internal").join(OFFSETS_LOG);
        recover_compaction(&dir)?;
        if !dir.exists() {
            return Ok(());
        }
        let (log, _) = Log::open(
            &dir,
            LogConfig {
                retention_ms: -1,
                retention_bytes: -1,
                ..LogConfig::default()
            },
            self.flusher.clone(),
            self.clock.now_ms(),
        )?;
        {
            let mut store = self.offsets.lock();
            let mut consumer = self.consumer.lock();
            let end = log.end_offset();
            replay_chunks(
                log.start_offset(),
                end,
                |o| log.read(o, 1 << 20, end, true),
                log.dir(),
                &mut store,
                &mut consumer,
            )?;
        }
        drop(log);
        let all: Vec<usize> = (0..self.partitions.lock().count).collect();
        for p in all {
            self.rewrite_live(p)?;
        }
        for led in self.partitions.lock().led.iter().flatten() {
            led.partition
                .close()
                .map_err(|e| BrokerError::Cluster(e.to_string()))?;
        }
        std::fs::remove_dir_all(&dir).map_err(io("remove", &dir))?;
        tracing::info!("moved committed offsets from the single offsets log into {OFFSETS_LOG}");
        Ok(())
    }

    /// Cluster mode: from now on groups are coordinated only for the offsets partitions this
    /// node leads ([`GroupService::take_over`]).
    pub fn set_clustered(&self) {
        self.clustered.store(true, Ordering::SeqCst);
    }

    /// The offsets partition of `group`, once the offsets topic exists.
    pub fn partition_for(&self, group: &str) -> Option<usize> {
        let count = self.partitions.lock().count;
        (count > 0).then(|| offsets_partition_for(group, count))
    }

    /// Whether this node coordinates `group` now: it holds the group's offsets partition
    /// (standalone), or leads it in the epoch it took it over at (cluster).
    pub fn is_coordinator(&self, group: &str) -> bool {
        let parts = self.partitions.lock();
        parts.count > 0 && leading(&parts, offsets_partition_for(group, parts.count)).is_some()
    }

    /// This node now leads offsets partition `index` (of `count`) at `epoch`: rebuilds the
    /// groups of that partition from its replica of the log (members rejoin, as after any
    /// coordinator move). Does nothing when already taken over at that epoch.
    pub fn take_over(
        &self,
        index: usize,
        count: usize,
        partition: Arc<Partition>,
        epoch: i32,
    ) -> Result<(), BrokerError> {
        {
            let parts = self.partitions.lock();
            if parts.count == count
                && parts
                    .led
                    .get(index)
                    .and_then(Option::as_ref)
                    .is_some_and(|l| l.epoch == epoch)
            {
                return Ok(());
            }
        }
        let mut store = OffsetStore::default();
        let mut consumer = ConsumerGroups::new(self.settings.consumer.clone(), nonce());
        let txn_pending = replay_partition(&partition, &mut store, &mut consumer)?;
        consumer.restored(self.clock.monotonic_ms());
        // Under the partitions lock, like every write, so no commit interleaves.
        let mut parts = self.partitions.lock();
        if parts.count != count {
            // The partition count changed (or became known): groups may map elsewhere now.
            parts.count = count;
            parts.led.resize_with(count, || None);
        }
        self.forget_groups(&parts, index);
        let groups = store.group_ids().count();
        self.offsets.lock().absorb(store);
        self.consumer.lock().absorb(consumer);
        let end = partition.log_end_offset();
        parts.led[index] = Some(Led {
            partition,
            epoch,
            unreplicated: Vec::new(),
            txn_pending,
        });
        tracing::info!(
            partition = index,
            epoch,
            groups,
            records_to = end,
            "coordinating the groups of an offsets partition: rebuilt from the replicated log"
        );
        Ok(())
    }

    /// This node no longer leads offsets partition `index`: forgets its groups (the new
    /// leader has them).
    pub fn step_down(&self, index: usize) {
        let mut parts = self.partitions.lock();
        if parts.led.get_mut(index).and_then(Option::take).is_some() {
            self.forget_groups(&parts, index);
            tracing::info!(
                partition = index,
                "no longer coordinating the groups of an offsets partition"
            );
        }
    }

    /// Drops the in-memory state of every group of partition `index`; parked joins and
    /// syncs of those groups get no answer from here (their handlers answer with a retriable
    /// error).
    fn forget_groups(&self, parts: &OffsetsPartitions, index: usize) {
        let count = parts.count;
        let of_partition = |g: &str| count > 0 && offsets_partition_for(g, count) == index;
        let dropped = self.coordinator.lock().forget(of_partition);
        {
            let mut waiters = self.waiters.lock();
            for t in dropped {
                waiters.remove(&t);
            }
        }
        self.consumer.lock().forget(of_partition);
        self.offsets.lock().forget(of_partition);
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
        let parts = self.partitions.lock();
        let records = self.consumer.lock().tick(now);
        if let Err(e) = self.append_consumer(&parts, &records) {
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
        let mut parts = self.partitions.lock();
        let mut store = self.offsets.lock();
        for led in parts.led.iter_mut().flatten() {
            led.apply_replicated(&mut store);
        }
        drop(parts);
        f(&store)
    }

    /// Writes commits (or, with `None` values, deletions) to the group's offsets partition
    /// and applies them: at once when standalone, once replicated in a cluster. Returns where
    /// they went, for durability waits.
    pub fn write(
        &self,
        group: &str,
        entries: &[(String, i32, Option<Committed>)],
    ) -> Result<Written, ResponseError> {
        let mut parts = self.partitions.lock();
        if parts.count == 0 {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        let index = offsets_partition_for(group, parts.count);
        if entries.is_empty() {
            let led = leading(&parts, index).ok_or(ResponseError::NotCoordinator)?;
            return Ok(Written {
                end: led.partition.log_end_offset(),
                partition: led.partition.clone(),
                epoch: led.epoch,
            });
        }
        let batch = encode_batch(group, entries, self.clock.now_ms()).map_err(|e| {
            tracing::warn!(group, error = %e, "cannot encode offsets");
            ResponseError::InvalidCommitOffsetSize
        })?;
        let written = append_batch(&parts, index, &batch)?;
        // Applied under the partitions lock so the store and the logs agree on order.
        let mut store = self.offsets.lock();
        match parts.led.get_mut(index).and_then(Option::as_mut) {
            // Replicated: the store takes them once the high watermark passes them.
            Some(led) if written.partition.role() == Role::Leader => {
                led.unreplicated.push(UnreplicatedCommit {
                    end: written.end,
                    group: group.to_owned(),
                    entries: entries.to_vec(),
                });
                led.apply_replicated(&mut store);
            }
            _ => {
                for (topic, partition, value) in entries {
                    store.apply(group, topic, *partition, value.clone());
                }
            }
        }
        Ok(written)
    }

    /// TxnOffsetCommit: writes `entries` to the group's offsets partition inside the
    /// transaction of `producer_id`/`epoch`; they become the group's offsets when the
    /// transaction commits, and are dropped when it aborts.
    pub fn write_txn(
        &self,
        group: &str,
        producer_id: i64,
        epoch: i16,
        entries: &[(String, i32, Option<Committed>)],
    ) -> Result<Written, ResponseError> {
        let mut parts = self.partitions.lock();
        if parts.count == 0 {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        let index = offsets_partition_for(group, parts.count);
        let batch = encode_offsets(
            group,
            entries,
            self.clock.now_ms(),
            Some((producer_id, epoch)),
        )
        .map_err(|e| {
            tracing::warn!(group, error = %e, "cannot encode offsets");
            ResponseError::InvalidCommitOffsetSize
        })?;
        let led = leading(&parts, index).ok_or(ResponseError::NotCoordinator)?;
        let header = batch::validate(&batch).map_err(|_| ResponseError::UnknownServerError)?;
        let written = match led.partition.append_trusted(&batch, &header) {
            Ok(Appended::New { last_offset, .. } | Appended::Duplicate { last_offset, .. }) => {
                Written {
                    partition: led.partition.clone(),
                    epoch: led.epoch,
                    end: last_offset + 1,
                }
            }
            Err(AppendError::Refused(e)) => return Err(e),
            Err(AppendError::Storage(e)) => {
                tracing::error!(error = %e, "offsets partition append failed");
                return Err(ResponseError::KafkaStorageError);
            }
        };
        if let Some(Some(led)) = parts.led.get_mut(index) {
            let waiting = led.txn_pending.entry(producer_id).or_default();
            match waiting.iter_mut().find(|(g, _)| g == group) {
                Some((_, es)) => es.extend(entries.iter().cloned()),
                None => waiting.push((group.to_string(), entries.to_vec())),
            }
        }
        Ok(written)
    }

    /// Writes a transaction marker to offsets partition `index` and settles the
    /// transaction's offset commits there: a commit makes them the groups' offsets (once
    /// replicated, in a cluster), an abort drops them.
    pub fn write_marker(
        &self,
        index: usize,
        producer_id: i64,
        epoch: i16,
        marker: batch::ControlRecord,
    ) -> Result<Written, AppendError> {
        let mut parts = self.partitions.lock();
        let led = leading(&parts, index)
            .ok_or(AppendError::Refused(ResponseError::NotLeaderOrFollower))?;
        let end = match led.partition.append_marker(producer_id, epoch, marker)? {
            Appended::New { last_offset, .. } | Appended::Duplicate { last_offset, .. } => {
                last_offset + 1
            }
        };
        let written = Written {
            partition: led.partition.clone(),
            epoch: led.epoch,
            end,
        };
        let mut store = self.offsets.lock();
        if let Some(Some(led)) = parts.led.get_mut(index) {
            let settled = led.txn_pending.remove(&producer_id).unwrap_or_default();
            if marker.kind == batch::ControlKind::Commit {
                let replicated = led.partition.role() == Role::Leader;
                for (group, entries) in settled {
                    if replicated {
                        led.unreplicated.push(UnreplicatedCommit {
                            end,
                            group,
                            entries,
                        });
                    } else {
                        for (topic, partition, value) in entries {
                            store.apply(&group, &topic, partition, value);
                        }
                    }
                }
                led.apply_replicated(&mut store);
            }
        }
        Ok(written)
    }

    /// Whether an offset commit of this group and partition is still settling: written in a
    /// transaction that has not ended, or not yet replicated (OffsetFetch with require_stable
    /// answers UNSTABLE_OFFSET_COMMIT then, and the client asks again).
    pub fn has_pending_txn_offset(&self, group: &str, topic: &str, partition: i32) -> bool {
        let parts = self.partitions.lock();
        if parts.count == 0 {
            return false;
        }
        let index = offsets_partition_for(group, parts.count);
        let names = |g: &str, entries: &[(String, i32, Option<Committed>)]| {
            g == group
                && entries
                    .iter()
                    .any(|(t, p, _)| t == topic && *p == partition)
        };
        leading(&parts, index).is_some_and(|led| {
            // Written in a transaction whose marker is not written, or whose commit marker is
            // not replicated yet: either way not the group's offset yet.
            led.txn_pending
                .values()
                .flatten()
                .any(|(g, entries)| names(g, entries))
                || led
                    .unreplicated
                    .iter()
                    .any(|c| c.end > led.partition.high_watermark() && names(&c.group, &c.entries))
        })
    }

    /// Appends consumer group changes (already applied in memory) to their groups' offsets
    /// partitions, under the partitions lock so the logs hold them in the order they were
    /// made. Returns where the last went; `None` when there was nothing to write.
    fn append_consumer(
        &self,
        parts: &OffsetsPartitions,
        records: &[StateRecord],
    ) -> Result<Option<Written>, ResponseError> {
        if records.is_empty() || parts.count == 0 {
            return Ok(None);
        }
        let mut by_partition: Vec<(usize, Vec<StateRecord>)> = Vec::new();
        for r in records {
            let index = offsets_partition_for(r.group(), parts.count);
            match by_partition.iter_mut().find(|(i, _)| *i == index) {
                Some((_, rs)) => rs.push(r.clone()),
                None => by_partition.push((index, vec![r.clone()])),
            }
        }
        let mut last = None;
        for (index, rs) in by_partition {
            let batch = encode_consumer_batch(&rs, self.clock.now_ms()).map_err(|e| {
                tracing::warn!(error = %e, "cannot encode consumer group records");
                ResponseError::UnknownServerError
            })?;
            last = Some(append_batch(parts, index, &batch)?);
        }
        Ok(last)
    }

    /// Waits until a write is committed as the fsync policy and replication promise acks:
    /// in a cluster every in-sync replica holds it (like an acks=all produce), and with a
    /// syncing policy it is on disk. REQUEST_TIMED_OUT after 30 s, KAFKA_STORAGE_ERROR when
    /// the fsync failed, NOT_COORDINATOR when leadership moved meanwhile.
    pub fn durable(
        &self,
        written: &Written,
    ) -> impl std::future::Future<Output = Result<(), ResponseError>> + Send + 'static {
        wait_committed(written, self.flusher.policy().acks_wait_for_fsync())
    }

    /// Nothing to save: the offsets partitions are closed with every other partition.
    pub fn close(&self) {}

    /// Expires offsets of groups without members (offsets.retention.minutes) and forgets
    /// empty consumer groups; the log cleaner keeps the partitions small (they are
    /// compacted). Called from the retention pass.
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
    }

    /// Writes the live records of offsets partition `index` at its end (under the
    /// partitions lock, so the store is then exactly what the partition's records say).
    fn rewrite_live(&self, index: usize) -> Result<(), BrokerError> {
        let parts = self.partitions.lock();
        let parts = &*parts;
        let count = parts.count;
        if leading(parts, index).is_none() {
            return Err(BrokerError::Cluster(format!(
                "offsets partition {index} is not led here"
            )));
        }
        let of = |g: &str| offsets_partition_for(g, count) == index;
        let now = self.clock.now_ms();
        let corrupt = |e: OffsetsEncodeError| BrokerError::Cluster(e.to_string());
        // Only this partition's groups are copied out of the store.
        type GroupOffsets = (String, Vec<(String, i32, Option<Committed>)>);
        let mut groups: Vec<GroupOffsets> = {
            let store = self.offsets.lock();
            store
                .group_ids()
                .filter(|g| of(g))
                .map(|g| {
                    let entries = store
                        .group(g)
                        .into_iter()
                        .map(|(t, p, c)| (t.to_string(), p, Some(c.clone())))
                        .collect();
                    (g.to_string(), entries)
                })
                .collect()
        };
        groups.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (g, entries) in &groups {
            for chunk in entries.chunks(1000) {
                let batch = encode_batch(g, chunk, now).map_err(corrupt)?;
                append_batch(parts, index, &batch)
                    .map_err(|e| BrokerError::Cluster(format!("{e:?}")))?;
            }
        }
        let consumer = self.consumer.lock().records_of(of);
        for chunk in consumer.chunks(1000) {
            let batch = encode_consumer_batch(chunk, now).map_err(corrupt)?;
            append_batch(parts, index, &batch)
                .map_err(|e| BrokerError::Cluster(format!("{e:?}")))?;
        }
        Ok(())
    }
}

/// The offsets partition `index` when this node may write to it: standalone always; in a
/// cluster while it leads it in the epoch it took it over at.
/// Waits until a write to an internal partition (offsets, transaction state) is committed as
/// acks promise: in a cluster every in-sync replica holds it (like an acks=all produce), and
/// with a syncing policy (`fsync`) it is on disk. REQUEST_TIMED_OUT after 30 s,
/// KAFKA_STORAGE_ERROR when the fsync failed, NOT_COORDINATOR when leadership moved meanwhile.
pub(crate) fn wait_committed(
    written: &Written,
    fsync: bool,
) -> impl std::future::Future<Output = Result<(), ResponseError>> + Send + 'static {
    let wait = fsync;
    let p = written.partition.clone();
    let (epoch, end) = (written.epoch, written.end);
    let mut rx = p.durable_offset();
    async move {
        if p.role() != Role::Standalone {
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

fn leading(parts: &OffsetsPartitions, index: usize) -> Option<&Led> {
    parts
        .led
        .get(index)?
        .as_ref()
        .filter(|l| match l.partition.role() {
            Role::Standalone => true,
            Role::Leader => l.partition.leader_epoch() == l.epoch,
            Role::Follower => false,
        })
}

/// Appends a batch to offsets partition `index` (under the partitions lock).
fn append_batch(
    parts: &OffsetsPartitions,
    index: usize,
    batch: &[u8],
) -> Result<Written, ResponseError> {
    let led = leading(parts, index).ok_or(ResponseError::NotCoordinator)?;
    let header = batch::validate(batch).map_err(|e| {
        tracing::error!(error = %e, "built an invalid offsets batch");
        ResponseError::UnknownServerError
    })?;
    match led.partition.append(batch, &header, None) {
        Ok(Appended::New { last_offset, .. } | Appended::Duplicate { last_offset, .. }) => {
            Ok(Written {
                partition: led.partition.clone(),
                epoch: led.epoch,
                end: last_offset + 1,
            })
        }
        Err(AppendError::Refused(_)) => Err(ResponseError::NotCoordinator),
        Err(AppendError::Storage(e)) => {
            tracing::error!(error = %e, "offsets partition append failed");
            Err(ResponseError::KafkaStorageError)
        }
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

/// Finishes or undoes a rewrite of the single offsets log of earlier versions that a crash
/// interrupted: a half-written copy is discarded; a swap that renamed the old log aside but
/// not the new one into place is reverted.
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

/// Applies every record of an offsets partition's replica, from its log start to its end;
/// returns the transactional commits still waiting for their marker.
fn replay_partition(
    partition: &Partition,
    store: &mut OffsetStore,
    consumer: &mut ConsumerGroups,
) -> Result<TxnPending, BrokerError> {
    let (start, end) = (partition.log_start_offset(), partition.log_end_offset());
    replay_chunks(
        start,
        end,
        |o| partition.read_replica(o, 1 << 20, true),
        Path::new(OFFSETS_LOG),
        store,
        consumer,
    )
}

/// Applies every commit and consumer group record in `[start, end)`, read a chunk at a time
/// by `read`. Commits inside transactions wait for their marker; those still waiting at the
/// end are returned.
fn replay_chunks(
    start: i64,
    end: i64,
    read: impl Fn(i64) -> Result<spate_log::ReadResult, spate_log::LogError>,
    origin: &Path,
    store: &mut OffsetStore,
    consumer: &mut ConsumerGroups,
) -> Result<TxnPending, BrokerError> {
    let mut pending = TxnPending::new();
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
                if r.control {
                    // A transaction marker: [version, type], type 1 commits.
                    let commit = r
                        .key
                        .as_ref()
                        .is_some_and(|k| k.len() >= 4 && k[2..4] == [0, 1]);
                    for (group, entries) in pending.remove(&r.producer_id).unwrap_or_default() {
                        if commit {
                            for (topic, partition, value) in entries {
                                store.apply(&group, &topic, partition, value);
                            }
                        }
                    }
                    continue;
                }
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
                    if r.transactional {
                        let waiting = pending.entry(r.producer_id).or_default();
                        match waiting.iter_mut().find(|(g, _)| *g == key.group) {
                            Some((_, entries)) => entries.push((key.topic, key.partition, value)),
                            None => {
                                waiting.push((key.group, vec![(key.topic, key.partition, value)]))
                            }
                        }
                    } else {
                        store.apply(&key.group, &key.topic, key.partition, value);
                    }
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
    Ok(pending)
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
    encode_offsets(group, entries, now, None)
}

/// Offset commit records as one batch; inside a transaction it carries the producer's id and
/// epoch and the transactional attribute, with no sequence.
fn encode_offsets(
    group: &str,
    entries: &[(String, i32, Option<Committed>)],
    now: i64,
    txn: Option<(i64, i16)>,
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
    let producer = txn.map(|(id, epoch)| batch::ProducerFields {
        id,
        epoch,
        base_sequence: -1,
        transactional: true,
    });
    Ok(batch::build(&records, producer, Compression::None)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{now_ms, Clock, ManualClock, SystemClock};
    use spate_groups::{JoinRequest, SyncRequest};
    use spate_log::FsyncPolicy;

    /// Small segments and few partitions, so rewrites delete whole segments in tests.
    fn settings() -> GroupSettings {
        GroupSettings {
            offsets_partitions: 4,
            offsets_segment_bytes: 4096,
            ..GroupSettings::default()
        }
    }

    fn open_with(
        dir: &Path,
        flusher: &Flusher,
        settings: GroupSettings,
        clock: SharedClock,
    ) -> GroupService {
        let (topics, _) = TopicRegistry::open(dir, flusher.clone()).unwrap();
        GroupService::open_standalone(dir, &topics, settings, flusher.clone(), clock).unwrap()
    }

    fn open(dir: &Path, flusher: &Flusher) -> GroupService {
        open_with(dir, flusher, settings(), SystemClock::shared())
    }

    /// Size of the offsets partition `group` lives in.
    fn partition_size(svc: &GroupService, group: &str) -> u64 {
        let parts = svc.partitions.lock();
        let index = offsets_partition_for(group, parts.count);
        leading(&parts, index).unwrap().partition.size_bytes()
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
    fn a_commit_to_a_replicated_partition_is_not_fetched_before_it_is_replicated() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let svc = open(dir.path(), &flusher);
        let index = offsets_partition_for("g", 4);
        let replica_dir = tempfile::tempdir().unwrap();
        let (p, _) = Partition::open_replica(
            replica_dir.path(),
            index as i32,
            LogConfig::default(),
            flusher.clone(),
        )
        .unwrap();
        let p = Arc::new(p);
        p.become_leader(
            crate::partition::Leadership {
                me: 1,
                leader_epoch: 3,
                partition_epoch: 1,
                replicas: vec![1, 2],
                isr: vec![1, 2],
                sync_acks: false,
            },
            0,
            30_000,
        );
        svc.take_over(index, 4, p.clone(), 3).unwrap();
        let fetched = |svc: &GroupService| svc.offsets(|s| s.get("g", "t", 0).map(|c| c.offset));
        let first = svc.write("g", &[("t".into(), 0, committed(5))]).unwrap();
        assert_eq!(fetched(&svc), None, "written, not yet on the follower");
        p.on_replica_fetch(2, first.end, 0, 1).unwrap();
        assert_eq!(fetched(&svc), Some(5));
        // A later commit waits too, and an earlier one is never reapplied over it.
        let second = svc.write("g", &[("t".into(), 0, committed(9))]).unwrap();
        assert_eq!(fetched(&svc), Some(5));
        p.on_replica_fetch(2, second.end, 0, 2).unwrap();
        assert_eq!(fetched(&svc), Some(9));
        flusher.shutdown();
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
    fn groups_map_to_offsets_partitions_as_kafka_does() {
        // Java: "test".hashCode() == 3556498; "polygenelubricants".hashCode() == i32::MIN,
        // which Kafka's Utils.abs maps to 0.
        assert_eq!(offsets_partition_for("test", 50), 3_556_498 % 50);
        assert_eq!(offsets_partition_for("polygenelubricants", 50), 0);
        assert_eq!(offsets_partition_for("", 50), 0);
        assert_eq!(offsets_partition_for("anything", 1), 0);
        // Characters outside the BMP hash as their two UTF-16 code units, as in Java.
        let h = (0xd83d_i32 * 31 + 0xde00) & 0x7fff_ffff;
        assert_eq!(offsets_partition_for("\u{1F600}", 1000), h as usize % 1000);
    }

    #[test]
    fn the_offsets_topic_is_created_with_its_partitions_and_groups_write_to_theirs() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let svc = open(dir.path(), &flusher);
        let groups = ["a", "b", "c", "d", "e", "f", "g", "h"];
        for g in groups {
            let w = svc.write(g, &[("t".into(), 0, committed(1))]).unwrap();
            assert_eq!(
                w.partition.index as usize,
                offsets_partition_for(g, 4),
                "{g} is written to its own partition"
            );
        }
        let (topics, _) = TopicRegistry::open(dir.path(), flusher.clone()).unwrap();
        let t = topics.get(OFFSETS_LOG).expect("the internal topic exists");
        assert_eq!(t.partition_count(), 4);
        assert_eq!(t.config().get("retention.ms"), Some(("-1", true)));
        assert_eq!(t.config().get("cleanup.policy"), Some(("compact", true)));
        let used: std::collections::BTreeSet<usize> =
            groups.iter().map(|g| offsets_partition_for(g, 4)).collect();
        assert!(
            used.len() > 1,
            "eight groups spread over several partitions"
        );
    }

    #[test]
    fn an_offsets_topic_of_an_earlier_version_becomes_compacted_and_a_chosen_policy_stays() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        {
            let (topics, _) = TopicRegistry::open(dir.path(), flusher.clone()).unwrap();
            let mut old = TopicConfig::default();
            old.set("retention.ms", "-1").unwrap();
            topics.create(OFFSETS_LOG, 2, old, false).unwrap().unwrap();
        }
        let policy = || {
            let (topics, _) = TopicRegistry::open(dir.path(), flusher.clone()).unwrap();
            let t = topics.get(OFFSETS_LOG).unwrap();
            let compacted = t.with_config(|c| c.compacted());
            let config = t.config();
            let set = config.get("cleanup.policy").filter(|(_, set)| *set);
            (set.map(|(v, _)| v.to_string()), compacted)
        };
        assert_eq!(policy(), (None, false));
        drop(open(dir.path(), &flusher));
        assert_eq!(policy(), (Some("compact".into()), true), "upgraded on open");
        {
            let (topics, _) = TopicRegistry::open(dir.path(), flusher.clone()).unwrap();
            let t = topics.get(OFFSETS_LOG).unwrap();
            let mut chosen = t.config();
            chosen.set("cleanup.policy", "compact,delete").unwrap();
            topics.set_config(&t, chosen).unwrap();
        }
        drop(open(dir.path(), &flusher));
        assert_eq!(
            policy(),
            (Some("compact,delete".into()), true),
            "a policy set on purpose is kept"
        );
    }

    #[test]
    fn a_single_offsets_log_of_an_earlier_version_is_moved_into_the_partitions() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let legacy = dir.path().join("internal").join(OFFSETS_LOG);
        {
            let (mut log, _) =
                Log::open(&legacy, LogConfig::default(), flusher.clone(), now_ms()).unwrap();
            // spate's first record format: u8 version, u8 kind, u16-length strings.
            let mut key = vec![1u8, 1, 0, 2, b'g', b'1', 0, 1, b't'];
            key.extend(3i32.to_be_bytes());
            let mut value = vec![1u8];
            value.extend(42i64.to_be_bytes());
            value.extend(5i32.to_be_bytes());
            value.extend(now_ms().to_be_bytes());
            value.extend((-1i32).to_be_bytes());
            let batch = batch::build(
                &[NewRecord {
                    key: Some(Bytes::from(key)),
                    value: Some(Bytes::from(value)),
                    timestamp: now_ms(),
                }],
                None,
                Compression::None,
            )
            .unwrap();
            log.append(&batch, 0, None, now_ms()).unwrap();
            log.close().unwrap();
        }
        // A crash in the middle of an old rewrite left its pieces too.
        std::fs::create_dir_all(sibling(&legacy, "compacting")).unwrap();
        let svc = open(dir.path(), &flusher);
        let read = |svc: &GroupService| {
            svc.offsets(|s| s.get("g1", "t", 3).map(|c| (c.offset, c.leader_epoch)))
        };
        assert_eq!(read(&svc), Some((42, 5)));
        assert!(!legacy.exists(), "the old log is gone once moved");
        assert!(!sibling(&legacy, "compacting").exists());
        drop(svc);
        let svc = open(dir.path(), &flusher);
        assert_eq!(
            read(&svc),
            Some((42, 5)),
            "and the commit is in the partitions"
        );
    }

    fn manual(dir: &Path, clock: &Arc<ManualClock>) -> GroupService {
        let mut settings = settings();
        settings.coordinator.initial_rebalance_delay_ms = 0;
        open_with(
            dir,
            &Flusher::start(FsyncPolicy::Never).unwrap(),
            settings,
            clock.clone(),
        )
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

    /// One pass of the log cleaner over every offsets partition, as the broker's runs.
    fn clean(svc: &GroupService) {
        let parts: Vec<Arc<Partition>> = svc
            .partitions
            .lock()
            .led
            .iter()
            .flatten()
            .map(|l| l.partition.clone())
            .collect();
        for p in parts {
            p.clean(now_ms(), 1 << 20, None).unwrap();
        }
    }

    #[test]
    fn the_log_cleaner_shrinks_a_mostly_superseded_offsets_partition_and_the_offsets_survive() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let svc = open(dir.path(), &flusher);
        commit_many(&svc, "a", 40);
        commit_many(&svc, "b", 2);
        let before = partition_size(&svc, "a");
        clean(&svc);
        let after = partition_size(&svc, "a");
        assert!(after < before / 4, "{after} of {before} bytes left");
        svc.write("a", &[("topic".into(), 7, committed(999_999))])
            .unwrap();
        svc.write("a", &[("topic".into(), 8, None)]).unwrap();
        let check = |svc: &GroupService| {
            assert_eq!(offset_of(svc, "a", 7), Some(999_999));
            assert_eq!(offset_of(svc, "a", 8), None);
            assert_eq!(offset_of(svc, "a", 9), Some(3909));
            assert_eq!(offset_of(svc, "a", 49), Some(3949));
            assert_eq!(offset_of(svc, "b", 3), Some(103));
        };
        check(&svc);
        drop(svc);
        let svc = open(dir.path(), &flusher);
        check(&svc);
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
    fn consumer_groups_survive_cleaning_of_the_offsets_log_and_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        let svc = open(dir.path(), &flusher);
        assert_eq!(consumer_join(&svc, "cg", "m"), 1);
        commit_many(&svc, "cg", 40);
        let before = partition_size(&svc, "cg");
        clean(&svc);
        assert!(partition_size(&svc, "cg") < before / 4, "compacted");
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
