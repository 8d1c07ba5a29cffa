//! The share coordinator: the durable state of share-partitions, kept in
//! `__share_group_state` and served to whoever leads each share-partition through Kafka's
//! share-group state APIs (InitializeShareGroupState, ReadShareGroupState,
//! WriteShareGroupState, DeleteShareGroupState, ReadShareGroupStateSummary).
//!
//! It is the one writer of the state topic. Its fencing is Kafka's: a write or read from a
//! leader epoch older than one seen for the share-partition is FENCED_LEADER_EPOCH (a deposed
//! leader can no longer change the state), and a write or initialization from an older state
//! epoch is FENCED_STATE_EPOCH (the state was reset, by AlterShareGroupOffsets, under it).
//! The share-partition leader on this broker ([`super::ShareService`]) goes through it too.

use std::collections::HashMap;

use parking_lot::Mutex;
use spate_protocol::ResponseError;
use spate_share::state::{
    delivery_complete_count, DeliveryState, ShareSnapshot, ShareUpdate, StateBatch,
};

use super::store::{SpKey, StateStore};
use crate::error::BrokerError;
use crate::groups::Written;
use crate::registry::TopicRegistry;

/// What a write asks to change in a share-partition's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateWrite {
    /// The writer's state epoch.
    pub state_epoch: i32,
    /// The writer's leader epoch of the data partition (-1: none given).
    pub leader_epoch: i32,
    /// The new share-partition start offset (-1: unchanged).
    pub start_offset: i64,
    /// Batches whose state changed; they replace what the stored state says of their offsets.
    pub batches: Vec<StateBatch>,
}

/// A share-partition's state as ReadShareGroupStateSummary gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSummary {
    /// State epoch.
    pub state_epoch: i32,
    /// Leader epoch of the last writer.
    pub leader_epoch: i32,
    /// The share-partition start offset.
    pub start_offset: i64,
}

struct Entry {
    snapshot: ShareSnapshot,
    /// The highest leader epoch seen in a read or write of this share-partition.
    leader_epoch: i32,
}

/// The share coordinator of every share-partition whose state this broker keeps.
pub struct ShareCoordinator {
    store: StateStore,
    states: Mutex<HashMap<SpKey, Entry>>,
    /// State partitions taken over in a cluster, with the leader epoch they were loaded at.
    led: Mutex<HashMap<usize, i32>>,
}

fn entry((k, snapshot): (SpKey, ShareSnapshot)) -> (SpKey, Entry) {
    let leader_epoch = snapshot.leader_epoch;
    (
        k,
        Entry {
            snapshot,
            leader_epoch,
        },
    )
}

impl ShareCoordinator {
    /// A standalone broker's coordinator, holding what `__share_group_state` holds, if it
    /// exists.
    pub fn open(topics: &TopicRegistry) -> Result<Self, BrokerError> {
        let store = StateStore::new(false);
        let states = store.load(topics)?.into_iter().map(entry).collect();
        Ok(Self {
            store,
            states: Mutex::new(states),
            led: Mutex::new(HashMap::new()),
        })
    }

    /// A cluster node's coordinator: it holds nothing until it leads state partitions
    /// ([`ShareCoordinator::take_over`]).
    pub fn clustered() -> Self {
        Self {
            store: StateStore::new(true),
            states: Mutex::new(HashMap::new()),
            led: Mutex::new(HashMap::new()),
        }
    }

    /// This node now leads state partition `index` (of `count`): the states kept there are
    /// rebuilt from its replica of the log, and this coordinator answers for them. Doing it
    /// again at the same partition is a reload (a new leader epoch).
    pub fn take_over(
        &self,
        index: usize,
        count: usize,
        partition: std::sync::Arc<crate::partition::Partition>,
        epoch: i32,
    ) -> Result<(), BrokerError> {
        if self.led.lock().get(&index) == Some(&epoch) {
            return Ok(());
        }
        let loaded = StateStore::load_partition(&partition)?;
        let mut states = self.states.lock();
        states.retain(|k, _| super::store::state_partition_for(k, count) != index);
        let n = loaded.len();
        states.extend(loaded.into_iter().map(entry));
        self.store.hold(index, count, partition);
        self.led.lock().insert(index, epoch);
        tracing::info!(
            partition = index,
            epoch,
            share_partitions = n,
            "share coordinator of a state partition: rebuilt from the replicated log"
        );
        Ok(())
    }

