//! Transactions: InitProducerId with a transactional id, AddPartitionsToTxn, AddOffsetsToTxn,
//! EndTxn, TxnOffsetCommit, WriteTxnMarkers, and the admin APIs DescribeTransactions,
//! ListTransactions and DescribeProducers.
//!
//! Coordinator requests are decided on the blocking pool (a decision may reserve producer
//! ids, which fsyncs) and answered once the decision's record in `__transaction_state` is
//! committed.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use spate_groups::Committed;
use spate_protocol::batch::{ControlKind, ControlRecord};
use spate_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use spate_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use spate_protocol::messages::describe_transactions_response::{
    TopicData, TransactionState as DescribedTxn,
};
use spate_protocol::messages::list_transactions_response::TransactionState as ListedTxn;
use spate_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use spate_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use spate_protocol::messages::*;
use spate_protocol::{ResponseError, StrBytes};
use spate_txn::{TxnMeta, TxnStatus};

use super::msg;
use crate::groups::OFFSETS_LOG;
use crate::partition::Role;
use crate::transactions::{write_marker_here, Decided};
use crate::Broker;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// PRODUCER_FENCED exists for clients of these versions and later (KIP-588); older ones are
/// told INVALID_PRODUCER_EPOCH, which they treat the same way.
fn fenced_for(e: ResponseError, version: i16, first_with_fenced: i16) -> ResponseError {
    if e == ResponseError::ProducerFenced && version < first_with_fenced {
        ResponseError::InvalidProducerEpoch
    } else {
        e
    }
}

/// Runs a coordinator decision on the blocking pool, starts its markers (once its record is
/// committed) and waits for its record: the answer, or the error to answer with.
async fn decided<T: Send + 'static>(
    b: &Arc<Broker>,
    decide: impl FnOnce(&Arc<Broker>) -> Result<Decided<T>, ResponseError> + Send + 'static,
) -> Result<T, ResponseError> {
    let b2 = b.clone();
    let d = match tokio::task::spawn_blocking(move || decide(&b2)).await {
        Ok(d) => d?,
        Err(e) => {
            tracing::error!(error = %e, "a transaction decision failed");
            return Err(ResponseError::UnknownServerError);
        }
    };
    b.txns.after_commit(b, &d);
    b.txns.committed(&d.written).await?;
    Ok(d.answer)
}

/// InitProducerId with a transactional id.
pub fn init_producer_id(
    b: &Arc<Broker>,
    version: i16,
    req: InitProducerIdRequest,
) -> impl Future<Output = InitProducerIdResponse> + Send + 'static {
    let b = b.clone();
    async move {
        let mut resp = InitProducerIdResponse::default();
        resp.producer_id = (-1).into();
        resp.producer_epoch = -1;
        let txn_id = req
            .transactional_id
            .as_ref()
            .map(|t| t.to_string())
            .unwrap_or_default();
        let expected = (version >= 3 && req.producer_id.0 >= 0 && req.producer_epoch >= 0)
            .then_some((req.producer_id.0, req.producer_epoch));
        let timeout = req.transaction_timeout_ms;
        let answer = decided(&b, move |b| {
            if !b.topology().replicates() {
                b.txns.ensure_standalone(&b.topics).map_err(|e| {
                    tracing::error!(error = %e, "cannot create the transaction state topic");
                    ResponseError::CoordinatorNotAvailable
                })?;
            }
            b.txns.init_producer_id(b, &txn_id, timeout, expected)
        })
        .await
        .and_then(|a| a);
        match answer {
            Ok((pid, epoch)) => {
                resp.producer_id = pid.into();
                resp.producer_epoch = epoch;
            }
            Err(e) => resp.error_code = fenced_for(e, version, 4).code(),
        }
        resp
    }
}

