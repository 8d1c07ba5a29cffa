//! One partition: its log, its producer states and its high watermark.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use spate_cluster::metadata::BrokerId;
use spate_cluster::replication::{AckState, IsrChange, LeaderState, ReplicaError};
use spate_log::{
    Durability, EpochEntry, Flusher, FsStorage, Log, LogConfig, LogError, ReadResult, Storage,
    TimestampLookup,
};
use spate_protocol::batch::{BatchHeader, ControlRecord};
use spate_protocol::ResponseError;
use tokio::sync::watch;

use crate::error::BrokerError;
use crate::producer_state::{AbortedTxn, ProducerStates, ProducerView, SequenceCheck};
use crate::time::now_ms;

struct State {
    log: Log,
    producers: ProducerStates,
    /// Producers whose next transactional batch here was verified with their coordinator
    /// (KIP-890), by verification ticket; a marker for the producer voids its ticket, so a
    /// batch verified before its transaction ended cannot open a transaction that never ends.
    verified: std::collections::HashMap<i64, u64>,
    next_ticket: u64,
}

/// What became of a produced batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Stored at these offsets.
    New {
        /// First offset.
        base_offset: i64,
        /// Last offset.
        last_offset: i64,
    },
    /// A retry of a batch stored earlier at `base_offset`.
    Duplicate {
        /// Where the original landed.
        base_offset: i64,
        /// The original's last offset.
        last_offset: i64,
    },
}

/// Producer states as of some offset, next to the partition's segments.
const SNAPSHOT_FILE: &str = "producer_state.snapshot";

/// What this broker is for a partition; decides who moves the high watermark and which
/// appends are allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The only replica: everything appended is committed at once.
    Standalone = 0,
    /// The leader of a replicated partition: takes produces; the replication layer moves
    /// the high watermark as followers catch up.
    Leader = 1,
    /// A follower: takes only the leader's batches (`append_replica`), refuses produces.
    Follower = 2,
}

impl Role {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Role::Leader,
            2 => Role::Follower,
            _ => Role::Standalone,
        }
    }
}

/// A partition of a topic, led by this broker.
pub struct Partition {
    /// Partition index within the topic.
    pub index: i32,
    snapshot_path: PathBuf,
    snapshot_offset: AtomicI64,
    /// The active segment's base when the last snapshot was written (`i64::MIN`: none was
    /// written since the partition opened or its snapshot was removed).
    snapshot_segment: AtomicI64,
    /// The last snapshot written held no producer.
    snapshot_empty: AtomicBool,
    state: RwLock<State>,
    high_watermark: watch::Sender<i64>,
    /// The log end, for replica fetches that long-poll for new batches.
    log_end: watch::Sender<i64>,
    /// The lowest offset the log was cut back to since the search indexer last asked
    /// (`i64::MAX`: not cut): a cut between two of its steps, refilled past where it was,
    /// would otherwise leave documents of records that no longer exist.
    lowest_cut: AtomicI64,
    leader_epoch: AtomicI32,
    role: AtomicU8,
    /// The leader's view of its followers; `Some` only while this broker leads in a cluster.
    replication: Mutex<Option<LeaderState>>,
    /// Each follower's log start as its last fetch reported it (for DeleteRecords' low
    /// watermark); reset when this broker becomes leader.
    follower_starts: Mutex<std::collections::HashMap<BrokerId, i64>>,
    /// Under an fsync profile the leader counts only what it has on disk towards the high
    /// watermark, as its followers do: committed then means on disk on every in-sync replica.
    sync_acks: AtomicBool,
    deleted: AtomicBool,
    /// What the last clean of this compacted partition did (for the admin API).
    last_clean: Mutex<Option<LastClean>>,
}

impl Partition {
    /// Opens the partition's log in `dir` and rebuilds producer state: from the snapshot
    /// written at the last retention pass or clean shutdown when there is a sound one, plus
    /// the batches after it; from every batch otherwise.
    pub fn open(
        dir: &Path,
        index: i32,
        config: LogConfig,
        flusher: Flusher,
    ) -> Result<(Self, Vec<String>), BrokerError> {
        Self::open_on(FsStorage::shared(), dir, index, config, flusher)
    }

    /// Opens the partition on `storage` (a simulated disk in tests); see [`Partition::open`].
    pub fn open_on(
        storage: Arc<dyn Storage>,
        dir: &Path,
        index: i32,
        config: LogConfig,
        flusher: Flusher,
    ) -> Result<(Self, Vec<String>), BrokerError> {
        let (log, mut notes) = Log::open_on(storage, dir, config, flusher, now_ms())?;
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        let (from, producers, had_snapshot) = rebuild_producers(&log, &snapshot_path, &mut notes)?;
        let end = log.end_offset();
        // No producer state, and a sound snapshot already in the active segment: as after a
        // snapshot written in this segment, the next one waits for a roll or for producer
        // state. A restart must not cost every partition a new snapshot file (a stop of 2,000
        // busy partitions created 2,000 of them).
        let active = log.active_base_offset();
        let empty_here = had_snapshot && producers.is_empty() && from >= active;
        Ok((
            Self {
                index,
                snapshot_path,
                snapshot_offset: AtomicI64::new(from),
                snapshot_segment: AtomicI64::new(if empty_here { active } else { i64::MIN }),
                snapshot_empty: AtomicBool::new(empty_here),
                state: RwLock::new(State {
                    log,
                    producers,
                    verified: Default::default(),
                    next_ticket: 1,
                }),
                high_watermark: watch::Sender::new(end),
                log_end: watch::Sender::new(end),
                lowest_cut: AtomicI64::new(i64::MAX),
                leader_epoch: AtomicI32::new(0),
                role: AtomicU8::new(Role::Standalone as u8),
                replication: Mutex::new(None),
                follower_starts: Mutex::new(std::collections::HashMap::new()),
                sync_acks: AtomicBool::new(false),
                deleted: AtomicBool::new(false),
                last_clean: Mutex::new(None),
            },
            notes,
        ))
    }

    /// Opens a replica of a cluster topic. It starts as a follower of no leader: it takes no
    /// produce and no DeleteRecords until the metadata quorum makes it leader, and its high
    /// watermark is its log start, never above what the cluster confirmed (the log end may hold
    /// records that were never committed and that the next leader truncates away).
    pub fn open_replica(
        dir: &Path,
        index: i32,
        config: LogConfig,
        flusher: Flusher,
    ) -> Result<(Self, Vec<String>), BrokerError> {
        Self::open_replica_on(FsStorage::shared(), dir, index, config, flusher)
    }

    /// [`Partition::open_replica`] on `storage` (a simulated disk in the simulation).
    pub fn open_replica_on(
        storage: Arc<dyn Storage>,
        dir: &Path,
        index: i32,
        config: LogConfig,
        flusher: Flusher,
    ) -> Result<(Self, Vec<String>), BrokerError> {
        let (p, notes) = Self::open_on(storage, dir, index, config, flusher)?;
        p.become_replica();
        Ok((p, notes))
    }

    fn become_replica(&self) {
        let st = self.state.write();
        self.leader_epoch.store(-1, Ordering::SeqCst);
        self.role.store(Role::Follower as u8, Ordering::SeqCst);
        self.high_watermark.send_replace(st.log.start_offset());
    }

    /// Saves the producer states so the next start need not read the whole log to rebuild
    /// them. Does nothing when nothing was appended since the last snapshot, nor when there
    /// is no producer state now or in the last snapshot and appends are still in the same
    /// segment: such a snapshot would only move where the next start begins reading batch
    /// headers, and once per segment bounds that read (Kafka snapshots at each roll). A node
    /// with 10,000 busy partitions of plain producers otherwise created, fsynced and renamed
    /// 10,000 files every retention pass.
    pub fn write_producer_snapshot(&self) -> Result<(), BrokerError> {
        let (offset, segment, empty, bytes) = {
            let st = self.state.read();
            let offset = st.log.end_offset();
            if offset == self.snapshot_offset.load(Ordering::Relaxed)
                || self.deleted.load(Ordering::SeqCst)
            {
                return Ok(());
            }
            let segment = st.log.active_base_offset();
            let empty = st.producers.is_empty();
            if empty
                && self.snapshot_empty.load(Ordering::Relaxed)
                && segment == self.snapshot_segment.load(Ordering::Relaxed)
            {
                return Ok(());
            }
            (offset, segment, empty, st.producers.snapshot(offset))
        };
        crate::registry::write_atomically(&self.snapshot_path, &bytes)?;
        self.snapshot_offset.store(offset, Ordering::Relaxed);
        self.snapshot_segment.store(segment, Ordering::Relaxed);
        self.snapshot_empty.store(empty, Ordering::Relaxed);
        Ok(())
    }

