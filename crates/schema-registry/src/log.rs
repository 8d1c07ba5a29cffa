//! Where the registry's records live: the `_schemas` topic of the broker in this process
//! ([`BrokerLog`]), or memory for tests ([`MemoryLog`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use spate_broker::handlers::produce;
use spate_broker::Broker;
use spate_protocol::batch::{self, Batches, NewRecord};
use spate_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use spate_protocol::messages::{ProduceRequest, TopicName};
use spate_protocol::records::{Compression, RecordBatchDecoder};
use spate_protocol::{ResponseError, StrBytes};

use crate::error::RegistryError;
use crate::forward::Writer;
use crate::records::{Record, TOPIC};

/// Produce request version for the registry's appends (error messages from v8).
const PRODUCE_VERSION: i16 = 9;
/// Bytes read from the topic per step of catching up.
const READ_BYTES: usize = 1 << 20;
/// Largest record the `_schemas` topic takes (its `max.message.bytes` when created here):
/// above the schema size limit plus JSON escaping of the schema inside the record value.
pub const TOPIC_MAX_MESSAGE_BYTES: usize = 16 << 20;

/// A record read back, with its offset.
#[derive(Debug, Clone)]
pub struct LoggedRecord {
    /// Offset.
    pub offset: i64,
    /// Key bytes.
    pub key: Option<Bytes>,
    /// Value bytes (`None`: a tombstone).
    pub value: Option<Bytes>,
}

/// Records read in one step.
#[derive(Debug, Default)]
pub struct Chunk {
    /// Records in offset order.
    pub records: Vec<LoggedRecord>,
    /// The offset to read from next.
    pub next: i64,
}

/// The log the registry appends its records to and rebuilds its state from.
pub trait SchemaLog: Send + Sync + 'static {
    /// Makes sure the log exists (creates the topic); called again until it succeeds.
    fn prepare(&self) -> BoxFuture<'static, Result<(), RegistryError>>;
    /// Appends `records` as one batch; resolves to the offset after the last one once all
    /// of them are readable.
    fn append(&self, records: Vec<Record>) -> BoxFuture<'static, Result<i64, RegistryError>>;
    /// Records from `from` on, as far as one step reads and no further than what is readable.
    fn read(&self, from: i64) -> Result<Chunk, RegistryError>;
    /// The end of the log here: every record below it is readable now or will be (a new
    /// leader's tail from its predecessor becomes readable once its high watermark catches
    /// up). A write is decided only once the registry has applied everything below it, so no
    /// id or version a predecessor handed out is handed out again.
    fn end(&self) -> i64;
    /// Resolves when more may be readable, or after `limit`.
    fn changed(&self, limit: Duration) -> BoxFuture<'static, ()>;
    /// Which node takes writes now (a log of this process alone: this one).
    fn writer(&self) -> Writer {
        Writer::Here
    }
}

/// The `_schemas` topic of a broker in this process: appends through the broker's produce
/// handler (acks=all, so in a cluster they are replicated before they count), reads from the
/// local replica up to its high watermark.
pub struct BrokerLog {
    broker: Arc<Broker>,
    timeout: Duration,
}

impl BrokerLog {
    /// The log of `broker`'s `_schemas` topic; appends wait at most `timeout`.
    pub fn new(broker: Arc<Broker>, timeout: Duration) -> Self {
        Self { broker, timeout }
    }

    fn partition(&self) -> Option<Arc<spate_broker::Partition>> {
        self.broker.topics.get(TOPIC).and_then(|t| t.partition(0))
    }