/// AddPartitionsToTxn: v0-3 from producers (one transaction), v4+ batched from brokers, which
/// may only verify (KIP-890).
pub fn add_partitions(
    b: &Arc<Broker>,
    version: i16,
    req: AddPartitionsToTxnRequest,
) -> impl Future<Output = AddPartitionsToTxnResponse> + Send + 'static {
    let b = b.clone();
    async move {
        let txns: Vec<TxnAsk> = if version <= 3 {
            vec![TxnAsk {
                id: req.v3_and_below_transactional_id.to_string(),
                pid: req.v3_and_below_producer_id.0,
                epoch: req.v3_and_below_producer_epoch,
                verify_only: false,
                parts: flatten(&req.v3_and_below_topics),
            }]
        } else {
            req.transactions
                .iter()
                .map(|t| TxnAsk {
                    id: t.transactional_id.to_string(),
                    pid: t.producer_id.0,
                    epoch: t.producer_epoch,
                    verify_only: t.verify_only,
                    parts: flatten(&t.topics),
                })
                .collect()
        };
        let mut results = Vec::new();
        for t in txns {
            let errors = add_one(&b, version, &t).await;
            let mut r = AddPartitionsToTxnResult::default();
            r.transactional_id = TransactionalId(s(&t.id));
            r.topic_results = topic_results(&t.parts, &errors);
            results.push(r);
        }
        let mut resp = AddPartitionsToTxnResponse::default();
        if version <= 3 {
            resp.results_by_topic_v3_and_below =
                results.pop().map(|r| r.topic_results).unwrap_or_default();
        } else {
            resp.results_by_transaction = results;
        }
        resp
    }
}

/// One transaction of an AddPartitionsToTxn request.
struct TxnAsk {
    id: String,
    pid: i64,
    epoch: i16,
    verify_only: bool,
    parts: Vec<(String, i32)>,
}

fn flatten(
    topics: &[spate_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic],
) -> Vec<(String, i32)> {
    topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.name.to_string(), *p)))
        .collect()
}

/// One transaction's partitions: every partition gets the same error, except that partitions
/// of unknown topics are named UNKNOWN_TOPIC_OR_PARTITION and the others
/// OPERATION_NOT_ATTEMPTED, and nothing is added (as Kafka answers).
async fn add_one(b: &Arc<Broker>, version: i16, t: &TxnAsk) -> Vec<Option<ResponseError>> {
    let (txn_id, pid, epoch, parts) = (t.id.as_str(), t.pid, t.epoch, &t.parts);
    let unknown: Vec<bool> = parts
        .iter()
        .map(|(t, p)| {
            b.topics
                .get(t)
                .is_none_or(|topic| *p < 0 || *p >= topic.partition_count())
        })
        .collect();
    if unknown.iter().any(|u| *u) {
        return unknown
            .iter()
            .map(|u| {
                Some(if *u {
                    ResponseError::UnknownTopicOrPartition
                } else {
                    ResponseError::OperationNotAttempted
                })
            })
            .collect();
    }
    if t.verify_only {
        return parts
            .iter()
            .map(|(t, p)| b.txns.verify(txn_id, pid, epoch, t, *p).err())
            .collect();
    }
    let (id, list) = (txn_id.to_string(), parts.to_vec());
    let outcome = decided(b, move |b| b.txns.add_partitions(&id, pid, epoch, &list)).await;
    let e = outcome.err().map(|e| fenced_for(e, version, 2));
    parts.iter().map(|_| e).collect()
}

fn topic_results(
    parts: &[(String, i32)],
    errors: &[Option<ResponseError>],
) -> Vec<AddPartitionsToTxnTopicResult> {
    let mut by_topic: BTreeMap<&str, Vec<AddPartitionsToTxnPartitionResult>> = BTreeMap::new();
    for ((t, p), e) in parts.iter().zip(errors) {
        let mut r = AddPartitionsToTxnPartitionResult::default();
        r.partition_index = *p;
        r.partition_error_code = e.map_or(0, |e| e.code());
        by_topic.entry(t).or_default().push(r);
    }
    by_topic
        .into_iter()
        .map(|(t, results)| {
            let mut tr = AddPartitionsToTxnTopicResult::default();
            tr.name = TopicName(s(t));
            tr.results_by_partition = results;
            tr
        })
        .collect()
}

