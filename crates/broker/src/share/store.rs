//! The durable share-group state: `__share_group_state`, a compacted internal topic of
//! `ShareSnapshot` records (Kafka's schema), one key per share-partition.
//!
//! Every write is a whole snapshot of the share-partition's durable state, never a delta: the
//! topic is compacted, which keeps only the latest record of a key, so only self-contained
//! records survive cleaning. Deltas (`ShareUpdate`) written by others are still understood on
//! replay.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use spate_protocol::batch::{self, NewRecord};
use spate_protocol::records::{Compression, RecordBatchDecoder};
use spate_protocol::ResponseError;
use spate_share::state::{ShareRecordKey, ShareSnapshot, ShareStateKey, ShareUpdate};

use crate::error::BrokerError;
use crate::groups::Written;
use crate::partition::{AppendError, Appended, Partition, Role};
use crate::registry::TopicRegistry;

/// The internal topic holding share-group state, as Kafka names it.
pub const SHARE_STATE_LOG: &str = "__share_group_state";

/// One partition: a standalone broker is the share coordinator of every share-partition, so
/// spreading the state over several partitions would buy nothing.
const PARTITIONS: i32 = 1;
/// Segment size of the state topic (Kafka's `share.coordinator.state.topic.segment.bytes`).
const SEGMENT_BYTES: u64 = 100 << 20;

/// Which share-partition: (group id, topic id, partition index).
pub type SpKey = (String, uuid::Uuid, i32);

/// Reads and writes `__share_group_state`.
#[derive(Default)]
pub struct StateStore {
    partition: Mutex<Option<Arc<Partition>>>,
}

impl StateStore {
    /// Every share-partition's latest durable state, from the topic if it exists.
    pub fn load(
        &self,
        topics: &TopicRegistry,
    ) -> Result<HashMap<SpKey, ShareSnapshot>, BrokerError> {
        let Some(topic) = topics.get(SHARE_STATE_LOG) else {
            return Ok(HashMap::new());
        };
        let mut out = HashMap::new();
        for p in topic.partitions() {
            replay(&p, &mut out)?;
            if p.index == 0 {
                *self.partition.lock() = Some(p);
            }
        }
        Ok(out)
    }

    /// Appends `snapshot` as the state of `key`; creates the topic on first use.
    pub fn write(
        &self,
        topics: &TopicRegistry,
        key: &SpKey,
        snapshot: &ShareSnapshot,
        now: i64,
    ) -> Result<Written, ResponseError> {
        self.append(topics, key, Some(Bytes::from(snapshot.encode())), now)
    }

    /// Appends a tombstone for `key`: its state is gone (the group was deleted), and
    /// compaction drops it.
    pub fn forget(
        &self,
        topics: &TopicRegistry,
        key: &SpKey,
        now: i64,
    ) -> Result<Written, ResponseError> {
        self.append(topics, key, None, now)
    }

    fn append(
        &self,
        topics: &TopicRegistry,
        key: &SpKey,
        value: Option<Bytes>,
        now: i64,
    ) -> Result<Written, ResponseError> {
        let partition = self.partition(topics)?;
        let record_key = ShareRecordKey::Snapshot(ShareStateKey {
            group_id: key.0.clone(),
            topic_id: key.1,
            partition: key.2,
        })
        .encode()
        .map_err(|e| {
            tracing::warn!(error = %e, "cannot encode a share state key");
            ResponseError::UnknownServerError
        })?;
        let record = NewRecord {
            key: Some(Bytes::from(record_key)),
            value,
            timestamp: now,
        };
        let built = batch::build(&[record], None, Compression::None).map_err(|e| {
            tracing::error!(error = %e, "cannot build a share state batch");
            ResponseError::UnknownServerError
        })?;
        let header = batch::validate(&built).map_err(|e| {
            tracing::error!(error = %e, "built an invalid share state batch");
            ResponseError::UnknownServerError
        })?;
        match partition.append(&built, &header, None) {
            Ok(Appended::New { last_offset, .. } | Appended::Duplicate { last_offset, .. }) => {
                Ok(Written {
                    epoch: partition.leader_epoch(),
                    partition,
                    end: last_offset + 1,
                })
            }
            Err(AppendError::Refused(_)) => Err(ResponseError::CoordinatorNotAvailable),
            Err(AppendError::Storage(e)) => {
                tracing::error!(error = %e, "share state append failed");
                Err(ResponseError::KafkaStorageError)
            }
        }
    }

    fn partition(&self, topics: &TopicRegistry) -> Result<Arc<Partition>, ResponseError> {
        let mut held = self.partition.lock();
        if let Some(p) = held.as_ref() {
            return Ok(p.clone());
        }
        let topic = match topics.get(SHARE_STATE_LOG) {
            Some(t) => t,
            None => match topics.create(
                SHARE_STATE_LOG,
                PARTITIONS,
                crate::groups::offsets_topic_config(SEGMENT_BYTES),
                false,
            ) {
                Ok(Some(t)) => t,
                Ok(None) | Err(_) => topics
                    .get(SHARE_STATE_LOG)
                    .ok_or(ResponseError::CoordinatorNotAvailable)?,
            },
        };
        let p = topic
            .partitions()
            .into_iter()
            .find(|p| p.index == 0)
            .filter(|p| p.role() != Role::Follower)
            .ok_or(ResponseError::CoordinatorNotAvailable)?;
        *held = Some(p.clone());
        Ok(p)
    }
}

/// Applies every record of one state partition to `out`, in log order. Unreadable records are
/// skipped and counted; an update without a snapshot before it is ignored (it cannot be
/// applied to anything).
fn replay(p: &Partition, out: &mut HashMap<SpKey, ShareSnapshot>) -> Result<(), BrokerError> {
    let (mut offset, end) = (p.log_start_offset(), p.log_end_offset());
    let mut skipped = 0usize;
    while offset < end {
        let chunk = p.read_replica(offset, 1 << 20, true)?;
        if chunk.records.is_empty() {
            break;
        }
        let mut buf: Bytes = chunk.records.clone();
        let sets =
            RecordBatchDecoder::decode_all(&mut buf).map_err(|e| BrokerError::CorruptMetadata {
                path: SHARE_STATE_LOG.into(),
                reason: e.to_string(),
            })?;
        for set in sets {
            for r in set.records {
                offset = offset.max(r.offset + 1);
                let Some(Ok(key)) = r.key.as_deref().map(ShareRecordKey::decode) else {
                    skipped += 1;
                    continue;
                };
                let k = key.state_key();
                let sp: SpKey = (k.group_id.clone(), k.topic_id, k.partition);
                let Some(value) = r.value else {
                    out.remove(&sp);
                    continue;
                };
                match key {
                    ShareRecordKey::Snapshot(_) => match ShareSnapshot::decode(&value) {
                        Ok(s) => {
                            out.insert(sp, s);
                        }
                        Err(_) => skipped += 1,
                    },
                    ShareRecordKey::Update(_) => match ShareUpdate::decode(&value) {
                        Ok(u) => {
                            if let Some(s) = out.get(&sp) {
                                let next = s.apply(&u);
                                out.insert(sp, next);
                            }
                        }
                        Err(_) => skipped += 1,
                    },
                }
            }
        }
    }
    if skipped > 0 {
        tracing::warn!(
            skipped,
            "unreadable records in {SHARE_STATE_LOG} were ignored"
        );
    }
    Ok(())
}
