//! Produce: validate each partition's batch, append it, and answer once the configured
//! durability holds.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use spate_auth::acl::{Operation, ResourceType};
use spate_log::{wait_durable, Durability, DurabilityError};
use spate_protocol::batch::{self, BatchError, BatchHeader};
use spate_protocol::messages::produce_request::PartitionProduceData;
use spate_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use spate_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse, RequestHeader};
use spate_protocol::ResponseError;
use tokio::sync::watch;

use super::msg;
use crate::partition::{AppendError, Appended, Partition};
use crate::registry::Topic;
use crate::security::Session;
use crate::Broker;
use spate_cluster::replication::AckState;

/// A partition response that must wait for `offset` to become durable.
struct Wait {
    topic: usize,
    partition: usize,
    durable: watch::Receiver<Durability>,
    offset: i64,
}

/// An acks=all partition response that must wait for the ISR to hold `last_offset`.
struct Replicated {
    topic: usize,
    partition: usize,
    replica: Arc<Partition>,
    leader_epoch: i32,
    last_offset: i64,
    min_isr: usize,
}

/// Appends everything in the request now, in request order, and returns the response future,
/// or `None` for acks=0 (no response is sent).
pub fn handle(
    b: &Arc<Broker>,
    who: Option<&Session>,
    header: &RequestHeader,
    throttle_ms: i32,
    req: ProduceRequest,
) -> Option<impl Future<Output = ProduceResponse> + Send + 'static> {
    let acks = req.acks;
    let answer = produce_verified(
        b,
        who,
        header.request_api_version,
        throttle_ms,
        req,
        true,
        Verified::Here,
    );
    // The appends happened inside `produce`; acks=0 only skips the answer.
    (acks != 0).then_some(answer)
}

/// Appends everything in the request now, in request order (as [`handle`]), and returns the
/// response future. With `wait` it answers once the acks' durability and replication hold;
/// without, at once with the offsets the appends got (HTTP ingest's acks=0, which still wants
/// to tell the client where its records went).
pub fn produce(
    b: &Arc<Broker>,
    version: i16,
    throttle_ms: i32,
    req: ProduceRequest,
    wait: bool,
) -> impl Future<Output = ProduceResponse> + Send + 'static {
    produce_verified(b, None, version, throttle_ms, req, wait, Verified::Here)
}

/// [`produce`] for a client connection, whose principal must be allowed to write.
pub fn produce_by(
    b: &Arc<Broker>,
    who: Option<&Session>,
    version: i16,
    throttle_ms: i32,
    req: ProduceRequest,
) -> impl Future<Output = ProduceResponse> + Send + 'static {
    produce_verified(b, who, version, throttle_ms, req, true, Verified::Here)
}

/// The transactional batches of a produce that must be settled with the coordinator before
/// anything is appended, as (topic, partition, producer id, epoch): those that would open their
/// producer's transaction in a partition, when the coordinator is another node (asked whether
/// the partition was added: KIP-890 verification) or when the request is v12+ (transaction
/// version 2: the partition is added to the transaction on the producer's behalf). Empty when
/// the local coordinator can verify them inline.
pub fn txn_asks(b: &Broker, version: i16, req: &ProduceRequest) -> Vec<(String, i32, i64, i16)> {
    let Some(txn_id) = req.transactional_id.as_ref() else {
        return Vec::new();
    };
    let implicit_add = version >= 12;
    if !implicit_add && (!b.topology().replicates() || b.txns.is_coordinator(txn_id)) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for td in &req.topic_data {
        // v13 names topics by id.
        let topic = if version >= 13 {
            b.topics.get_by_id(&td.topic_id)
        } else {
            b.topics.get(&td.name)
        };
        let Some(t) = topic else {
            continue;
        };
        for pd in &td.partition_data {
            let (Some(records), Ok(p)) = (&pd.records, t.lookup(pd.index)) else {
                continue;
            };
            let Ok(h) = BatchHeader::parse(records) else {
                continue;
            };
            if h.is_transactional() && !h.is_control() && p.needs_verification(h.producer_id) {
                out.push((t.name.clone(), pd.index, h.producer_id, h.producer_epoch));
            }
        }
    }
    out
}