    /// The leader epoch stamped on appended batches.
    pub fn leader_epoch(&self) -> i32 {
        self.leader_epoch.load(Ordering::Relaxed)
    }

    /// Offset below which records are visible to consumers.
    pub fn high_watermark(&self) -> i64 {
        *self.high_watermark.borrow()
    }

    /// Subscribes to high-watermark changes, for long-poll fetches.
    pub fn watch_high_watermark(&self) -> watch::Receiver<i64> {
        self.high_watermark.subscribe()
    }

    /// First offset still stored.
    pub fn log_start_offset(&self) -> i64 {
        self.state.read().log.start_offset()
    }

    /// Offset the next record gets.
    pub fn log_end_offset(&self) -> i64 {
        self.state.read().log.end_offset()
    }

    /// Bytes stored.
    pub fn size_bytes(&self) -> u64 {
        self.state.read().log.size_bytes()
    }

    /// Subscribes to how far the log is on disk.
    pub fn durable_offset(&self) -> watch::Receiver<Durability> {
        self.state.read().log.durable_offset()
    }

    /// True once a write or fsync of this partition failed: it is out of service (produce
    /// and fetch answer KAFKA_STORAGE_ERROR) until the broker restarts and recovers it.
    pub fn is_offline(&self) -> bool {
        self.state.read().log.is_failed()
    }

    /// What this broker is for the partition.
    pub fn role(&self) -> Role {
        Role::from_u8(self.role.load(Ordering::SeqCst))
    }

    /// Changes the role and the leader epoch (the cluster's leader election does this).
    pub fn set_role(&self, role: Role, leader_epoch: i32) {
        let _st = self.state.write();
        self.leader_epoch.store(leader_epoch, Ordering::SeqCst);
        self.role.store(role as u8, Ordering::SeqCst);
        if role != Role::Leader {
            *self.replication.lock() = None;
            // acks=all produces waiting on the high watermark look again and learn that the
            // leadership is gone, instead of waiting out their timeout.
            self.high_watermark.send_modify(|_| {});
        }
    }

    /// Becomes the leader at `leader_epoch` with the quorum's replicas and ISR: from now on
    /// produces are taken and the high watermark moves as the ISR catches up.
    pub fn become_leader(&self, l: Leadership, now_ms: u64, lag_time_max_ms: u64) {
        let leader_epoch = l.leader_epoch;
        let mut st = self.state.write();
        // Leader epochs only grow: a process never leads an epoch older than one it saw.
        debug_assert!(
            leader_epoch > self.leader_epoch() || self.role() != Role::Leader,
            "partition {}: leading epoch {leader_epoch} after epoch {}",
            self.index,
            self.leader_epoch()
        );
        // The epoch checkpoint is written now (the caller is on the blocking pool), not by the
        // epoch's first produce on an async worker. Should it fail, that first append tries
        // again and reports the storage error.
        if let Err(e) = st.log.begin_epoch(leader_epoch) {
            tracing::error!(partition = self.index, epoch = leader_epoch, error = %e, "cannot record the new leader epoch");
        }
        self.follower_starts.lock().clear();
        self.sync_acks.store(l.sync_acks, Ordering::SeqCst);
        let end = self.own_end(&st.log);
        let state = LeaderState::new(
            l.me,
            l.leader_epoch,
            l.partition_epoch,
            l.replicas,
            l.isr,
            end,
            self.high_watermark(),
            now_ms,
            lag_time_max_ms,
        );
        let hw = state.high_watermark();
        *self.replication.lock() = Some(state);
        self.leader_epoch.store(leader_epoch, Ordering::SeqCst);
        self.role.store(Role::Leader as u8, Ordering::SeqCst);
        drop(st);
        self.raise_high_watermark(hw);
    }

    /// The quorum committed a new ISR or assignment for the partition this broker leads.
    pub fn leader_metadata(
        &self,
        partition_epoch: i32,
        replicas: Vec<BrokerId>,
        isr: Vec<BrokerId>,
        fenced: std::collections::BTreeSet<BrokerId>,
        now_ms: u64,
    ) {
        let end = self.leader_end();
        let hw = self
            .replication
            .lock()
            .as_mut()
            .and_then(|l| l.on_metadata(partition_epoch, replicas, isr, fenced, end, now_ms));
        if let Some(hw) = hw {
            self.raise_high_watermark(hw);
        }
    }

    /// A follower fetched from `fetch_offset`: records its progress, moves the high
    /// watermark, and returns an ISR expansion to propose when it caught up.
    pub fn on_replica_fetch(
        &self,
        follower: BrokerId,
        fetch_offset: i64,
        follower_start: i64,
        now_ms: u64,
    ) -> Result<Option<IsrChange>, ReplicaFetchError> {
        if follower_start >= 0 {
            self.follower_starts.lock().insert(follower, follower_start);
        }
        let end = self.leader_end();
        let mut guard = self.replication.lock();
        let leader = guard.as_mut().ok_or(ReplicaFetchError::NotLeader)?;
        let out = leader
            .on_follower_fetch(follower, fetch_offset, end, now_ms)
            .map_err(ReplicaFetchError::Replica)?;
        drop(guard);
        if let Some(hw) = out.high_watermark {
            self.raise_high_watermark(hw);
        }
        Ok(out.expand)
    }

    /// The leader's own end for the high watermark: its log end, or under an fsync profile
    /// how far its log is on disk.
    fn own_end(&self, log: &Log) -> i64 {
        if !self.sync_acks.load(Ordering::SeqCst) {
            return log.end_offset();
        }
        synced_end(log).unwrap_or_else(|| log.start_offset())
    }

    /// What a follower's next fetch reports it holds: its log end, or with `synced_only`
    /// (fsync profiles) how far its log is on disk, so the leader never counts towards the
    /// high watermark records a follower could lose in a power failure. `None` once the log
    /// failed: the replica is out of service and reports nothing.
    pub fn replica_fetch_offset(&self, synced_only: bool) -> Option<i64> {
        let st = self.state.read();
        if st.log.is_failed() {
            return None;
        }
        if !synced_only {
            return Some(st.log.end_offset());
        }
        synced_end(&st.log).map(|o| o.max(st.log.start_offset()))
    }

    fn leader_end(&self) -> i64 {
        self.own_end(&self.state.read().log)
    }

    /// More of the log reached disk: under an fsync profile that may commit records.
    pub fn on_durable(&self) {
        let end = self.leader_end();
        let hw = self
            .replication
            .lock()
            .as_mut()
            .and_then(|l| l.on_leader_append(end));
        if let Some(hw) = hw {
            self.raise_high_watermark(hw);
        }
    }

    /// Followers that fell out of sync: the ISR change to propose, if any.
    pub fn check_isr(&self, now_ms: u64) -> Option<IsrChange> {
        self.replication
            .lock()
            .as_mut()
            .and_then(|l| l.check_lagging(now_ms))
    }

    /// The proposed ISR change `change` was refused as never applied: forgets it (and only
    /// it) so the leader may decide again.
    pub fn isr_change_failed(&self, change: &IsrChange) {
        if let Some(l) = self.replication.lock().as_mut() {
            l.on_isr_change_failed(change);
        }
    }

    /// The high watermark consumers may be told, or `None` while this broker leads at an
    /// epoch whose high watermark is not known yet: until it reaches the epoch's start
    /// offset it may be below what the previous leader exposed (KIP-207).
    pub fn known_high_watermark(&self) -> Option<i64> {
        let known = self
            .replication
            .lock()
            .as_ref()
            .is_none_or(LeaderState::high_watermark_known);
        known.then(|| self.high_watermark())
    }

    /// Whether an acks=all produce may be appended (`None` when not leading in a cluster).
    pub fn accepts_acks_all(&self, min_isr: usize) -> Option<bool> {
        self.replication
            .lock()
            .as_ref()
            .map(|l| l.accepts_acks_all(min_isr))
    }

    /// Where an acks=all produce ending at `last_offset` stands, if this broker still leads
    /// at `leader_epoch`.
    pub fn ack_state(
        &self,
        leader_epoch: i32,
        last_offset: i64,
        min_isr: usize,
    ) -> Option<AckState> {
        self.replication
            .lock()
            .as_ref()
            .filter(|l| l.leader_epoch() == leader_epoch)
            .map(|l| l.ack_state(last_offset, min_isr))
    }