/// AddOffsetsToTxn: adds the group's `__consumer_offsets` partition to the transaction.
pub fn add_offsets(
    b: &Arc<Broker>,
    version: i16,
    req: AddOffsetsToTxnRequest,
) -> impl Future<Output = AddOffsetsToTxnResponse> + Send + 'static {
    let b = b.clone();
    async move {
        let mut resp = AddOffsetsToTxnResponse::default();
        let Some(index) = b.groups.partition_for(&req.group_id) else {
            resp.error_code = ResponseError::CoordinatorNotAvailable.code();
            return resp;
        };
        let txn_id = req.transactional_id.to_string();
        let (pid, epoch) = (req.producer_id.0, req.producer_epoch);
        let part = vec![(OFFSETS_LOG.to_string(), index as i32)];
        if let Err(e) = decided(&b, move |b| {
            b.txns.add_partitions(&txn_id, pid, epoch, &part)
        })
        .await
        {
            resp.error_code = fenced_for(e, version, 2).code();
        }
        resp
    }
}

/// EndTxn: answered once the prepare record is committed; the markers follow.
pub fn end_txn(
    b: &Arc<Broker>,
    version: i16,
    req: EndTxnRequest,
) -> impl Future<Output = EndTxnResponse> + Send + 'static {
    let b = b.clone();
    async move {
        let mut resp = EndTxnResponse::default();
        resp.producer_id = (-1).into();
        resp.producer_epoch = -1;
        let txn_id = req.transactional_id.to_string();
        let (pid, epoch, commit) = (req.producer_id.0, req.producer_epoch, req.committed);
        // v5 is transaction.version 2: every transaction ends under a new epoch.
        let bump = version >= 5;
        match decided(&b, move |b| {
            b.txns.end_txn(&txn_id, pid, epoch, commit, bump)
        })
        .await
        {
            Ok((pid, epoch)) => {
                resp.producer_id = pid.into();
                resp.producer_epoch = epoch;
            }
            Err(e) => resp.error_code = fenced_for(e, version, 2).code(),
        }
        resp
    }
}

/// TxnOffsetCommit: offsets written to the group's offsets partition inside the transaction;
/// they become the group's when it commits.
pub fn txn_offset_commit(
    b: &Arc<Broker>,
    version: i16,
    req: TxnOffsetCommitRequest,
) -> impl Future<Output = TxnOffsetCommitResponse> + Send + 'static {
    let b = b.clone();
    let group = req.group_id.to_string();
    let txn_id = req.transactional_id.to_string();
    let (pid, epoch) = (req.producer_id.0, req.producer_epoch);
    let now = b.clock.now_ms();
    let entries: Vec<(String, i32, Option<Committed>)> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                (
                    t.name.to_string(),
                    p.partition_index,
                    Some(Committed {
                        offset: p.committed_offset,
                        leader_epoch: if version >= 2 {
                            p.committed_leader_epoch
                        } else {
                            -1
                        },
                        metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                        commit_timestamp_ms: now,
                    }),
                )
            })
        })
        .collect();
    async move {
        // v5 is transaction.version 2: the group's offsets partition is added to the
        // transaction here, on the producer's behalf (the client sends no AddOffsetsToTxn).
        let added = if version >= 5 {
            match b.groups.partition_for(&group) {
                None => Err(ResponseError::CoordinatorNotAvailable),
                Some(index) => {
                    let ask = [(OFFSETS_LOG.to_string(), index as i32, pid, epoch)];
                    match crate::transactions::add_on_behalf(&b, &txn_id, &ask).await {
                        Ok(errors) => match errors.into_values().flatten().next() {
                            Some(e) => Err(e),
                            None => Ok(()),
                        },
                        Err(e) => Err(e),
                    }
                }
            }
        } else {
            Ok(())
        };
        let written = added
            .and_then(|()| txn_offset_check(&b, &group, &txn_id, pid, epoch))
            .and_then(|()| {
                if entries.is_empty() {
                    return Err(ResponseError::InvalidRequest);
                }
                b.groups.write_txn(&group, pid, epoch, &entries)
            });
        let error = match written {
            Err(e) => Some(e),
            Ok(w) => b.groups.durable(&w).await.err(),
        };
        // Offset commits tell a fenced producer by its epoch, as Kafka does.
        let error = error.map(|e| {
            if e == ResponseError::ProducerFenced {
                ResponseError::InvalidProducerEpoch
            } else {
                e
            }
        });
        let code = error.map_or(0, |e| e.code());
        let mut resp = TxnOffsetCommitResponse::default();
        for t in req.topics {
            let mut tr = TxnOffsetCommitResponseTopic::default();
            tr.name = t.name;
            tr.partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let mut pr = TxnOffsetCommitResponsePartition::default();
                    pr.partition_index = p.partition_index;
                    pr.error_code = code;
                    pr
                })
                .collect();
            resp.topics.push(tr);
        }
        resp
    }
}