    /// This node no longer leads state partition `index`: its states are the new leader's.
    pub fn step_down(&self, index: usize) {
        if !self.store.release(index) {
            return;
        }
        self.led.lock().remove(&index);
        let mut states = self.states.lock();
        let before = states.len();
        if let Some(count) = self.store.count() {
            states.retain(|k, _| super::store::state_partition_for(k, count) != index);
        }
        tracing::info!(
            partition = index,
            share_partitions = before - states.len(),
            "no longer the share coordinator of a state partition"
        );
    }

    /// Whether this coordinator answers for the state of `key` now (standalone: always, once
    /// the topic exists or can be created).
    pub fn owns(&self, key: &SpKey) -> bool {
        self.store.holds(key) || (!self.store.clustered() && self.store.count().is_none())
    }

    /// Every share-partition with state, optionally only those of `group`.
    pub fn keys(&self, group: Option<&str>) -> Vec<SpKey> {
        let mut keys: Vec<SpKey> = self
            .states
            .lock()
            .keys()
            .filter(|k| group.is_none_or(|g| k.0 == g))
            .cloned()
            .collect();
        keys.sort();
        keys
    }

    /// The state of `key` for its leader at `leader_epoch` (ReadShareGroupState), `None` when
    /// it was never initialized. A leader epoch older than one seen is FENCED_LEADER_EPOCH;
    /// a newer one is remembered, so the previous leader's writes are fenced from now on.
    pub fn read(
        &self,
        key: &SpKey,
        leader_epoch: i32,
    ) -> Result<Option<ShareSnapshot>, ResponseError> {
        let mut states = self.states.lock();
        let Some(e) = states.get_mut(key) else {
            return Ok(None);
        };
        if leader_epoch >= 0 && e.leader_epoch > leader_epoch {
            return Err(ResponseError::FencedLeaderEpoch);
        }
        e.leader_epoch = e.leader_epoch.max(leader_epoch);
        Ok(Some(e.snapshot.clone()))
    }

    /// The start offset and epochs of `key` (ReadShareGroupStateSummary), without taking a
    /// leader epoch: the group coordinator asks it to describe offsets.
    pub fn summary(&self, key: &SpKey) -> Option<StateSummary> {
        self.states.lock().get(key).map(|e| StateSummary {
            state_epoch: e.snapshot.state_epoch,
            leader_epoch: e.snapshot.leader_epoch,
            start_offset: e.snapshot.start_offset,
        })
    }

    /// Starts `key` afresh at `start_offset` under `state_epoch` (InitializeShareGroupState):
    /// FENCED_STATE_EPOCH if the stored state has a newer one.
    pub fn initialize(
        &self,
        topics: &TopicRegistry,
        key: &SpKey,
        state_epoch: i32,
        start_offset: i64,
        now: i64,
    ) -> Result<Written, ResponseError> {
        if start_offset < -1 {
            return Err(ResponseError::InvalidRequest);
        }
        let mut states = self.states.lock();
        let old = states.get(key);
        if old.is_some_and(|e| e.snapshot.state_epoch > state_epoch) {
            return Err(ResponseError::FencedStateEpoch);
        }
        let snapshot = ShareSnapshot {
            snapshot_epoch: old.map_or(0, |e| e.snapshot.snapshot_epoch + 1),
            state_epoch,
            leader_epoch: old.map_or(-1, |e| e.snapshot.leader_epoch),
            start_offset,
            delivery_complete_count: 0,
            create_timestamp: now,
            write_timestamp: now,
            state_batches: Vec::new(),
        };
        let leader_epoch = old.map_or(-1, |e| e.leader_epoch);
        self.put(&mut states, topics, key, snapshot, leader_epoch, now)
    }