    /// Whether `replica` is in the committed ISR this broker leads with (`false` when not
    /// leading in a cluster).
    pub fn leads_with_in_sync(&self, replica: BrokerId) -> bool {
        self.replication
            .lock()
            .as_ref()
            .is_some_and(|l| l.isr().contains(&replica))
    }

    /// The leader's replication view (ISR, followers' progress), for status pages.
    pub fn leader_view(&self) -> Option<LeaderState> {
        self.replication.lock().clone()
    }

    fn raise_high_watermark(&self, hw: i64) {
        debug_assert!(
            hw <= *self.log_end.borrow(),
            "partition {}: high watermark {hw} raised past the log end {}",
            self.index,
            *self.log_end.borrow()
        );
        self.high_watermark.send_if_modified(|cur| {
            let changed = hw > *cur;
            if changed {
                *cur = hw;
            }
            changed
        });
    }

    /// The lowest log start among the in-sync replicas (Kafka's low watermark): where
    /// DeleteRecords has taken effect everywhere. Standalone, the log start. An in-sync
    /// follower that has not reported its start yet counts as -1.
    pub fn low_watermark(&self) -> i64 {
        let own = self.log_start_offset();
        let Some(view) = self.leader_view() else {
            return own;
        };
        let starts = self.follower_starts.lock();
        view.isr()
            .iter()
            .filter(|id| view.followers().contains_key(id))
            .map(|id| starts.get(id).copied().unwrap_or(-1))
            .fold(own, i64::min)
    }

    /// Subscribes to the log end, for replica fetches.
    pub fn watch_log_end(&self) -> watch::Receiver<i64> {
        self.log_end.subscribe()
    }

    /// Reads whole batches from `offset` up to the log end (a follower's fetch).
    pub fn read_replica(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
    ) -> Result<ReadResult, LogError> {
        let st = self.state.read();
        if st.log.is_failed() {
            return Err(LogError::Failed {
                path: st.log.dir().to_path_buf(),
            });
        }
        let end = st.log.end_offset();
        st.log.read(offset, max_bytes, end, min_one)
    }

    /// A follower takes its leader's high watermark from a fetch response; `false` (nothing
    /// changed) when the partition has since left that leader's epoch or become leader
    /// itself: a late response from the previous leader must not pull a new leader's high
    /// watermark back below records it already acknowledged.
    pub fn follow_high_watermark(&self, hw: i64, leader_epoch: i32) -> bool {
        // Role changes take the state lock too: the check and the update are one step.
        let st = self.state.write();
        if self.role() != Role::Follower || self.leader_epoch() != leader_epoch {
            return false;
        }
        self.store_high_watermark(&st, hw);
        true
    }

    /// Sets the high watermark, kept within the log, whatever the role (tests).
    #[cfg(test)]
    pub(crate) fn set_high_watermark(&self, hw: i64) {
        let st = self.state.read();
        self.store_high_watermark(&st, hw);
    }

    fn store_high_watermark(&self, st: &State, hw: i64) {
        let hw = hw.clamp(st.log.start_offset(), st.log.end_offset());
        self.high_watermark.send_if_modified(|cur| {
            let changed = *cur != hw;
            *cur = hw;
            changed
        });
    }

    /// Whether a batch of leader epoch `epoch` would start a new epoch here (its append then
    /// writes and fsyncs the epoch checkpoint: a follower does that off the async workers).
    pub fn epoch_is_new(&self, epoch: i32) -> bool {
        self.state.read().log.epoch_is_new(epoch)
    }

    /// Every leader epoch that wrote to this partition and where it started.
    pub fn epochs(&self) -> Vec<EpochEntry> {
        self.state.read().log.epochs().to_vec()
    }

    /// OffsetForLeaderEpoch: the largest epoch at most `epoch` and where it ended here.
    pub fn end_offset_for_epoch(&self, epoch: i32) -> Option<(i32, i64)> {
        self.state.read().log.end_offset_for_epoch(epoch)
    }

    /// Appends a batch copied from the leader, keeping its offsets and epoch, and notes its
    /// producer so a retry after failover is still recognised. Only a follower does this, and
    /// only while it follows at `leader_epoch`: a fetch answered by a deposed leader must not
    /// land after the follower moved on to the next one.
    pub fn append_replica(&self, batch: &[u8], leader_epoch: i32) -> Result<(), AppendError> {
        let mut st = self.state.write();
        if self.deleted.load(Ordering::SeqCst) {
            return Err(AppendError::Refused(ResponseError::UnknownTopicOrPartition));
        }
        if self.role() != Role::Follower {
            return Err(AppendError::Refused(ResponseError::NotLeaderOrFollower));
        }
        if self.leader_epoch() != leader_epoch {
            return Err(AppendError::Refused(ResponseError::FencedLeaderEpoch));
        }
        let info = st
            .log
            .append_replica(batch, now_ms())
            .map_err(AppendError::Storage)?;
        self.log_end.send_replace(info.last_offset + 1);
        if let Ok(h) = BatchHeader::parse(batch) {
            st.producers
                .record_batch(&h, spate_protocol::batch::control_record(batch));
        }
        Ok(())
    }

    /// Removes everything at or after `offset` (a divergent tail found through
    /// OffsetForLeaderEpoch); returns the new log end. Producer states are rebuilt so a
    /// removed batch is not taken for a duplicate later.
    pub fn truncate_to(&self, offset: i64) -> Result<i64, BrokerError> {
        let mut st = self.state.write();
        self.truncate_locked(&mut st, offset)
    }

    /// [`Partition::truncate_to`] for a follower at `leader_epoch`; `None` (nothing cut) when
    /// the partition moved on to another epoch or role meanwhile.
    pub fn truncate_following(
        &self,
        offset: i64,
        leader_epoch: i32,
    ) -> Result<Option<i64>, BrokerError> {
        let mut st = self.state.write();
        if self.role() != Role::Follower || self.leader_epoch() != leader_epoch {
            return Ok(None);
        }
        self.truncate_locked(&mut st, offset).map(Some)
    }

    /// The lowest offset the log was cut back to (a divergent tail truncated, or the log
    /// reset) since the last call; `None` when it was not. The search indexer is its one
    /// reader: each cut is reported once.
    pub fn take_lowest_cut(&self) -> Option<i64> {
        let cut = self.lowest_cut.swap(i64::MAX, Ordering::SeqCst);
        (cut != i64::MAX).then_some(cut)
    }

    /// Empties a follower's log and starts it at the leader's first offset, when the leader
    /// no longer holds what this replica lacks; `false` when the partition moved on to
    /// another epoch or role meanwhile.
    pub fn reset_following(&self, offset: i64, leader_epoch: i32) -> Result<bool, BrokerError> {
        let mut st = self.state.write();
        if self.role() != Role::Follower || self.leader_epoch() != leader_epoch {
            return Ok(false);
        }
        st.log.reset_to(offset, now_ms())?;
        self.lowest_cut.fetch_min(offset, Ordering::SeqCst);
        let _ = std::fs::remove_file(&self.snapshot_path);
        self.snapshot_offset.store(offset, Ordering::Relaxed);
        self.snapshot_segment.store(i64::MIN, Ordering::Relaxed);
        st.producers = ProducerStates::default();
        self.high_watermark.send_replace(offset);
        self.log_end.send_replace(offset);
        Ok(true)
    }

    fn truncate_locked(&self, st: &mut State, offset: i64) -> Result<i64, BrokerError> {
        // A leader's log is the partition's history: only followers (and standalone tests)
        // cut theirs.
        debug_assert!(
            self.role() != Role::Leader,
            "partition {}: a leader truncating its log to {offset}",
            self.index
        );
        let end = st.log.truncate_to(offset, now_ms())?;
        self.lowest_cut.fetch_min(end, Ordering::SeqCst);
        if self.snapshot_offset.load(Ordering::Relaxed) > end {
            // The snapshot describes offsets that no longer exist.
            let _ = std::fs::remove_file(&self.snapshot_path);
            self.snapshot_offset
                .store(st.log.start_offset(), Ordering::Relaxed);
            self.snapshot_segment.store(i64::MIN, Ordering::Relaxed);
        }
        let mut notes = Vec::new();
        let (_, producers, _) = rebuild_producers(&st.log, &self.snapshot_path, &mut notes)?;
        st.producers = producers;
        self.high_watermark.send_if_modified(|hw| {
            let changed = *hw > end;
            *hw = (*hw).min(end);
            changed
        });
        self.log_end.send_replace(end);
        Ok(end)
    }