    /// Why this node cannot write: who leads `_schemas` instead.
    fn not_leader(broker: &Broker) -> RegistryError {
        let leader = broker
            .cluster()
            .and_then(|c| c.image().partition(TOPIC, 0).and_then(|p| p.leader));
        RegistryError::NotLeader(match leader {
            Some(l) => format!(
                "this node does not lead the {TOPIC} topic (node {l} does): send schema writes to the registry of node {l}"
            ),
            None => format!("the {TOPIC} topic has no leader now; retry"),
        })
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl SchemaLog for BrokerLog {
    fn prepare(&self) -> BoxFuture<'static, Result<(), RegistryError>> {
        let b = self.broker.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            if b.topics.get(TOPIC).is_some() {
                return Ok(());
            }
            use spate_protocol::messages::create_topics_request::{
                CreatableTopic, CreatableTopicConfig, CreateTopicsRequest,
            };
            let mut t = CreatableTopic::default();
            t.name = TopicName(StrBytes::from_static_str(TOPIC));
            t.num_partitions = 1;
            t.replication_factor = -1;
            for (k, v) in [
                ("cleanup.policy", "compact".to_string()),
                ("max.message.bytes", TOPIC_MAX_MESSAGE_BYTES.to_string()),
            ] {
                let mut c = CreatableTopicConfig::default();
                c.name = StrBytes::from_static_str(k);
                c.value = Some(StrBytes::from_string(v));
                t.configs.push(c);
            }
            let mut req = CreateTopicsRequest::default();
            req.topics.push(t);
            req.timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
            let resp = b
                .topology()
                .create_topics(&b, 7, req)
                .run(&b)
                .await
                .ok_or_else(|| RegistryError::Store(format!("creating {TOPIC} failed")))?;
            let Some(result) = resp.topics.first() else {
                return Err(RegistryError::Store(format!("no answer creating {TOPIC}")));
            };
            match ResponseError::try_from_code(result.error_code) {
                None => {
                    tracing::info!("created the {TOPIC} topic (compacted) for the schema registry");
                    Ok(())
                }
                Some(ResponseError::TopicAlreadyExists) => Ok(()),
                Some(e) => Err(RegistryError::Store(format!(
                    "creating {TOPIC}: {e:?} {}",
                    result.error_message.as_deref().unwrap_or("")
                ))),
            }
        })
    }

    fn append(&self, records: Vec<Record>) -> BoxFuture<'static, Result<i64, RegistryError>> {
        let b = self.broker.clone();
        let timeout = self.timeout;
        let partition = self.partition();
        Box::pin(async move {
            let Some(partition) = partition else {
                return Err(RegistryError::Store(format!(
                    "the {TOPIC} topic does not exist yet; retry"
                )));
            };
            let now = now_ms();
            let count = records.len() as i64;
            let new: Vec<NewRecord> = records
                .into_iter()
                .map(|r| NewRecord {
                    key: Some(Bytes::from(r.key)),
                    value: r.value.map(Bytes::from),
                    timestamp: now,
                })
                .collect();
            let batch = batch::build(&new, None, Compression::None)
                .map_err(|e| RegistryError::Store(format!("encoding records: {e}")))?;
            let mut pd = PartitionProduceData::default();
            pd.index = 0;
            pd.records = Some(batch);
            let mut td = TopicProduceData::default();
            td.name = TopicName(StrBytes::from_static_str(TOPIC));
            td.partition_data = vec![pd];
            let mut req = ProduceRequest::default();
            req.acks = -1;
            req.timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
            req.topic_data = vec![td];
            let resp =
                tokio::time::timeout(timeout, produce::produce(&b, PRODUCE_VERSION, 0, req, true))
                    .await
                    .map_err(|_| {
                        RegistryError::Timeout(format!(
                            "the write to {TOPIC} was not acknowledged within {timeout:?}"
                        ))
                    })?;
            let Some(pr) = resp
                .responses
                .first()
                .and_then(|t| t.partition_responses.first())
            else {
                return Err(RegistryError::Store(format!("no answer writing {TOPIC}")));
            };
            match ResponseError::try_from_code(pr.error_code) {
                None => {}
                Some(ResponseError::NotLeaderOrFollower) => return Err(Self::not_leader(&b)),
                Some(e) => {
                    return Err(RegistryError::Store(format!(
                        "writing {TOPIC}: {e:?} {}",
                        pr.error_message.as_deref().unwrap_or("")
                    )))
                }
            }
            let end = pr.base_offset + count;
            // acks=all answered: the high watermark is there or about to be.
            let mut hw = partition.watch_high_watermark();
            let reached = tokio::time::timeout(timeout, hw.wait_for(|h| *h >= end)).await;
            match reached {
                Ok(Ok(_)) => Ok(end),
                _ => Err(RegistryError::Timeout(format!(
                    "the write to {TOPIC} did not become readable within {timeout:?}"
                ))),
            }
        })
    }

    fn read(&self, from: i64) -> Result<Chunk, RegistryError> {
        let Some(p) = self.partition() else {
            return Ok(Chunk {
                records: Vec::new(),
                next: from,
            });
        };
        // Records removed by retention or a DeleteRecords are gone for everyone.
        let from = from.max(p.log_start_offset());
        let hw = p.high_watermark();
        if from >= hw {
            return Ok(Chunk {
                records: Vec::new(),
                next: from,
            });
        }
        let read = p
            .read(from, READ_BYTES, true)
            .map_err(|e| RegistryError::Store(format!("reading {TOPIC} at {from}: {e}")))?;
        Ok(decode(&read.records, from, hw))
    }

    fn end(&self) -> i64 {
        self.partition()
            .map_or(0, |p| p.log_end_offset().max(p.high_watermark()))
    }

    fn writer(&self) -> Writer {
        let Some(cluster) = self.broker.cluster() else {
            return Writer::Here;
        };
        match cluster.image().partition(TOPIC, 0) {
            // Not created yet: tried here, where the append says so.
            None => Writer::Here,
            Some(p) => match p.leader {
                Some(l) if l == cluster.broker_id() => Writer::Here,
                Some(l) => Writer::Node(l),
                None => Writer::Nobody,
            },
        }
    }

    fn changed(&self, limit: Duration) -> BoxFuture<'static, ()> {
        let watch = self.partition().map(|p| p.watch_high_watermark());
        Box::pin(async move {
            match watch {
                Some(mut w) => {
                    let _ = tokio::time::timeout(limit, w.changed()).await;
                }
                None => tokio::time::sleep(limit).await,
            }
        })
    }
}