/// Settles [`txn_asks`] with the transactional id's coordinator: verifies (v11 and older) or
/// adds (v12+) each partition, holding a verification ticket per partition from before the
/// question, so a marker written meanwhile voids the answer.
pub async fn settle_txn_asks(
    b: Arc<Broker>,
    version: i16,
    txn_id: String,
    asks: Vec<(String, i32, i64, i16)>,
) -> HashMap<(String, i32), Result<u64, ResponseError>> {
    let mut tickets = Vec::new();
    for (topic, index, pid, _) in &asks {
        if let Some(p) = b.topics.get(topic).and_then(|t| t.lookup(*index).ok()) {
            tickets.push(((topic.clone(), *index), p.begin_verification(*pid)));
        }
    }
    let outcome = if version >= 12 {
        crate::transactions::add_on_behalf(&b, &txn_id, &asks).await
    } else {
        match b.topology().cluster() {
            None => Err(ResponseError::CoordinatorNotAvailable),
            Some(c) => crate::cluster::ask_coordinator(c, &txn_id, &asks, true).await,
        }
    };
    let mut answers = HashMap::new();
    for (key, ticket) in tickets {
        let answer = match &outcome {
            Err(e) => Err(*e),
            Ok(errors) => match errors.get(&key) {
                None | Some(None) => Ok(ticket),
                Some(Some(e)) => Err(*e),
            },
        };
        answers.insert(key, answer);
    }
    answers
}

/// How the transactional batches of a request that open their producer's transaction in a
/// partition are checked against the transaction coordinator (KIP-890).
pub(crate) enum Verified {
    /// Ask the coordinator on this node now.
    Here,
    /// Asked already (the coordinator is another node, or the partitions were added on the
    /// producer's behalf): the verification ticket, or the refusal, per topic and partition.
    Asked(HashMap<(String, i32), Result<u64, ResponseError>>),
}