    /// Applies `w` to the state of `key` (WriteShareGroupState) and writes the result as a
    /// whole snapshot: the topic is compacted, so only self-contained records outlive
    /// cleaning. A first write creates the state.
    pub fn write(
        &self,
        topics: &TopicRegistry,
        key: &SpKey,
        w: &StateWrite,
        now: i64,
    ) -> Result<Written, ResponseError> {
        let bad_batch = |b: &StateBatch| {
            b.first_offset < 0
                || b.first_offset > b.last_offset
                || b.delivery_count < 0
                || DeliveryState::from_code(b.delivery_state).is_none()
        };
        if w.start_offset < -1 || w.batches.iter().any(bad_batch) {
            return Err(ResponseError::InvalidRequest);
        }
        let mut states = self.states.lock();
        let old = states.get(key);
        if let Some(e) = old {
            if w.leader_epoch >= 0 && e.leader_epoch > w.leader_epoch {
                return Err(ResponseError::FencedLeaderEpoch);
            }
            if e.snapshot.state_epoch > w.state_epoch {
                return Err(ResponseError::FencedStateEpoch);
            }
        }
        let leader_epoch = old.map_or(w.leader_epoch, |e| e.leader_epoch.max(w.leader_epoch));
        let base = match old {
            Some(e) => e.snapshot.clone(),
            None => ShareSnapshot {
                snapshot_epoch: -1,
                state_epoch: w.state_epoch,
                leader_epoch: w.leader_epoch,
                start_offset: w.start_offset,
                delivery_complete_count: -1,
                create_timestamp: now,
                write_timestamp: now,
                state_batches: Vec::new(),
            },
        };
        let update = ShareUpdate::of(
            (w.start_offset >= 0).then_some(w.start_offset),
            &w.batches,
            -1,
            base.snapshot_epoch,
            if w.leader_epoch >= 0 {
                w.leader_epoch
            } else {
                base.leader_epoch
            },
        );
        let mut next = base.apply(&update);
        // Derived from the merged batches, not taken from the writer: a write that carries
        // no count (WriteShareGroupState v0) would otherwise leave the old one standing.
        next.delivery_complete_count = delivery_complete_count(&next.state_batches);
        next.snapshot_epoch = base.snapshot_epoch + 1;
        next.state_epoch = w.state_epoch;
        next.write_timestamp = now;
        self.put(&mut states, topics, key, next, leader_epoch, now)
    }

    /// Forgets the state of `key` (DeleteShareGroupState): a tombstone, which compaction
    /// drops. Deleting what has no state is not an error.
    pub fn delete(
        &self,
        topics: &TopicRegistry,
        key: &SpKey,
        now: i64,
    ) -> Result<Option<Written>, ResponseError> {
        let mut states = self.states.lock();
        if !states.contains_key(key) {
            return Ok(None);
        }
        let w = self.store.forget(topics, key, now)?;
        states.remove(key);
        Ok(Some(w))
    }

    /// Appends `snapshot` and, once it is in the log, makes it the state of `key`.
    fn put(
        &self,
        states: &mut HashMap<SpKey, Entry>,
        topics: &TopicRegistry,
        key: &SpKey,
        snapshot: ShareSnapshot,
        leader_epoch: i32,
        now: i64,
    ) -> Result<Written, ResponseError> {
        let w = self.store.write(topics, key, &snapshot, now)?;
        states.insert(
            key.clone(),
            Entry {
                snapshot,
                leader_epoch,
            },
        );
        Ok(w)
    }
}

#[cfg(test)]
mod tests {
    use spate_log::{Flusher, FsyncPolicy};

    use super::*;

    fn registry(dir: &std::path::Path) -> TopicRegistry {
        let flusher = Flusher::start(FsyncPolicy::Never).unwrap();
        TopicRegistry::open(dir, flusher).unwrap().0
    }

    fn key(p: i32) -> SpKey {
        ("g".into(), uuid::Uuid::from_u128(7), p)
    }