/// The data records of whole batches in `bytes` from `from` up to `limit`; batches that do
/// not decode are skipped (with a warning) so one bad batch cannot stop the registry.
fn decode(bytes: &Bytes, from: i64, limit: i64) -> Chunk {
    let mut chunk = Chunk {
        records: Vec::new(),
        next: from,
    };
    for (at, header) in Batches::new(bytes) {
        if header.base_offset >= limit {
            break;
        }
        chunk.next = chunk.next.max(header.next_offset().min(limit));
        if header.is_control() {
            continue;
        }
        let mut one = bytes.slice(at..at + header.total_len());
        match RecordBatchDecoder::decode(&mut one) {
            Ok(set) => chunk.records.extend(
                set.records
                    .into_iter()
                    .filter(|r| r.offset >= from && r.offset < limit && !r.control)
                    .map(|r| LoggedRecord {
                        offset: r.offset,
                        key: r.key,
                        value: r.value,
                    }),
            ),
            Err(e) => tracing::warn!(
                base_offset = header.base_offset,
                error = %e,
                "a batch of {TOPIC} cannot be decoded; its records are skipped"
            ),
        }
    }
    chunk
}

/// A log in memory, for tests: appends are readable at once.
#[derive(Default)]
pub struct MemoryLog {
    records: Mutex<Vec<Record>>,
    grew: tokio::sync::Notify,
    /// When set, appends fail with this error (to test failed writes).
    pub fail_appends: Mutex<Option<RegistryError>>,
}

impl MemoryLog {
    /// An empty log.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Every record appended so far.
    pub fn all(&self) -> Vec<Record> {
        self.records.lock().clone()
    }

    /// A log holding what compaction leaves of this one once its tombstones have expired: the
    /// latest record of each key, in log order, tombstones gone.
    pub fn compacted(&self) -> Arc<Self> {
        let all = self.records.lock();
        let mut latest = std::collections::HashMap::new();
        for (i, r) in all.iter().enumerate() {
            latest.insert(r.key.as_slice(), i);
        }
        let kept = all
            .iter()
            .enumerate()
            .filter(|(i, r)| r.value.is_some() && latest.get(r.key.as_slice()) == Some(i))
            .map(|(_, r)| r.clone())
            .collect();
        Arc::new(Self {
            records: Mutex::new(kept),
            ..Self::default()
        })
    }
}

impl SchemaLog for Arc<MemoryLog> {
    fn prepare(&self) -> BoxFuture<'static, Result<(), RegistryError>> {
        Box::pin(async { Ok(()) })
    }

    fn append(&self, records: Vec<Record>) -> BoxFuture<'static, Result<i64, RegistryError>> {
        let me = self.clone();
        Box::pin(async move {
            if let Some(e) = me.fail_appends.lock().clone() {
                return Err(e);
            }
            let end = {
                let mut all = me.records.lock();
                all.extend(records);
                all.len() as i64
            };
            me.grew.notify_waiters();
            Ok(end)
        })
    }

    fn read(&self, from: i64) -> Result<Chunk, RegistryError> {
        let all = self.records.lock();
        let start = usize::try_from(from.max(0)).unwrap_or(usize::MAX);
        let records: Vec<LoggedRecord> = all
            .iter()
            .enumerate()
            .skip(start)
            .take(100)
            .map(|(i, r)| LoggedRecord {
                offset: i as i64,
                key: Some(Bytes::from(r.key.clone())),
                value: r.value.clone().map(Bytes::from),
            })
            .collect();
        let next = records.last().map_or(from, |r| r.offset + 1);
        Ok(Chunk { records, next })
    }

    fn end(&self) -> i64 {
        self.records.lock().len() as i64
    }

    fn changed(&self, limit: Duration) -> BoxFuture<'static, ()> {
        let me = self.clone();
        Box::pin(async move {
            let _ = tokio::time::timeout(limit, me.grew.notified()).await;
        })
    }
}