/// Whether this node may take the transaction's offset commit for `group`: it coordinates the
/// group, and (when it also coordinates the transaction) the group's offsets partition was
/// added with AddOffsetsToTxn by this very producer.
fn txn_offset_check(
    b: &Broker,
    group: &str,
    txn_id: &str,
    pid: i64,
    epoch: i16,
) -> Result<(), ResponseError> {
    if group.is_empty() {
        return Err(ResponseError::InvalidGroupId);
    }
    if !b.groups.is_coordinator(group) {
        return Err(ResponseError::NotCoordinator);
    }
    let index = b
        .groups
        .partition_for(group)
        .ok_or(ResponseError::CoordinatorNotAvailable)?;
    if b.txns.is_coordinator(txn_id) {
        b.txns
            .verify(txn_id, pid, epoch, OFFSETS_LOG, index as i32)
            .map_err(|e| match e {
                // Not added: the client skipped AddOffsetsToTxn or its transaction ended.
                ResponseError::InvalidTxnState => ResponseError::InvalidTxnState,
                ResponseError::InvalidProducerIdMapping => ResponseError::InvalidProducerIdMapping,
                _ => ResponseError::InvalidProducerEpoch,
            })?;
    }
    Ok(())
}

/// WriteTxnMarkers: the coordinator's (or an admin's abort) markers for partitions this node
/// leads.
pub fn write_txn_markers(
    b: &Arc<Broker>,
    req: WriteTxnMarkersRequest,
) -> impl Future<Output = WriteTxnMarkersResponse> + Send + 'static {
    let b = b.clone();
    async move {
        let mut resp = WriteTxnMarkersResponse::default();
        for m in req.markers {
            let marker = ControlRecord {
                kind: if m.transaction_result {
                    ControlKind::Commit
                } else {
                    ControlKind::Abort
                },
                coordinator_epoch: m.coordinator_epoch,
            };
            let mut r = WritableTxnMarkerResult::default();
            r.producer_id = m.producer_id;
            for t in m.topics {
                let writes = t.partition_indexes.iter().map(|p| {
                    let b = b.clone();
                    let topic = t.name.to_string();
                    let p = *p;
                    async move {
                        let e = write_marker_here(
                            &b,
                            &topic,
                            p,
                            m.producer_id.0,
                            m.producer_epoch,
                            marker,
                        )
                        .await
                        .err();
                        let mut pr = WritableTxnMarkerPartitionResult::default();
                        pr.partition_index = p;
                        pr.error_code = e.map_or(0, |e| e.code());
                        pr
                    }
                });
                let mut tr = WritableTxnMarkerTopicResult::default();
                tr.partitions = futures::future::join_all(writes).await;
                tr.name = t.name;
                r.topics.push(tr);
            }
            resp.markers.push(r);
        }
        resp
    }
}

/// DescribeTransactions: the state of ids this node coordinates.
pub fn describe_transactions(
    b: &Broker,
    req: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let mut resp = DescribeTransactionsResponse::default();
    for id in req.transactional_ids {
        let mut st = DescribedTxn::default();
        st.producer_id = (-1).into();
        st.producer_epoch = -1;
        st.transaction_start_time_ms = -1;
        match b.txns.describe(&id) {
            Err(e) => st.error_code = e.code(),
            Ok(None) => st.error_code = ResponseError::TransactionalIdNotFound.code(),
            Ok(Some(m)) => fill_described(&mut st, &m),
        }
        st.transactional_id = id;
        resp.transaction_states.push(st);
    }
    resp
}

fn fill_described(st: &mut DescribedTxn, m: &TxnMeta) {
    st.transaction_state = s(m.status.name());
    st.transaction_timeout_ms = m.timeout_ms;
    st.transaction_start_time_ms = m.start_ms;
    st.producer_id = m.producer_id.into();
    st.producer_epoch = m.producer_epoch;
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in &m.partitions {
        by_topic.entry(t).or_default().push(*p);
    }
    st.topics = by_topic
        .into_iter()
        .map(|(t, ps)| {
            let mut d = TopicData::default();
            d.topic = TopicName(s(t));
            d.partitions = ps;
            d
        })
        .collect();
}