/// [`produce`] with transactional batches verified as `verified` says.
pub(crate) fn produce_verified(
    b: &Arc<Broker>,
    who: Option<&Session>,
    version: i16,
    throttle_ms: i32,
    req: ProduceRequest,
    wait: bool,
    verified: Verified,
) -> impl Future<Output = ProduceResponse> + Send + 'static {
    let acks = req.acks;
    let txn_id = req.transactional_id.as_ref().map(|t| t.to_string());
    let mut resp = ProduceResponse::default();
    resp.throttle_time_ms = throttle_ms;
    let mut waits = Vec::new();
    let mut replicated = Vec::new();
    let topology = b.topology();
    let replicated_partitions = topology.replicates();
    let out_of_session = !topology.takes_produce();
    let bad_acks = !matches!(acks, -1..=1);
    // ACLs: a transactional produce needs Write on its transactional id, every topic Write.
    let txn_denied = txn_id.as_deref().is_some_and(|id| {
        !b.authorizer
            .allows(who, Operation::Write, ResourceType::TransactionalId, id)
    });
    let fsync_acks = b.config.fsync.acks_wait_for_fsync() && acks != 0;
    for (ti, td) in req.topic_data.into_iter().enumerate() {
        let mut tr = TopicProduceResponse::default();
        let topic = if version >= 13 {
            tr.topic_id = td.topic_id;
            b.topics.get_by_id(&td.topic_id)
        } else {
            tr.name = td.name.clone();
            b.topics.get(&td.name)
        };
        for (pi, pd) in td.partition_data.into_iter().enumerate() {
            let mut pr = PartitionProduceResponse::default();
            pr.index = pd.index;
            let outcome = if bad_acks {
                Err((
                    ResponseError::InvalidRequiredAcks,
                    format!("acks must be -1, 0 or 1, got {acks}"),
                ))
            } else if out_of_session {
                Err((
                    ResponseError::NotLeaderOrFollower,
                    "this broker has lost its session with the controller; retry on the current leader".into(),
                ))
            } else {
                match &topic {
                    None if version >= 13 => {
                        Err((ResponseError::UnknownTopicId, "unknown topic id".into()))
                    }
                    None => Err((
                        ResponseError::UnknownTopicOrPartition,
                        "unknown topic".into(),
                    )),
                    _ if txn_denied => Err((
                        ResponseError::TransactionalIdAuthorizationFailed,
                        "not authorized to write with this transactional id".into(),
                    )),
                    Some(t)
                        if !b.authorizer.allows(
                            who,
                            Operation::Write,
                            ResourceType::Topic,
                            &t.name,
                        ) =>
                    {
                        Err((
                            ResponseError::TopicAuthorizationFailed,
                            format!("not authorized to write to {}", t.name),
                        ))
                    }
                    // Only the group coordinator writes there, as in Kafka.
                    Some(t) if crate::groups::is_internal(&t.name) => Err((
                        ResponseError::InvalidTopicException,
                        format!("cannot produce to the internal topic {}", t.name),
                    )),
                    // The data dir is below its free-space watermark: refused before
                    // anything is written, with an error clients retry (one atomic load;
                    // the free space is sampled in the background).
                    Some(_) if b.disk.is_full() => {
                        Err((ResponseError::KafkaStorageError, b.disk.refusal()))
                    }
                    Some(t) => {
                        let mut verify = |p: &Partition, h: &BatchHeader| {
                            verify_txn(b, &verified, txn_id.as_deref(), t, p, h)
                        };
                        append_one(t, pd, b.clock.now_ms(), acks == -1, &mut verify, &b.disk)
                    }
                }
            };
            match outcome {
                Ok((appended, log_start, append_time)) => {
                    let (base, last) = match appended {
                        Appended::New {
                            base_offset,
                            last_offset,
                        } => (base_offset, last_offset),
                        // The original may still be waiting for its fsync or its replicas:
                        // so does the retry.
                        Appended::Duplicate {
                            base_offset,
                            last_offset,
                        } => (base_offset, last_offset),
                    };
                    let wait_for = Some(last + 1);
                    if let (true, -1, Some(t)) = (replicated_partitions, acks, &topic) {
                        if let Some(p) = t.partition(pr.index) {
                            replicated.push(Replicated {
                                topic: ti,
                                partition: pi,
                                leader_epoch: p.leader_epoch(),
                                replica: p,
                                last_offset: last,
                                min_isr: t.with_config(|c| c.min_insync_replicas()),
                            });
                        }
                    }
                    pr.base_offset = base;
                    pr.log_append_time_ms = append_time.unwrap_or(-1);
                    if version >= 5 {
                        pr.log_start_offset = log_start;
                    }
                    if let (true, Some(offset), Some(t)) = (fsync_acks, wait_for, &topic) {
                        if let Some(p) = t.partition(pr.index) {
                            waits.push(Wait {
                                topic: ti,
                                partition: pi,
                                durable: p.durable_offset(),
                                offset,
                            });
                        }
                    }
                }
                Err((code, message)) => {
                    b.metrics.error(ApiKey::Produce as i16, code.code());
                    pr.error_code = code.code();
                    pr.base_offset = -1;
                    pr.log_append_time_ms = -1;
                    if version >= 5 {
                        pr.log_start_offset = -1;
                    }
                    if version >= 8 {
                        pr.error_message = msg(message);
                    }
                }
            }
            tr.partition_responses.push(pr);
        }
        resp.responses.push(tr);
    }
    if !wait || acks == 0 {
        waits.clear();
        replicated.clear();
    }
    let timeout = Duration::from_millis(req.timeout_ms.max(0) as u64);
    let metrics = b.metrics.clone();
    async move {
        let deadline = tokio::time::Instant::now() + timeout;
        for mut w in waits {
            let done =
                tokio::time::timeout_at(deadline, wait_durable(&mut w.durable, w.offset)).await;
            let (code, text) = match done {
                Ok(Ok(())) => continue,
                Err(_) => (
                    ResponseError::RequestTimedOut,
                    "data written but not yet confirmed on disk within timeout_ms",
                ),
                Ok(Err(DurabilityError::FsyncFailed)) => (
                    ResponseError::KafkaStorageError,
                    "fsync failed: the data may not be on disk; the partition is offline until restart",
                ),
                Ok(Err(DurabilityError::Closed)) => (
                    ResponseError::KafkaStorageError,
                    "the partition closed before the data was on disk",
                ),
            };
            metrics.error(ApiKey::Produce as i16, code.code());
            let pr = &mut resp.responses[w.topic].partition_responses[w.partition];
            pr.error_code = code.code();
            if version >= 8 {
                pr.error_message = msg(text);
            }
        }
        for r in replicated {
            let pr = &mut resp.responses[r.topic].partition_responses[r.partition];
            if pr.error_code != 0 {
                continue;
            }
            let Some((code, text)) = replication(&r, deadline).await else {
                continue;
            };
            metrics.error(ApiKey::Produce as i16, code.code());
            pr.error_code = code.code();
            if version >= 8 {
                pr.error_message = msg(text);
            }
        }
        resp
    }
}