    fn batch(first: i64, last: i64, state: i8, count: i16) -> StateBatch {
        StateBatch {
            first_offset: first,
            last_offset: last,
            delivery_state: state,
            delivery_count: count,
        }
    }

    /// The error of a call, if any.
    fn err<T>(r: Result<T, ResponseError>) -> Option<ResponseError> {
        r.err()
    }

    fn write(
        leader_epoch: i32,
        state_epoch: i32,
        start: i64,
        batches: Vec<StateBatch>,
    ) -> StateWrite {
        StateWrite {
            state_epoch,
            leader_epoch,
            start_offset: start,
            batches,
        }
    }

    #[test]
    fn writes_merge_into_the_state_and_a_reopen_reads_the_same_state() {
        let dir = tempfile::tempdir().unwrap();
        let topics = registry(dir.path());
        let c = ShareCoordinator::open(&topics).unwrap();
        assert_eq!(c.read(&key(0), 0), Ok(None), "never initialized");
        c.initialize(&topics, &key(0), 0, 10, 1).unwrap();
        // 10..19 delivered once (available again), then 12..13 acknowledged.
        c.write(
            &topics,
            &key(0),
            &write(0, 0, -1, vec![batch(10, 19, 0, 1)]),
            2,
        )
        .unwrap();
        c.write(
            &topics,
            &key(0),
            &write(0, 0, -1, vec![batch(12, 13, 2, 1)]),
            3,
        )
        .unwrap();
        let s = c.read(&key(0), 0).unwrap().unwrap();
        assert_eq!(s.start_offset, 10);
        assert_eq!(s.delivery_complete_count, 2, "12..=13 acknowledged");
        assert_eq!(
            s.state_batches,
            vec![
                batch(10, 11, 0, 1),
                batch(12, 13, 2, 1),
                batch(14, 19, 0, 1)
            ]
        );
        // The start offset moves past 11: what is below it goes.
        c.write(&topics, &key(0), &write(0, 0, 12, vec![]), 4)
            .unwrap();
        drop(c);
        let c = ShareCoordinator::open(&topics).unwrap();
        let again = c.read(&key(0), 0).unwrap().unwrap();
        assert_eq!(again.start_offset, 12);
        assert_eq!(
            again.state_batches,
            vec![batch(12, 13, 2, 1), batch(14, 19, 0, 1)]
        );
        assert_eq!(c.keys(Some("g")), vec![key(0)]);
        assert_eq!(c.keys(Some("other")), Vec::<SpKey>::new());
    }

    #[test]
    fn a_deposed_leader_and_a_reset_state_are_fenced() {
        let dir = tempfile::tempdir().unwrap();
        let topics = registry(dir.path());
        let c = ShareCoordinator::open(&topics).unwrap();
        c.initialize(&topics, &key(1), 0, 0, 1).unwrap();
        c.write(
            &topics,
            &key(1),
            &write(3, 0, -1, vec![batch(0, 4, 0, 1)]),
            2,
        )
        .unwrap();
        // A new leader reads the state at epoch 4: the leader at 3 can no longer write.
        assert!(c.read(&key(1), 4).unwrap().is_some());
        assert_eq!(
            err(c.write(
                &topics,
                &key(1),
                &write(3, 0, -1, vec![batch(0, 0, 2, 1)]),
                3
            )),
            Some(ResponseError::FencedLeaderEpoch)
        );
        assert_eq!(c.read(&key(1), 3), Err(ResponseError::FencedLeaderEpoch));
        c.write(
            &topics,
            &key(1),
            &write(4, 0, -1, vec![batch(0, 0, 2, 1)]),
            4,
        )
        .unwrap();
        // AlterShareGroupOffsets: a new state epoch starts afresh and fences the old one.
        c.initialize(&topics, &key(1), 1, 100, 5).unwrap();
        assert_eq!(
            err(c.write(
                &topics,
                &key(1),
                &write(4, 0, -1, vec![batch(1, 1, 2, 1)]),
                6
            )),
            Some(ResponseError::FencedStateEpoch)
        );
        assert_eq!(
            err(c.initialize(&topics, &key(1), 0, 5, 7)),
            Some(ResponseError::FencedStateEpoch)
        );
        let s = c.summary(&key(1)).unwrap();
        assert_eq!((s.state_epoch, s.start_offset), (1, 100));
        assert!(c
            .read(&key(1), 4)
            .unwrap()
            .unwrap()
            .state_batches
            .is_empty());
    }