/// ListTransactions: the ids this node coordinates, filtered by state, producer id, duration
/// (v1) and id pattern (v2).
pub fn list_transactions(
    b: &Broker,
    version: i16,
    req: ListTransactionsRequest,
) -> ListTransactionsResponse {
    let mut resp = ListTransactionsResponse::default();
    let known = [
        TxnStatus::Empty,
        TxnStatus::Ongoing,
        TxnStatus::PrepareCommit,
        TxnStatus::PrepareAbort,
        TxnStatus::CompleteCommit,
        TxnStatus::CompleteAbort,
        TxnStatus::Dead,
        TxnStatus::PrepareEpochFence,
    ];
    let mut states = Vec::new();
    for f in &req.state_filters {
        match known.iter().find(|k| k.name() == f.as_str()) {
            Some(k) => states.push(*k),
            None => resp.unknown_state_filters.push(f.clone()),
        }
    }
    let pattern = match req
        .transactional_id_pattern
        .as_ref()
        .filter(|_| version >= 2)
    {
        Some(p) if !p.is_empty() => match regex::Regex::new(&format!("^(?:{})$", p.as_str())) {
            Ok(r) => Some(r),
            Err(_) => {
                resp.error_code = ResponseError::InvalidRegularExpression.code();
                return resp;
            }
        },
        _ => None,
    };
    let now = b.clock.now_ms();
    for (id, m) in b.txns.list() {
        let state_ok = states.is_empty() || states.contains(&m.status);
        let pid_ok = req.producer_id_filters.is_empty()
            || req.producer_id_filters.contains(&m.producer_id.into());
        // A duration filter lists transactions open at least that long.
        let duration_ok = version < 1
            || req.duration_filter < 0
            || m.open_for_ms(now)
                .is_some_and(|age| age >= req.duration_filter);
        let pattern_ok = pattern.as_ref().is_none_or(|r| r.is_match(&id));
        if state_ok && pid_ok && duration_ok && pattern_ok {
            let mut t = ListedTxn::default();
            t.transactional_id = TransactionalId(s(&id));
            t.producer_id = m.producer_id.into();
            t.transaction_state = s(m.status.name());
            resp.transaction_states.push(t);
        }
    }
    resp
}

/// DescribeProducers: the producers each partition this node leads remembers, with their
/// open transaction's first offset (what `kafka-transactions find-hanging` and `abort` read).
pub fn describe_producers(b: &Broker, req: DescribeProducersRequest) -> DescribeProducersResponse {
    let mut resp = DescribeProducersResponse::default();
    for t in req.topics {
        let topic = b.topics.get(&t.name);
        let mut tr = TopicResponse::default();
        for index in t.partition_indexes {
            let mut pr = PartitionResponse::default();
            pr.partition_index = index;
            let partition = topic
                .as_ref()
                .ok_or(ResponseError::UnknownTopicOrPartition)
                .and_then(|t| t.lookup(index))
                .and_then(|p| {
                    if p.role() == Role::Follower {
                        Err(ResponseError::NotLeaderOrFollower)
                    } else {
                        Ok(p)
                    }
                });
            match partition {
                Err(e) => {
                    pr.error_code = e.code();
                    pr.error_message = msg(e.to_string());
                }
                Ok(p) => {
                    pr.active_producers = p
                        .producer_views()
                        .into_iter()
                        .map(|v| {
                            let mut ps = ProducerState::default();
                            ps.producer_id = v.producer_id.into();
                            ps.producer_epoch = i32::from(v.epoch);
                            ps.last_sequence = v.last_sequence;
                            ps.last_timestamp = v.last_timestamp;
                            ps.coordinator_epoch = v.coordinator_epoch;
                            ps.current_txn_start_offset = v.txn_start_offset;
                            ps
                        })
                        .collect();
                }
            }
            tr.partitions.push(pr);
        }
        tr.name = t.name;
        resp.topics.push(tr);
    }
    resp
}
