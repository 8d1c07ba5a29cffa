//! The durable share-group state: `__share_group_state`, a compacted internal topic of
//! `ShareSnapshot` records (Kafka's schema), one key per share-partition.
//!
//! Every write is a whole snapshot of the share-partition's durable state, never a delta: the
//! topic is compacted, which keeps only the latest record of a key, so only self-contained
//! records survive cleaning. Deltas (`ShareUpdate`) written by others are still understood on
//! replay.
//!
//! A share-partition's state lives in the state partition its key hashes to, as in Kafka
//! ([`state_partition_for`]). Standalone, the topic has one partition and this broker holds
//! it. In a cluster it has [`CLUSTER_PARTITIONS`], replicated like `__consumer_offsets`, and
//! the store writes only to the partitions this node leads (handed over by the share
//! coordinator's take-over).

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

/// One partition standalone: a standalone broker is the share coordinator of every
/// share-partition, so spreading the state over several partitions would buy nothing.
const STANDALONE_PARTITIONS: i32 = 1;
/// Partitions of the state topic in a cluster, Kafka's
/// `share.coordinator.state.topic.num.partitions` default: the share coordinators' work is
/// spread over the nodes leading them.
pub const CLUSTER_PARTITIONS: i32 = 50;
/// Segment size of the state topic (Kafka's `share.coordinator.state.topic.segment.bytes`).
const SEGMENT_BYTES: u64 = 100 << 20;

/// Which share-partition: (group id, topic id, partition index).
pub type SpKey = (String, uuid::Uuid, i32);

/// The state partition (of `count`) holding the state of `key`: Kafka's share coordinator
/// key `group:topicId:partition` (the topic id in Kafka's base64 text), its Java hash made
/// non-negative as Kafka's `Utils.abs`, modulo the count.
pub fn state_partition_for(key: &SpKey, count: usize) -> usize {
    use base64::Engine;
    let topic = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key.1.as_bytes());
    let text = format!("{}:{}:{}", key.0, topic, key.2);
    let mut h: i32 = 0;
    for unit in text.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(i32::from(unit));
    }
    let positive = if h == i32::MIN { 0 } else { h.unsigned_abs() };
    positive as usize % count.max(1)
}

/// The state partitions this store writes to: all of them standalone, those this node leads
/// in a cluster.
#[derive(Default)]
struct Held {
    /// The topic's partition count (0: not known yet).
    count: usize,
    parts: HashMap<usize, Arc<Partition>>,
}

/// Reads and writes `__share_group_state`.
pub struct StateStore {
    held: Mutex<Held>,
    /// A cluster creates the topic through its controller and hands partitions over as this
    /// node comes to lead them; standalone, the store creates it on first use.
    clustered: bool,
}

impl StateStore {
    /// An empty store; `clustered` as in [`StateStore::clustered`].
    pub fn new(clustered: bool) -> Self {
        Self {
            held: Mutex::new(Held::default()),
            clustered,
        }
    }

    /// Every share-partition's latest durable state, from the topic if it exists
    /// (standalone: every partition is this broker's).
    pub fn load(
        &self,
        topics: &TopicRegistry,
    ) -> Result<HashMap<SpKey, ShareSnapshot>, BrokerError> {
        let Some(topic) = topics.get(SHARE_STATE_LOG) else {
            return Ok(HashMap::new());
        };
        let mut out = HashMap::new();
        let mut held = self.held.lock();
        held.count = topic.partition_count().max(0) as usize;
        for p in topic.partitions() {
            replay(&p, &mut out)?;
            held.parts.insert(p.index.max(0) as usize, p);
        }
        Ok(out)
    }

    /// The states kept in one partition (a cluster node taking over its leadership).
    pub fn load_partition(p: &Partition) -> Result<HashMap<SpKey, ShareSnapshot>, BrokerError> {
        let mut out = HashMap::new();
        replay(p, &mut out)?;
        Ok(out)
    }

    /// Writes to partition `index` (of `count`) go to `p` from now on.
    pub fn hold(&self, index: usize, count: usize, p: Arc<Partition>) {
        let mut held = self.held.lock();
        if held.count != count {
            held.count = count;
            held.parts.retain(|i, _| *i < count);
        }
        held.parts.insert(index, p);
    }

    /// Partition `index` is no longer written here.
    pub fn release(&self, index: usize) -> bool {
        self.held.lock().parts.remove(&index).is_some()
    }

    /// The topic's partition count, once known.
    pub fn count(&self) -> Option<usize> {
        let n = self.held.lock().count;
        (n > 0).then_some(n)
    }

    /// Whether this store is a cluster node's.
    pub fn clustered(&self) -> bool {
        self.clustered
    }

    /// Whether the state of `key` is written here now.
    pub fn holds(&self, key: &SpKey) -> bool {
        let held = self.held.lock();
        held.count > 0
            && held
                .parts
                .contains_key(&state_partition_for(key, held.count))
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
        let partition = self.partition(topics, key)?;
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

    fn partition(
        &self,
        topics: &TopicRegistry,
        key: &SpKey,
    ) -> Result<Arc<Partition>, ResponseError> {
        let mut held = self.held.lock();
        if held.count == 0 && !self.clustered {
            let topic = match topics.get(SHARE_STATE_LOG) {
                Some(t) => t,
                None => match topics.create(
                    SHARE_STATE_LOG,
                    STANDALONE_PARTITIONS,
                    crate::groups::offsets_topic_config(SEGMENT_BYTES),
                    false,
                ) {
                    Ok(Some(t)) => t,
                    Ok(None) | Err(_) => topics
                        .get(SHARE_STATE_LOG)
                        .ok_or(ResponseError::CoordinatorNotAvailable)?,
                },
            };
            held.count = topic.partition_count().max(0) as usize;
            for p in topic.partitions() {
                held.parts.insert(p.index.max(0) as usize, p);
            }
        }
        if held.count == 0 {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        let index = state_partition_for(key, held.count);
        // A partition handed over but since deposed is not written: the new leader's
        // coordinator owns the state.
        held.parts
            .get(&index)
            .filter(|p| p.role() != Role::Follower)
            .cloned()
            .ok_or(ResponseError::NotCoordinator)
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