    #[test]
    fn a_cluster_coordinator_answers_only_for_the_state_partitions_it_took_over() {
        let dir = tempfile::tempdir().unwrap();
        let topics = registry(dir.path());
        let state = topics
            .create(
                super::super::SHARE_STATE_LOG,
                3,
                crate::groups::offsets_topic_config(1 << 20),
                false,
            )
            .unwrap()
            .unwrap();
        let index = super::super::state_partition_for(&key(0), 3);
        let other = (index + 1) % 3;
        let part = |i: usize| state.partition(i as i32).unwrap();
        let c = ShareCoordinator::clustered();
        assert!(!c.owns(&key(0)), "nothing is held before a take-over");
        assert_eq!(
            err(c.initialize(&topics, &key(0), 0, 5, 1)),
            Some(ResponseError::CoordinatorNotAvailable)
        );
        c.take_over(other, 3, part(other), 0).unwrap();
        assert!(!c.owns(&key(0)));
        assert_eq!(
            err(c.initialize(&topics, &key(0), 0, 5, 1)),
            Some(ResponseError::NotCoordinator),
            "another partition's key"
        );
        c.take_over(index, 3, part(index), 0).unwrap();
        assert!(c.owns(&key(0)));
        c.initialize(&topics, &key(0), 0, 5, 1).unwrap();
        c.write(
            &topics,
            &key(0),
            &write(2, 0, -1, vec![batch(5, 6, 2, 1)]),
            2,
        )
        .unwrap();
        // Stepping down forgets the states: the new leader of the partition has them.
        c.step_down(index);
        assert!(!c.owns(&key(0)));
        assert_eq!(c.read(&key(0), 2), Ok(None));
        // Another node taking the partition over rebuilds them from the log, with the
        // leader epoch of the last write fencing older leaders.
        let next = ShareCoordinator::clustered();
        next.take_over(index, 3, part(index), 1).unwrap();
        let s = next.read(&key(0), 2).unwrap().unwrap();
        assert_eq!((s.start_offset, s.state_batches.len()), (5, 1));
        assert_eq!(next.read(&key(0), 1), Err(ResponseError::FencedLeaderEpoch));
    }

    #[test]
    fn bad_writes_change_nothing_and_a_delete_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let topics = registry(dir.path());
        let c = ShareCoordinator::open(&topics).unwrap();
        c.initialize(&topics, &key(2), 0, 5, 1).unwrap();
        assert_eq!(
            err(c.write(
                &topics,
                &key(2),
                &write(0, 0, -1, vec![batch(9, 3, 0, 1)]),
                2
            )),
            Some(ResponseError::InvalidRequest)
        );
        assert_eq!(
            err(c.write(&topics, &key(2), &write(0, 0, -7, vec![]), 2)),
            Some(ResponseError::InvalidRequest)
        );
        // A delivery state the schema does not define (0, 1, 2 and 4 are).
        assert_eq!(
            err(c.write(
                &topics,
                &key(2),
                &write(0, 0, -1, vec![batch(5, 6, 3, 1)]),
                2
            )),
            Some(ResponseError::InvalidRequest)
        );
        assert_eq!(c.summary(&key(2)).unwrap().start_offset, 5);
        assert!(c.delete(&topics, &key(2), 3).unwrap().is_some());
        assert!(
            c.delete(&topics, &key(2), 3).unwrap().is_none(),
            "nothing left"
        );
        drop(c);
        let c = ShareCoordinator::open(&topics).unwrap();
        assert_eq!(c.read(&key(2), 0), Ok(None));
    }
}