    /// Moves the log start to `offset` for DeleteRecords on the leader (or a standalone
    /// broker): `-1` means the high watermark. Returns the log start afterwards. An offset
    /// past the high watermark or below -1 is OFFSET_OUT_OF_RANGE, a follower answers
    /// NOT_LEADER_OR_FOLLOWER.
    pub fn delete_records_before(&self, offset: i64) -> Result<i64, AppendError> {
        let mut st = self.state.write();
        if self.role() == Role::Follower {
            return Err(AppendError::Refused(ResponseError::NotLeaderOrFollower));
        }
        if self.deleted.load(Ordering::SeqCst) {
            return Err(AppendError::Refused(ResponseError::UnknownTopicOrPartition));
        }
        let hw = self.high_watermark();
        let offset = if offset == -1 { hw } else { offset };
        if !(0..=hw).contains(&offset) {
            return Err(AppendError::Refused(ResponseError::OffsetOutOfRange));
        }
        st.log.advance_start(offset).map_err(AppendError::Storage)
    }

    /// A follower takes the leader's log start (learned from its fetch responses), as far
    /// as its own log reaches, so records deleted on the leader go here too. `false` when
    /// nothing moved or the partition moved on to another epoch or role.
    pub fn follow_log_start(&self, leader_start: i64, leader_epoch: i32) -> Result<bool, LogError> {
        if leader_start <= self.log_start_offset() {
            return Ok(false);
        }
        let mut st = self.state.write();
        if self.role() != Role::Follower || self.leader_epoch() != leader_epoch {
            return Ok(false);
        }
        let before = st.log.start_offset();
        let target = leader_start.min(st.log.end_offset());
        Ok(st.log.advance_start(target)? > before)
    }

