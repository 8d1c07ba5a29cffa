//! Transactions across the cluster: markers written to partitions other nodes lead, and
//! KIP-890 verification asked of a transaction coordinator on another node.

use std::sync::Arc;
use std::time::Duration;

use spate_protocol::ResponseError;

use super::{Cluster, PeerPool};
use crate::Broker;

/// Writes a transaction marker to a partition of the cluster: here when this node leads it,
/// otherwise as WriteTxnMarkers to its leader. Retriable errors come back for the caller to
/// try again (the leader moved, or cannot be reached).
pub(crate) async fn write_marker(
    b: &Arc<Broker>,
    c: &Arc<Cluster>,
    topic: &str,
    partition: i32,
    producer_id: i64,
    producer_epoch: i16,
    marker: spate_protocol::batch::ControlRecord,
) -> Result<(), ResponseError> {
    use spate_protocol::messages::write_txn_markers_request::{
        WritableTxnMarker, WritableTxnMarkerTopic,
    };
    use spate_protocol::messages::{ApiKey, WriteTxnMarkersRequest, WriteTxnMarkersResponse};
    let image = c.image();
    if image.topic(topic).is_none() {
        return Err(ResponseError::UnknownTopicOrPartition);
    }
    let leader = image
        .partition(topic, partition)
        .ok_or(ResponseError::UnknownTopicOrPartition)?
        .leader
        .ok_or(ResponseError::LeaderNotAvailable)?;
    if leader == c.broker_id() {
        return crate::transactions::write_marker_here(
            b,
            topic,
            partition,
            producer_id,
            producer_epoch,
            marker,
        )
        .await;
    }
    let addr = image
        .broker(leader)
        .filter(|r| !r.fenced)
        .map(|r| r.inter_node_addr.clone())
        .ok_or(ResponseError::LeaderNotAvailable)?;
    let mut t = WritableTxnMarkerTopic::default();
    t.name = spate_protocol::messages::TopicName(spate_protocol::StrBytes::from_string(
        topic.to_string(),
    ));
    t.partition_indexes = vec![partition];
    let mut m = WritableTxnMarker::default();
    m.producer_id = producer_id.into();
    m.producer_epoch = producer_epoch;
    m.transaction_result = marker.kind == spate_protocol::batch::ControlKind::Commit;
    m.coordinator_epoch = marker.coordinator_epoch;
    m.topics = vec![t];
    let mut req = WriteTxnMarkersRequest::default();
    req.markers = vec![m];
    let mut conn = c
        .txn_peers
        .connection(c.transport(), &addr, Duration::from_secs(3))
        .await
        .map_err(|_| ResponseError::NetworkException)?;
    let resp: WriteTxnMarkersResponse = conn
        .call(ApiKey::WriteTxnMarkers, 1, &req, Duration::from_secs(30))
        .await
        .map_err(|_| ResponseError::NetworkException)?;
    c.txn_peers.put_back(conn);
    let code = resp
        .markers
        .first()
        .and_then(|m| m.topics.first())
        .and_then(|t| t.partitions.first())
        .map_or(ResponseError::UnknownServerError.code(), |p| p.error_code);
    match ResponseError::try_from_code(code) {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// Asks the transaction coordinator at `addr` (AddPartitionsToTxn v5, as Kafka's brokers do)
/// whether each (topic, partition, producer id, epoch) is part of `txn_id`'s open
/// transaction (`verify_only`), or to add it (transaction.version 2): each partition's
/// refusal, `None` when it is in. An unreachable coordinator is one error for all.
/// Asks the coordinator of `txn_id` (another node) about its partitions over the cluster's
/// pooled connections: see [`ask_txn_partitions`].
pub(crate) async fn ask_coordinator(
    c: &Arc<Cluster>,
    txn_id: &str,
    asks: &[(String, i32, i64, i16)],
    verify_only: bool,
) -> Result<std::collections::HashMap<(String, i32), Option<ResponseError>>, ResponseError> {
    let (id, _, _) = c
        .txn_coordinator(txn_id)
        .ok_or(ResponseError::CoordinatorNotAvailable)?;
    let addr = c
        .node_addr(id)
        .ok_or(ResponseError::CoordinatorNotAvailable)?;
    ask_txn_partitions(
        &c.txn_peers,
        c.transport(),
        &addr,
        txn_id,
        asks,
        verify_only,
    )
    .await
}

async fn ask_txn_partitions(
    peers: &PeerPool,
    transport: &spate_cluster::transport::Transport,
    addr: &str,
    txn_id: &str,
    asks: &[(String, i32, i64, i16)],
    verify_only: bool,
) -> Result<std::collections::HashMap<(String, i32), Option<ResponseError>>, ResponseError> {
    use spate_protocol::messages::add_partitions_to_txn_request::{
        AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
    };
    use spate_protocol::messages::{
        AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ApiKey, TopicName, TransactionalId,
    };
    use spate_protocol::StrBytes;
    let Some(&(_, _, pid, epoch)) = asks.first() else {
        return Ok(Default::default());
    };
    let mut topics: Vec<AddPartitionsToTxnTopic> = Vec::new();
    for (topic, index, _, _) in asks {
        match topics.iter_mut().find(|t| t.name.as_str() == topic) {
            Some(t) => t.partitions.push(*index),
            None => {
                let mut t = AddPartitionsToTxnTopic::default();
                t.name = TopicName(StrBytes::from_string(topic.clone()));
                t.partitions = vec![*index];
                topics.push(t);
            }
        }
    }
    let mut txn = AddPartitionsToTxnTransaction::default();
    txn.transactional_id = TransactionalId(StrBytes::from_string(txn_id.to_string()));
    txn.producer_id = pid.into();
    txn.producer_epoch = epoch;
    txn.verify_only = verify_only;
    txn.topics = topics;
    let mut req = AddPartitionsToTxnRequest::default();
    req.transactions = vec![txn];
    let mut conn = peers
        .connection(transport, addr, Duration::from_secs(3))
        .await
        .map_err(|_| ResponseError::CoordinatorNotAvailable)?;
    let resp: AddPartitionsToTxnResponse = conn
        .call(ApiKey::AddPartitionsToTxn, 5, &req, Duration::from_secs(10))
        .await
        .map_err(|_| ResponseError::CoordinatorNotAvailable)?;
    peers.put_back(conn);
    if let Some(e) = ResponseError::try_from_code(resp.error_code) {
        return Err(e);
    }
    let mut out = std::collections::HashMap::new();
    for r in resp.results_by_transaction {
        for t in r.topic_results {
            for p in t.results_by_partition {
                out.insert(
                    (t.name.to_string(), p.partition_index),
                    ResponseError::try_from_code(p.partition_error_code),
                );
            }
        }
    }
    Ok(out)
}