/// Waits until every in-sync replica holds the batch (the high watermark passes it); the
/// error to answer with when that does not happen as acks=all requires.
async fn replication(
    r: &Replicated,
    deadline: tokio::time::Instant,
) -> Option<(ResponseError, &'static str)> {
    let mut hw = r.replica.watch_high_watermark();
    loop {
        hw.borrow_and_update();
        match r.replica.ack_state(r.leader_epoch, r.last_offset, r.min_isr) {
            Some(AckState::Done) => return None,
            Some(AckState::TooFewReplicas) => {
                return Some((
                    ResponseError::NotEnoughReplicasAfterAppend,
                    "written, but the in-sync replicas fell below min.insync.replicas before it was replicated",
                ))
            }
            Some(AckState::Pending) => {}
            None => {
                return Some((
                    ResponseError::NotLeaderOrFollower,
                    "leadership moved before the write was replicated; retry on the new leader",
                ))
            }
        }
        match tokio::time::timeout_at(deadline, hw.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                return Some((
                    ResponseError::NotLeaderOrFollower,
                    "the partition closed before the write was replicated",
                ))
            }
            Err(_) => {
                // A last look: leadership may have moved without the watermark moving.
                return match r
                    .replica
                    .ack_state(r.leader_epoch, r.last_offset, r.min_isr)
                {
                    Some(AckState::Done) => None,
                    None => Some((
                        ResponseError::NotLeaderOrFollower,
                        "leadership moved before the write was replicated; retry on the new leader",
                    )),
                    _ => Some((
                        ResponseError::RequestTimedOut,
                        "written, but not replicated to every in-sync replica within timeout_ms",
                    )),
                };
            }
        }
    }
}

type Outcome = Result<(Appended, i64, Option<i64>), (ResponseError, String)>;

/// Checks a batch's transaction before its append: its verification ticket, or the refusal.
type Verify<'a> =
    dyn FnMut(&Partition, &BatchHeader) -> Result<Option<u64>, (ResponseError, String)> + 'a;

/// Checks a batch's transaction before it is appended: `Ok(Some(ticket))` when it opens its
/// producer's transaction here and the coordinator confirmed the partition was added,
/// `Ok(None)` when nothing needs checking.
fn verify_txn(
    b: &Broker,
    verified: &Verified,
    txn_id: Option<&str>,
    t: &Topic,
    p: &Partition,
    h: &BatchHeader,
) -> Result<Option<u64>, (ResponseError, String)> {
    if h.is_control() {
        return Err((
            ResponseError::InvalidRecord,
            "control batches are written by the transaction coordinator, not by clients".into(),
        ));
    }
    if !h.is_transactional() {
        return Ok(None);
    }
    let Some(txn_id) = txn_id else {
        return Err((
            ResponseError::InvalidRecord,
            "a transactional batch needs the request's transactional id".into(),
        ));
    };
    if !h.has_producer_id() {
        return Err((
            ResponseError::InvalidRecord,
            "a transactional batch needs a producer id".into(),
        ));
    }
    if !p.needs_verification(h.producer_id) {
        return Ok(None);
    }
    let refused = |e: ResponseError| {
        // A produce tells a fenced producer by its epoch, as Kafka does.
        let e = if e == ResponseError::ProducerFenced {
            ResponseError::InvalidProducerEpoch
        } else {
            e
        };
        let why = match e {
            ResponseError::InvalidTxnState => format!(
                "partition {}-{} was not added to transaction {txn_id} (AddPartitionsToTxn first)",
                t.name, p.index
            ),
            e => format!("the transaction coordinator refused the batch: {e}"),
        };
        (e, why)
    };
    match verified {
        Verified::Here => {
            let ticket = p.begin_verification(h.producer_id);
            b.txns
                .verify(txn_id, h.producer_id, h.producer_epoch, &t.name, p.index)
                .map_err(refused)?;
            Ok(Some(ticket))
        }
        Verified::Asked(answers) => match answers.get(&(t.name.clone(), p.index)) {
            Some(Ok(ticket)) => Ok(Some(*ticket)),
            Some(Err(e)) => Err(refused(*e)),
            None => Err(refused(ResponseError::InvalidTxnState)),
        },
    }
}

/// Whether a produce carries a batch its topic's `compression.type` wants in another codec
/// (it is then recompressed before it is appended).
pub fn recompresses(b: &Broker, req: &ProduceRequest) -> bool {
    req.topic_data.iter().any(|td| {
        let topic = if td.name.is_empty() {
            b.topics.get_by_id(&td.topic_id)
        } else {
            b.topics.get(&td.name)
        };
        let Some(codec) = topic.and_then(|t| t.with_config(|c| c.compression())) else {
            return false;
        };
        td.partition_data.iter().any(|pd| {
            pd.records
                .as_ref()
                .and_then(|r| BatchHeader::parse(r).ok())
                .is_some_and(|h| batch::codec_of(&h) != Some(codec))
        })
    })
}