    /// Marks the partition deleted: later appends are refused.
    pub fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::SeqCst);
    }

    /// Appends a validated batch, applying idempotent-producer checks atomically with the
    /// write. A transactional batch that opens its producer's transaction here needs the
    /// `ticket` of a verification with the coordinator ([`Partition::begin_verification`]).
    pub fn append(
        &self,
        batch: &[u8],
        h: &BatchHeader,
        log_append_time: Option<i64>,
    ) -> Result<Appended, AppendError> {
        self.append_verified(batch, h, log_append_time, None)
    }

    /// Whether a transactional batch of `producer_id` here would open its transaction, so
    /// must be verified with the coordinator first (KIP-890).
    pub fn needs_verification(&self, producer_id: i64) -> bool {
        self.state.read().producers.open_txn(producer_id).is_none()
    }

    /// Starts verifying `producer_id`'s next transactional batch; the ticket is void once a
    /// marker for it is written.
    pub fn begin_verification(&self, producer_id: i64) -> u64 {
        let mut st = self.state.write();
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.verified.insert(producer_id, ticket);
        ticket
    }

    /// [`Partition::append`] with the ticket of a verification.
    pub fn append_verified(
        &self,
        batch: &[u8],
        h: &BatchHeader,
        log_append_time: Option<i64>,
        ticket: Option<u64>,
    ) -> Result<Appended, AppendError> {
        self.append_gated(batch, h, log_append_time, TxnGate::Ticket(ticket))
    }

    /// Appends a batch the broker wrote itself on behalf of a transaction it checked (the
    /// group coordinator's transactional offset commits): no verification ticket is needed.
    pub fn append_trusted(&self, batch: &[u8], h: &BatchHeader) -> Result<Appended, AppendError> {
        self.append_gated(batch, h, None, TxnGate::Trusted)
    }

    fn append_gated(
        &self,
        batch: &[u8],
        h: &BatchHeader,
        log_append_time: Option<i64>,
        gate: TxnGate,
    ) -> Result<Appended, AppendError> {
        let mut st = self.state.write();
        if self.deleted.load(Ordering::SeqCst) {
            return Err(AppendError::Refused(ResponseError::UnknownTopicOrPartition));
        }
        let role = self.role();
        if role == Role::Follower {
            return Err(AppendError::Refused(ResponseError::NotLeaderOrFollower));
        }
        if let TxnGate::Ticket(ticket) = gate {
            if h.is_transactional() && st.producers.open_txn(h.producer_id).is_none() {
                let held = st.verified.get(&h.producer_id).copied();
                if ticket.is_none() || held != ticket {
                    return Err(AppendError::Refused(ResponseError::InvalidTxnState));
                }
            }
        }
        let idempotent = h.has_producer_id();
        if idempotent {
            match st.producers.check(
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.last_sequence(),
            ) {
                SequenceCheck::Append => {}
                SequenceCheck::Duplicate {
                    base_offset,
                    last_offset,
                } => {
                    return Ok(Appended::Duplicate {
                        base_offset,
                        last_offset,
                    })
                }
                SequenceCheck::Reject(e) => return Err(AppendError::Refused(e)),
            }
        }
        let info = st
            .log
            .append(batch, self.leader_epoch(), log_append_time, now_ms())
            .map_err(AppendError::Storage)?;
        if idempotent {
            st.producers
                .record_data(h, info.base_offset, info.last_offset);
            if h.is_transactional() {
                st.verified.remove(&h.producer_id);
            }
        }
        self.publish_append(&st, role, info.last_offset);
        Ok(Appended::New {
            base_offset: info.base_offset,
            last_offset: info.last_offset,
        })
    }

    /// Writes a transaction marker for `producer_id` (the coordinator's, through
    /// WriteTxnMarkers, or its own when it coordinates locally): ends the producer's
    /// transaction here. Refused for an older producer epoch or an older coordinator.
    pub fn append_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        marker: ControlRecord,
    ) -> Result<Appended, AppendError> {
        let mut st = self.state.write();
        if self.deleted.load(Ordering::SeqCst) {
            return Err(AppendError::Refused(ResponseError::UnknownTopicOrPartition));
        }
        let role = self.role();
        if role == Role::Follower {
            return Err(AppendError::Refused(ResponseError::NotLeaderOrFollower));
        }
        st.producers
            .check_marker(producer_id, producer_epoch, marker.coordinator_epoch)
            .map_err(AppendError::Refused)?;
        let now = now_ms();
        let batch = spate_protocol::batch::control_batch(producer_id, producer_epoch, marker, now);
        let info = st
            .log
            .append(&batch, self.leader_epoch(), None, now)
            .map_err(AppendError::Storage)?;
        st.producers
            .end_txn(producer_id, producer_epoch, marker, info.base_offset);
        st.verified.remove(&producer_id);
        self.publish_append(&st, role, info.last_offset);
        Ok(Appended::New {
            base_offset: info.base_offset,
            last_offset: info.last_offset,
        })
    }

    /// The last stable offset: the high watermark, or the first offset of the oldest open
    /// transaction when that is lower (read_committed reads stop there).
    pub fn last_stable_offset(&self) -> i64 {
        let hw = self.high_watermark();
        let st = self.state.read();
        st.producers
            .first_unstable_offset()
            .map_or(hw, |first| first.min(hw))
    }

    /// Aborted transactions that may hold records in `from..upto`, for read_committed
    /// fetches.
    pub fn aborted_in(&self, from: i64, upto: i64) -> Vec<AbortedTxn> {
        self.state.read().producers.aborted_in(from, upto)
    }

    /// The producers this partition remembers (DescribeProducers).
    pub fn producer_views(&self) -> Vec<ProducerView> {
        self.state.read().producers.views()
    }

    /// Publishes an append's new log end and, where this replica alone decides it, its high
    /// watermark.
    fn publish_append(&self, st: &State, role: Role, last_offset: i64) {
        let info_last = last_offset;
        self.log_end.send_replace(info_last + 1);
        match role {
            // The leader is the whole ISR, so everything written is committed.
            Role::Standalone => {
                self.high_watermark.send_replace(info_last + 1);
            }
            Role::Leader => {
                let hw = self
                    .replication
                    .lock()
                    .as_mut()
                    .and_then(|l| l.on_leader_append(self.own_end(&st.log)));
                if let Some(hw) = hw {
                    self.raise_high_watermark(hw);
                }
            }
            Role::Follower => {}
        }
    }

    /// Reads whole batches from `offset`, stopping at the high watermark (or, for
    /// read_committed, at the last stable offset).
    pub fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
    ) -> Result<ReadResult, LogError> {
        self.read_upto(offset, max_bytes, min_one, self.high_watermark())
    }

    /// [`Partition::read`] stopping at `limit` (never past the high watermark).
    pub fn read_upto(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
        limit: i64,
    ) -> Result<ReadResult, LogError> {
        let hw = self.high_watermark().min(limit);
        let st = self.state.read();
        if st.log.is_failed() {
            return Err(LogError::Failed {
                path: st.log.dir().to_path_buf(),
            });
        }
        st.log.read(offset, max_bytes, hw, min_one)
    }

    /// ListOffsets by timestamp.
    pub fn offset_for_timestamp(&self, ts: i64) -> Result<Option<TimestampLookup>, LogError> {
        self.state.read().log.offset_for_timestamp(ts)
    }

    /// ListOffsets MAX_TIMESTAMP.
    pub fn max_timestamp(&self) -> Result<Option<TimestampLookup>, LogError> {
        self.state.read().log.max_timestamp()
    }

    /// Saves the log for a clean shutdown (see `Log::close`).
    pub fn close(&self) -> Result<(), LogError> {
        self.state.write().log.close()
    }

    /// Applies new topic settings.
    pub fn set_log_config(&self, config: LogConfig) {
        self.state.write().log.set_config(config);
    }

    /// Compacts the log when its topic is compacted and the cleaner's schedule says it is due
    /// (`spate_log::compaction`): maps the keys of its dirty section, then rewrites each
    /// sealed segment below the last stable offset and the high watermark with only what the
    /// sweep keeps. Reading and writing happen outside the partition's lock; each rewritten
    /// segment is swapped in under it. `None` when nothing was due.
    pub fn clean(
        &self,
        now_ms: i64,
        buffer_bytes: usize,
        io_bytes_per_sec: Option<u64>,
    ) -> Result<Option<CleanStats>, BrokerError> {
        use spate_log::compaction::{self, Aborted, OffsetMap, Sweep};
        let (cfg, spans, storage, dir, aborted) = {
            let st = self.state.read();
            let Some(cfg) = st.log.config().compact else {
                return Ok(None);
            };
            // Only committed, stable data is cleaned: nothing a truncation or an open
            // transaction may still change.
            let stable = st
                .producers
                .first_unstable_offset()
                .map_or(self.high_watermark(), |f| f.min(self.high_watermark()));
            let spans: Vec<_> = st
                .log
                .sealed_spans()
                .into_iter()
                .filter(|s| s.next_offset <= stable)
                .collect();
            let aborted: Vec<Aborted> = st
                .producers
                .aborted_in(i64::MIN, i64::MAX)
                .into_iter()
                .map(|a| Aborted {
                    producer_id: a.producer_id,
                    first_offset: a.first_offset,
                    marker_offset: a.last_offset,
                })
                .collect();
            (
                cfg,
                spans,
                st.log.storage(),
                st.log.dir().to_path_buf(),
                aborted,
            )
        };
        let first_dirty = self.clean_point(&dir);
        let Some(due) = compaction::schedule(&spans, first_dirty, now_ms, &cfg.policy) else {
            return Ok(None);
        };
        // log.cleaner.io.max.bytes.per.second: after each segment read or written, the
        // cleaner sleeps until its average rate is back under the limit.
        let started = std::time::Instant::now();
        let mut io_bytes = 0u64;
        let mut throttle = |bytes: u64| {
            io_bytes += bytes;
            if let Some(limit) = io_bytes_per_sec.filter(|l| *l > 0) {
                let due = std::time::Duration::from_secs_f64(io_bytes as f64 / limit as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        };
        let read = |base: i64| -> Result<Option<(bytes::Bytes, u64)>, BrokerError> {
            Ok(self.state.read().log.read_sealed(base)?)
        };
        let corrupt = |e: compaction::CompactionError| BrokerError::Cluster(e.to_string());
        let mut map = OffsetMap::with_buffer_bytes(buffer_bytes);
        for s in spans
            .iter()
            .filter(|s| s.next_offset > first_dirty && s.next_offset <= due.end)
        {
            let Some((bytes, _)) = read(s.base_offset)? else {
                continue;
            };
            throttle(bytes.len() as u64);
            compaction::map_section(&bytes, &mut map, &aborted).map_err(corrupt)?;
            if map.end() < s.next_offset && map.end() >= 0 {
                // The map is full: the rest of the dirty section waits for the next pass.
                break;
            }
        }
        let horizon = now_ms.saturating_sub(cfg.delete_retention_ms);
        let mut sweep = Sweep::new(&map, aborted, horizon).writing(cfg.codec);
        let mut stats = CleanStats::default();
        for s in spans.iter().filter(|s| s.next_offset <= due.end) {
            let Some((bytes, size)) = read(s.base_offset)? else {
                continue;
            };
            stats.bytes_read += size;
            throttle(size);
            let cleaned = compaction::compact_batches(&bytes, &mut sweep).map_err(corrupt)?;
            if cleaned.len() as u64 == size {
                continue;
            }
            throttle(cleaned.len() as u64);
            let copy = Log::write_cleaned(&storage, &dir, s.base_offset, size, &cleaned)?;
            if self.state.write().log.swap_cleaned(copy, now_ms)? {
                stats.segments += 1;
                stats.bytes_removed += size - cleaned.len() as u64;
            }
        }
        stats.clean_point = if map.end() >= 0 && map.end() < due.end {
            map.end()
        } else {
            due.end
        };
        crate::registry::write_atomically(
            &dir.join(CLEAN_POINT_FILE),
            stats.clean_point.to_string().as_bytes(),
        )?;
        *self.last_clean.lock() = Some(LastClean {
            at_ms: now_ms,
            took_ms: started.elapsed().as_millis() as u64,
            stats,
        });
        Ok(Some(stats))
    }

    /// The cleaner's view of this compacted partition at `now_ms`: where its dirty section
    /// begins, the bytes of sealed segments before and after that point, the age of the
    /// oldest dirty one (by its newest record), and the last clean. `None` when the topic is
    /// not compacted.
    pub fn cleaner_state(&self, now_ms: i64) -> Option<CleanerState> {
        use spate_log::compaction::SegmentSpan;
        let (spans, dir) = {
            let st = self.state.read();
            st.log.config().compact?;
            (st.log.sealed_spans(), st.log.dir().to_path_buf())
        };
        let clean_point = self.clean_point(&dir);
        let (dirty, clean): (Vec<&SegmentSpan>, Vec<&SegmentSpan>) =
            spans.iter().partition(|s| s.next_offset > clean_point);
        Some(CleanerState {
            clean_point,
            clean_bytes: clean.iter().map(|s| s.size).sum(),
            dirty_bytes: dirty.iter().map(|s| s.size).sum(),
            oldest_dirty_age_ms: dirty
                .first()
                .map_or(0, |s| now_ms.saturating_sub(s.max_timestamp).max(0)),
            last_clean: *self.last_clean.lock(),
        })
    }

    /// Where the dirty section of this compacted log begins: the checkpoint of the last
    /// clean, or the log start.
    fn clean_point(&self, dir: &Path) -> i64 {
        let start = self.log_start_offset();
        std::fs::read_to_string(dir.join(CLEAN_POINT_FILE))
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .map_or(start, |p| p.clamp(start, self.log_end_offset().max(start)))
    }

    /// Forgets producer ids idle for longer than `producer.id.expiration.ms` as of `now_ms`;
    /// returns how many.
    pub fn expire_producers(&self, now_ms: i64) -> usize {
        self.state.write().producers.expire(now_ms)
    }

    /// Deletes segments past retention as of `now_ms` (the broker's clock); returns how many.
    pub fn enforce_retention(&self, now_ms: i64) -> Result<usize, LogError> {
        let mut st = self.state.write();
        let n = st.log.enforce_retention(now_ms)?;
        let start = st.log.start_offset();
        st.producers.forget_aborted_below(start);
        Ok(n)
    }
}

/// How far `log` is on disk (never past its end); `None` once an fsync failed.
fn synced_end(log: &Log) -> Option<i64> {
    match log.durable_now() {
        Durability::Synced(o) => Some(o.min(log.end_offset())),
        Durability::Failed => None,
    }
}

/// Producer states from the snapshot (when sound and not ahead of the log) plus the batches
/// after it, or from every batch; returns the offset the replay started at, the states, and
/// whether a sound snapshot was used.
fn rebuild_producers(
    log: &Log,
    snapshot_path: &Path,
    notes: &mut Vec<String>,
) -> Result<(i64, ProducerStates, bool), BrokerError> {
    let (from, mut producers, sound) = match std::fs::read(snapshot_path) {
        Ok(bytes) => match ProducerStates::from_snapshot(&bytes) {
            Ok((offset, states)) if offset <= log.end_offset() => (offset, states, true),
            Ok(_) => {
                notes.push(
                    "producer state snapshot is ahead of the log; rebuilt from the log".into(),
                );
                (log.start_offset(), ProducerStates::default(), false)
            }
            Err(e) => {
                notes.push(format!(
                    "producer state snapshot unreadable ({e:?}); rebuilt from the log"
                ));
                (log.start_offset(), ProducerStates::default(), false)
            }
        },
        Err(_) => (log.start_offset(), ProducerStates::default(), false),
    };
    log.for_each_batch(from.max(log.start_offset()), |h, marker| {
        if h.last_offset() >= from {
            producers.record_batch(h, marker);
        }
    })?;
    producers.forget_aborted_below(log.start_offset());
    Ok((from, producers, sound))
}

/// What one clean of a compacted partition did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CleanStats {
    /// Segments rewritten.
    pub segments: usize,
    /// Bytes of the segments read.
    pub bytes_read: u64,
    /// Bytes the rewritten segments shrank by.
    pub bytes_removed: u64,
    /// Where the next clean's dirty section begins.
    pub clean_point: i64,
}