/// Whether every record of a validated batch has a key (read in place when uncompressed,
/// decompressed otherwise: only compacted topics ask).
fn every_record_has_a_key(h: &BatchHeader, records: &bytes::Bytes) -> bool {
    if h.compression() == 0 {
        return batch::records(records).is_some_and(|rs| rs.iter().all(|r| r.key.is_some()));
    }
    let mut buf = records.clone();
    spate_protocol::records::RecordBatchDecoder::decode(&mut buf)
        .is_ok_and(|set| set.records.iter().all(|r| r.key.is_some()))
}

fn append_one(
    t: &Topic,
    pd: PartitionProduceData,
    now_ms: i64,
    acks_all: bool,
    verify: &mut Verify<'_>,
    disk: &crate::disk::DiskSpace,
) -> Outcome {
    let p = t.lookup(pd.index).map_err(|e| {
        let why = if e == ResponseError::NotLeaderOrFollower {
            "has no replica on this broker"
        } else {
            "does not exist"
        };
        (e, format!("partition {} {why}", pd.index))
    })?;
    let Some(records) = pd.records else {
        return Err((ResponseError::InvalidRecord, "no records".into()));
    };
    let (max_bytes, log_append_time) =
        t.with_config(|c| (c.max_message_bytes(), c.log_append_time()));
    if records.len() > max_bytes {
        return Err((
            ResponseError::MessageTooLarge,
            format!(
                "batch of {} bytes exceeds max.message.bytes {max_bytes}",
                records.len()
            ),
        ));
    }
    let h = batch::validate(&records).map_err(|e| {
        let code = match e {
            BatchError::CrcMismatch { .. } => ResponseError::CorruptMessage,
            BatchError::UnsupportedMagic(_) => ResponseError::UnsupportedForMessageFormat,
            BatchError::TrailingBytes => ResponseError::InvalidRecord,
            _ => ResponseError::CorruptMessage,
        };
        (code, e.to_string())
    })?;
    if acks_all {
        let min_isr = t.with_config(|c| c.min_insync_replicas());
        if p.accepts_acks_all(min_isr) == Some(false) {
            return Err((
                ResponseError::NotEnoughReplicas,
                format!("fewer in-sync replicas than min.insync.replicas ({min_isr}); nothing was written"),
            ));
        }
    }
    if t.with_config(|c| c.compacted()) && !h.is_control() && !every_record_has_a_key(&h, &records)
    {
        // Kafka's answer and words: compaction keeps the latest record per key.
        return Err((
            ResponseError::InvalidRecord,
            format!(
                "Compacted topic cannot accept message without key in topic partition {}-{}.",
                t.name, pd.index
            ),
        ));
    }
    let (records, h) = match t.with_config(|c| c.compression()) {
        Some(codec) if !h.is_control() && batch::codec_of(&h) != Some(codec) => {
            let recoded = batch::recompress(&records, codec)
                .map_err(|e| (ResponseError::CorruptMessage, e.to_string()))?;
            let h = batch::validate(&recoded)
                .map_err(|e| (ResponseError::CorruptMessage, e.to_string()))?;
            if recoded.len() > max_bytes {
                return Err((
                    ResponseError::MessageTooLarge,
                    format!(
                        "batch of {} bytes once recompressed to the topic's compression.type exceeds max.message.bytes {max_bytes}",
                        recoded.len()
                    ),
                ));
            }
            (recoded, h)
        }
        _ => (records, h),
    };
    let ticket = verify(&p, &h)?;
    let append_time = log_append_time.then_some(now_ms);
    match p.append_verified(&records, &h, append_time, ticket) {
        Ok(a) => {
            if matches!(a, Appended::New { .. }) {
                t.metrics.bytes_in.add(records.len() as u64);
                t.metrics.records_in.add(h.records_count as u64);
                disk.charge(records.len());
            }
            Ok((a, p.log_start_offset(), append_time))
        }
        Err(AppendError::Refused(code)) => Err((code, code.to_string())),
        Err(AppendError::Storage(e)) if e.is_storage_full() => {
            // ENOSPC despite the watermark (it raced, or another process filled the disk):
            // nothing was kept and the partition stays online; refuse until space shows.
            disk.mark_enospc();
            Err((ResponseError::KafkaStorageError, disk.refusal()))
        }
        Err(AppendError::Storage(e)) => {
            tracing::error!(topic = %t.name, partition = p.index, error = %e, "append failed");
            Err((ResponseError::KafkaStorageError, e.to_string()))
        }
    }
}