/// A compacted partition as the cleaner sees it ([`Partition::cleaner_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanerState {
    /// Where the dirty section begins: records below it were cleaned.
    pub clean_point: i64,
    /// Bytes of the sealed segments below the clean point.
    pub clean_bytes: u64,
    /// Bytes of the sealed segments not cleaned yet (the active segment is neither).
    pub dirty_bytes: u64,
    /// Age of the oldest dirty segment by its newest record; 0 when nothing is dirty.
    pub oldest_dirty_age_ms: i64,
    /// The last clean since this broker started.
    pub last_clean: Option<LastClean>,
}

/// When the last clean of a partition ran, how long it took and what it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastClean {
    /// Its start, by the broker's clock (ms since the epoch).
    pub at_ms: i64,
    /// Its duration.
    pub took_ms: u64,
    /// What it did.
    pub stats: CleanStats,
}

/// The file holding where a compacted partition's dirty section begins.
const CLEAN_POINT_FILE: &str = "cleaner-offset-checkpoint";

/// How a transactional batch that opens its producer's transaction here was checked.
#[derive(Debug, Clone, Copy)]
enum TxnGate {
    /// By the coordinator, under this verification ticket (none: not checked, refused).
    Ticket(Option<u64>),
    /// By the broker itself, which wrote it.
    Trusted,
}

/// A leadership the metadata quorum gave this broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    /// This broker.
    pub me: BrokerId,
    /// The leader epoch.
    pub leader_epoch: i32,
    /// The partition epoch of the state it was given in.
    pub partition_epoch: i32,
    /// Assigned replicas.
    pub replicas: Vec<BrokerId>,
    /// In-sync replicas.
    pub isr: Vec<BrokerId>,
    /// Count only what is on disk towards the high watermark (fsync profiles).
    pub sync_acks: bool,
}

/// Why a follower's fetch was not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaFetchError {
    /// This broker does not lead the partition.
    NotLeader,
    /// The fetching broker is not one of the replicas.
    Replica(ReplicaError),
}

/// A produce that could not be stored.
#[derive(Debug)]
pub enum AppendError {
    /// Refused with a Kafka error (sequence, epoch, deleted topic).
    Refused(ResponseError),
    /// The disk failed.
    Storage(LogError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_log::FsyncPolicy;
    use spate_protocol::batch::{build, validate, NewRecord, ProducerFields};
    use spate_protocol::records::Compression;

    fn idempotent(first_seq: i32, n: i32) -> Vec<u8> {
        let records: Vec<NewRecord> = (0..n)
            .map(|_| NewRecord {
                value: Some(bytes::Bytes::from_static(b"v")),
                ..NewRecord::default()
            })
            .collect();
        let producer = ProducerFields {
            id: 9,
            epoch: 0,
            base_sequence: first_seq,
            transactional: false,
        };
        build(&records, Some(producer), Compression::None)
            .unwrap()
            .to_vec()
    }

    fn append(p: &Partition, b: &[u8]) -> Result<Appended, AppendError> {
        p.append(b, &validate(b).unwrap(), None)
    }

    fn open(dir: &Path) -> (Partition, Vec<String>) {
        Partition::open(
            dir,
            0,
            LogConfig::default(),
            Flusher::start(FsyncPolicy::Never).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn producer_state_survives_reopen_through_the_snapshot_and_the_tail_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = open(dir.path());
        assert!(matches!(
            append(&p, &idempotent(0, 3)),
            Ok(Appended::New { base_offset: 0, .. })
        ));
        p.write_producer_snapshot().unwrap();
        assert!(matches!(
            append(&p, &idempotent(3, 2)),
            Ok(Appended::New { base_offset: 3, .. })
        ));
        drop(p);
        let (p, notes) = open(dir.path());
        assert!(notes.is_empty(), "{notes:?}");
        // The batch after the snapshot was found in the log...
        assert!(matches!(
            append(&p, &idempotent(3, 2)),
            Ok(Appended::Duplicate {
                base_offset: 3,
                last_offset: 4
            })
        ));
        // ...the one before it came from the snapshot...
        assert!(matches!(
            append(&p, &idempotent(0, 3)),
            Ok(Appended::Duplicate { base_offset: 0, .. })
        ));
        // ...and a gap is still refused.
        assert!(matches!(
            append(&p, &idempotent(9, 1)),
            Err(AppendError::Refused(
                ResponseError::OutOfOrderSequenceNumber
            ))
        ));
    }

    #[test]
    fn a_follower_refuses_produce_and_takes_the_leaders_batches_with_their_offsets() {
        let leader_dir = tempfile::tempdir().unwrap();
        let follower_dir = tempfile::tempdir().unwrap();
        let (leader, _) = open(leader_dir.path());
        let (follower, _) = open(follower_dir.path());
        leader.set_role(Role::Leader, 5);
        follower.set_role(Role::Follower, 5);
        append(&leader, &idempotent(0, 3)).unwrap();
        append(&leader, &idempotent(3, 2)).unwrap();
        // A leader of a replicated partition does not expose what followers lack.
        assert_eq!(leader.high_watermark(), 0);
        assert!(matches!(
            append(&follower, &idempotent(0, 3)),
            Err(AppendError::Refused(ResponseError::NotLeaderOrFollower))
        ));
        let bytes = leader
            .state
            .read()
            .log
            .read(0, 1 << 20, i64::MAX, true)
            .unwrap();
        for (pos, h) in spate_protocol::batch::Batches::new(&bytes.records) {
            follower
                .append_replica(&bytes.records[pos..pos + h.total_len()], 5)
                .unwrap();
        }
        assert_eq!(follower.log_end_offset(), 5);
        assert_eq!(follower.end_offset_for_epoch(5), Some((5, 5)));
        leader.set_high_watermark(5);
        follower.set_high_watermark(99);
        assert_eq!((leader.high_watermark(), follower.high_watermark()), (5, 5));
        // After failover the follower leads and still knows the producer's sequences.
        follower.set_role(Role::Leader, 6);
        // A late fetch response from the old leader (epoch 5) no longer moves the watermark.
        assert!(!follower.follow_high_watermark(2, 5));
        assert_eq!(follower.high_watermark(), 5);
        assert!(matches!(
            append(&follower, &idempotent(3, 2)),
            Ok(Appended::Duplicate { base_offset: 3, .. })
        ));
    }

    fn leadership(isr: Vec<BrokerId>) -> Leadership {
        Leadership {
            me: 1,
            leader_epoch: 7,
            partition_epoch: 3,
            replicas: vec![1, 2, 3],
            isr,
            sync_acks: false,
        }
    }

    #[test]
    fn a_reopened_replica_takes_no_produce_and_exposes_nothing_until_the_quorum_makes_it_leader() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = open(dir.path());
        append(&p, &idempotent(0, 3)).unwrap();
        drop(p);
        let (p, _) = Partition::open_replica(
            dir.path(),
            0,
            LogConfig::default(),
            Flusher::start(FsyncPolicy::Never).unwrap(),
        )
        .unwrap();
        assert_eq!(p.role(), Role::Follower);
        assert_eq!((p.log_end_offset(), p.high_watermark()), (3, 0));
        assert!(matches!(
            append(&p, &idempotent(3, 1)),
            Err(AppendError::Refused(ResponseError::NotLeaderOrFollower))
        ));
        assert!(matches!(
            p.delete_records_before(-1),
            Err(AppendError::Refused(ResponseError::NotLeaderOrFollower))
        ));
        // Made leader with followers that have not fetched: the three records are not
        // committed yet, and the high watermark is not known (below the epoch start).
        p.become_leader(leadership(vec![1, 2, 3]), 0, 30_000);
        assert_eq!(p.high_watermark(), 0);
        assert_eq!(p.known_high_watermark(), None);
        assert_eq!(p.accepts_acks_all(2), Some(true));
        for follower in [2, 3] {
            p.on_replica_fetch(follower, 3, 0, 1).unwrap();
        }
        assert_eq!(p.known_high_watermark(), Some(3));
    }

    #[test]
    fn a_leader_alone_in_the_isr_knows_its_high_watermark_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = Partition::open_replica(
            dir.path(),
            0,
            LogConfig::default(),
            Flusher::start(FsyncPolicy::Never).unwrap(),
        )
        .unwrap();
        p.become_leader(leadership(vec![1]), 0, 30_000);
        append(&p, &idempotent(0, 2)).unwrap();
        assert_eq!(p.known_high_watermark(), Some(2));
    }

    #[test]
    fn a_new_leader_records_its_epoch_when_it_takes_it_not_at_its_first_produce() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = open(dir.path());
        append(&p, &idempotent(0, 3)).unwrap();
        p.set_role(Role::Follower, 0);
        p.become_leader(leadership(vec![1]), 0, 30_000);
        let latest = p.epochs().last().copied();
        assert_eq!(
            latest,
            Some(EpochEntry {
                epoch: 7,
                start_offset: 3
            })
        );
        assert!(!p.epoch_is_new(7), "the first produce writes no checkpoint");
        let on_disk = std::fs::read_to_string(dir.path().join(spate_log::CHECKPOINT_FILE)).unwrap();
        assert!(on_disk.contains("7 3"), "{on_disk}");
    }

    #[test]
    fn truncation_forgets_removed_batches_so_their_retry_is_appended_again() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = open(dir.path());
        append(&p, &idempotent(0, 3)).unwrap();
        p.write_producer_snapshot().unwrap();
        append(&p, &idempotent(3, 2)).unwrap();
        assert_eq!(p.truncate_to(3).unwrap(), 3);
        assert_eq!(p.high_watermark(), 3);
        assert!(matches!(
            append(&p, &idempotent(3, 2)),
            Ok(Appended::New { base_offset: 3, .. })
        ));
        // Truncating below the snapshot drops it too.
        assert_eq!(p.truncate_to(0).unwrap(), 0);
        assert!(matches!(
            append(&p, &idempotent(0, 3)),
            Ok(Appended::New { base_offset: 0, .. })
        ));
    }

    /// A partition on a simulated disk that syncs every append, and a runtime to wait on
    /// its flusher.
    fn on_simulated_disk_with_fsync() -> (
        spate_log::sim::SimDisk,
        Flusher,
        Partition,
        tokio::runtime::Runtime,
    ) {
        let disk = spate_log::sim::SimDisk::new();
        let flusher = Flusher::start(FsyncPolicy::Always).unwrap();
        let (p, _) = Partition::open_on(
            disk.storage(),
            Path::new("/data/t/0"),
            0,
            LogConfig::default(),
            flusher.clone(),
        )
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        (disk, flusher, p, rt)
    }

    #[test]
    fn an_fsync_failure_takes_the_partition_offline() {
        let (disk, flusher, p, rt) = on_simulated_disk_with_fsync();
        let mut rx = p.durable_offset();
        append(&p, &idempotent(0, 1)).unwrap();
        // The flusher syncs in the background: let the first record reach disk before the
        // disk starts failing, so only the second one meets the failure.
        assert_eq!(rt.block_on(spate_log::wait_durable(&mut rx, 1)), Ok(()));
        disk.fail_fsync(true);
        append(&p, &idempotent(1, 1)).unwrap();
        let waited = rt.block_on(spate_log::wait_durable(&mut rx, 2));
        assert_eq!(waited, Err(spate_log::DurabilityError::FsyncFailed));
        assert!(p.is_offline());
        assert!(matches!(
            append(&p, &idempotent(2, 1)),
            Err(AppendError::Storage(LogError::Failed { .. }))
        ));
        assert!(matches!(
            p.read(0, 1024, true),
            Err(LogError::Failed { .. })
        ));
        flusher.shutdown();
    }

    #[test]
    fn a_follower_under_an_fsync_profile_reports_only_what_is_on_disk() {
        let (disk, flusher, p, rt) = on_simulated_disk_with_fsync();
        let mut rx = p.durable_offset();
        append(&p, &idempotent(0, 1)).unwrap();
        assert_eq!(rt.block_on(spate_log::wait_durable(&mut rx, 1)), Ok(()));
        assert_eq!(p.replica_fetch_offset(true), Some(1));
        // The next record's fsync fails: the log end is 2, but nothing past 1 is on disk, and
        // the replica reports nothing at all rather than its log end.
        disk.fail_fsync(true);
        append(&p, &idempotent(1, 1)).unwrap();
        let _ = rt.block_on(spate_log::wait_durable(&mut rx, 2));
        assert_eq!(p.log_end_offset(), 2);
        assert_eq!(p.replica_fetch_offset(true), None);
        assert_eq!(p.replica_fetch_offset(false), None);
        flusher.shutdown();
    }

    /// The log end offset the snapshot file on disk was taken at.
    fn snapshot_offset_on_disk(dir: &Path) -> i64 {
        let bytes = std::fs::read(dir.join(SNAPSHOT_FILE)).unwrap();
        ProducerStates::from_snapshot(&bytes).unwrap().0
    }

    #[test]
    fn without_producer_state_the_snapshot_is_written_once_per_segment() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = open(dir.path());
        let plain = |n: usize| {
            let records: Vec<NewRecord> = (0..n)
                .map(|_| NewRecord {
                    value: Some(bytes::Bytes::from_static(b"p")),
                    ..NewRecord::default()
                })
                .collect();
            build(&records, None, Compression::None).unwrap().to_vec()
        };
        append(&p, &plain(2)).unwrap();
        p.write_producer_snapshot().unwrap();
        assert_eq!(
            snapshot_offset_on_disk(dir.path()),
            2,
            "the first pass writes"
        );
        // Plain producers only, same segment: the next pass leaves the file alone.
        append(&p, &plain(3)).unwrap();
        p.write_producer_snapshot().unwrap();
        assert_eq!(snapshot_offset_on_disk(dir.path()), 2);
        // A roll: the next start would read the whole older segment, so it is written.
        p.state.write().log.roll(now_ms()).unwrap();
        append(&p, &plain(1)).unwrap();
        p.write_producer_snapshot().unwrap();
        assert_eq!(snapshot_offset_on_disk(dir.path()), 6);
        // An idempotent producer: every pass that finds new records writes.
        append(&p, &idempotent(0, 2)).unwrap();
        p.write_producer_snapshot().unwrap();
        assert_eq!(snapshot_offset_on_disk(dir.path()), 8);
        append(&p, &plain(1)).unwrap();
        p.write_producer_snapshot().unwrap();
        assert_eq!(snapshot_offset_on_disk(dir.path()), 9);
        // What was skipped is rebuilt from the log after the snapshot.
        drop(p);
        let (p, _) = open(dir.path());
        assert!(matches!(
            append(&p, &idempotent(0, 2)),
            Ok(Appended::Duplicate { base_offset: 6, .. })
        ));
    }

    #[test]
    fn a_restart_keeps_the_snapshot_once_per_segment_without_producer_state() {
        let dir = tempfile::tempdir().unwrap();
        let plain = |n: usize| {
            let records: Vec<NewRecord> = (0..n)
                .map(|_| NewRecord {
                    value: Some(bytes::Bytes::from_static(b"p")),
                    ..NewRecord::default()
                })
                .collect();
            build(&records, None, Compression::None).unwrap().to_vec()
        };
        let (p, _) = open(dir.path());
        append(&p, &plain(2)).unwrap();
        p.write_producer_snapshot().unwrap();
        assert_eq!(snapshot_offset_on_disk(dir.path()), 2);
        drop(p);
        // Plain appends after a restart, same segment: no new file.
        let (p, _) = open(dir.path());
        append(&p, &plain(3)).unwrap();
        p.write_producer_snapshot().unwrap();
        assert_eq!(
            snapshot_offset_on_disk(dir.path()),
            2,
            "written again after a restart"
        );
        // A roll after the restart still writes it.
        p.state.write().log.roll(now_ms()).unwrap();
        append(&p, &plain(1)).unwrap();
        p.write_producer_snapshot().unwrap();
        assert_eq!(snapshot_offset_on_disk(dir.path()), 6);
    }

    #[test]
    fn a_damaged_snapshot_is_ignored_and_the_log_rebuilds_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = open(dir.path());
        append(&p, &idempotent(0, 3)).unwrap();
        p.write_producer_snapshot().unwrap();
        drop(p);
        let snap = dir.path().join(SNAPSHOT_FILE);
        let mut bytes = std::fs::read(&snap).unwrap();
        bytes[5] ^= 0xff;
        std::fs::write(&snap, bytes).unwrap();
        let (p, notes) = open(dir.path());
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(matches!(
            append(&p, &idempotent(0, 3)),
            Ok(Appended::Duplicate { base_offset: 0, .. })
        ));
    }

    fn txn_batch(pid: i64, first_seq: i32, n: i32) -> Vec<u8> {
        let records: Vec<NewRecord> = (0..n)
            .map(|_| NewRecord {
                value: Some(bytes::Bytes::from_static(b"t")),
                ..NewRecord::default()
            })
            .collect();
        let producer = ProducerFields {
            id: pid,
            epoch: 0,
            base_sequence: first_seq,
            transactional: true,
        };
        build(&records, Some(producer), Compression::None)
            .unwrap()
            .to_vec()
    }

    /// Appends a transactional batch as a verified produce would.
    fn append_txn(p: &Partition, b: &[u8]) -> Result<Appended, AppendError> {
        let h = validate(b).unwrap();
        let ticket = p.begin_verification(h.producer_id);
        p.append_verified(b, &h, None, Some(ticket))
    }

    fn marker(kind: ControlKind) -> ControlRecord {
        ControlRecord {
            kind,
            coordinator_epoch: 0,
        }
    }

    use spate_protocol::batch::ControlKind;

    /// Producer 1 writes 0..3 and aborts (marker at 3), producer 2 opens a transaction at 4..5
    /// and leaves it open: the LSO is 4, one aborted transaction is known.
    fn aborted_then_open(p: &Partition) {
        append_txn(p, &txn_batch(1, 0, 3)).unwrap();
        p.append_marker(1, 0, marker(ControlKind::Abort)).unwrap();
        append_txn(p, &txn_batch(2, 0, 2)).unwrap();
    }

    fn txn_view(p: &Partition) -> (i64, i64, Vec<AbortedTxn>) {
        (
            p.high_watermark(),
            p.last_stable_offset(),
            p.aborted_in(0, i64::MAX),
        )
    }

    const ABORTED_1: AbortedTxn = AbortedTxn {
        producer_id: 1,
        first_offset: 0,
        last_offset: 3,
    };

    #[test]
    fn a_transactional_batch_needs_its_verification_ticket_and_a_marker_voids_it() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = open(dir.path());
        let b = txn_batch(1, 0, 2);
        let h = validate(&b).unwrap();
        assert!(matches!(
            p.append(&b, &h, None),
            Err(AppendError::Refused(ResponseError::InvalidTxnState))
        ));
        let stale = p.begin_verification(1);
        p.append_marker(1, 0, marker(ControlKind::Abort)).unwrap();
        assert!(
            matches!(
                p.append_verified(&b, &h, None, Some(stale)),
                Err(AppendError::Refused(ResponseError::InvalidTxnState))
            ),
            "verified before its transaction ended: must not open a new one"
        );
        append_txn(&p, &b).unwrap();
        assert!(!p.needs_verification(1), "its transaction is open here now");
        let next = txn_batch(1, 2, 1);
        p.append(&next, &validate(&next).unwrap(), None).unwrap();
        assert_eq!(
            p.last_stable_offset(),
            1,
            "the open transaction starts after the marker"
        );
    }

    #[test]
    fn the_last_stable_offset_waits_for_the_marker_and_aborts_are_listed_for_fetches() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = open(dir.path());
        append(&p, &idempotent(0, 2)).unwrap();
        aborted_then_open(&p);
        assert_eq!(
            txn_view(&p),
            (
                8,
                6,
                vec![AbortedTxn {
                    first_offset: 2,
                    last_offset: 5,
                    ..ABORTED_1
                }]
            )
        );
        let committed = p
            .read_upto(0, 1 << 20, true, p.last_stable_offset())
            .unwrap();
        let ends: Vec<i64> = spate_protocol::batch::Batches::new(&committed.records)
            .map(|(_, h)| h.last_offset())
            .collect();
        assert_eq!(
            ends,
            vec![1, 4, 5],
            "read_committed stops before the open transaction"
        );
        assert!(
            p.aborted_in(6, 8).is_empty(),
            "an abort wholly before the range"
        );
        p.append_marker(2, 0, marker(ControlKind::Commit)).unwrap();
        assert_eq!(p.last_stable_offset(), 9);
        assert_eq!(p.aborted_in(0, 9).len(), 1, "a commit is not listed");
        assert!(matches!(
            p.append_marker(
                2,
                0,
                ControlRecord {
                    kind: ControlKind::Commit,
                    coordinator_epoch: -1
                }
            ),
            Err(AppendError::Refused(
                ResponseError::TransactionCoordinatorFenced
            ))
        ));
    }

    #[test]
    fn open_and_aborted_transactions_survive_a_crash_with_or_without_the_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = open(dir.path());
        aborted_then_open(&p);
        let before = txn_view(&p);
        assert_eq!(before, (6, 4, vec![ABORTED_1]));
        p.write_producer_snapshot().unwrap();
        append(&p, &idempotent(0, 1)).unwrap();
        drop(p); // kill -9: no clean close
        let (p, _) = open(dir.path());
        assert_eq!(
            txn_view(&p),
            (7, 4, vec![ABORTED_1]),
            "snapshot plus the tail after it"
        );
        drop(p);
        std::fs::remove_file(dir.path().join(SNAPSHOT_FILE)).unwrap();
        let (p, _) = open(dir.path());
        assert_eq!(
            txn_view(&p),
            (7, 4, vec![ABORTED_1]),
            "rebuilt from the log alone"
        );
        p.append_marker(2, 0, marker(ControlKind::Abort)).unwrap();
        assert_eq!(p.last_stable_offset(), 8);
        assert_eq!(p.aborted_in(0, 8).len(), 2);
    }

    #[test]
    fn transaction_state_on_disk_survives_a_power_loss_and_an_unsynced_marker_does_not() {
        let disk = spate_log::sim::SimDisk::new();
        // Fsyncs happen only when the test says.
        let flusher = Flusher::manual(FsyncPolicy::Always);
        let open = |flusher: Flusher| {
            Partition::open_on(
                disk.storage(),
                Path::new("/data/t/0"),
                0,
                LogConfig::default(),
                flusher,
            )
            .unwrap()
            .0
        };
        let p = open(flusher.clone());
        aborted_then_open(&p);
        flusher.flush_now();
        // The commit marker is written but never synced: a power loss takes it.
        p.append_marker(2, 0, marker(ControlKind::Commit)).unwrap();
        assert_eq!(p.last_stable_offset(), 7);
        drop(p);
        disk.power_loss(spate_log::sim::Tear::LoseAll);
        let p = open(Flusher::manual(FsyncPolicy::Always));
        assert_eq!(
            txn_view(&p),
            (6, 4, vec![ABORTED_1]),
            "the open transaction is open again"
        );
    }

    #[test]
    fn a_follower_learns_transactions_from_the_leaders_batches_and_keeps_them_after_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let (leader, _) = open(dir.path().join("l").as_path());
        aborted_then_open(&leader);
        let (f, _) = Partition::open_replica(
            &dir.path().join("f"),
            0,
            LogConfig::default(),
            Flusher::start(FsyncPolicy::Never).unwrap(),
        )
        .unwrap();
        f.set_role(Role::Follower, 1);
        let all = leader.read_replica(0, 1 << 20, true).unwrap();
        for (pos, h) in spate_protocol::batch::Batches::new(&all.records) {
            f.append_replica(&all.records[pos..pos + h.total_len()], 1)
                .unwrap();
        }
        f.follow_high_watermark(6, 1);
        assert_eq!(txn_view(&f), (6, 4, vec![ABORTED_1]));
        f.truncate_to(4).unwrap();
        assert_eq!(
            txn_view(&f),
            (4, 4, vec![ABORTED_1]),
            "the open transaction was cut away"
        );
        assert!(f.needs_verification(2));
    }
}
