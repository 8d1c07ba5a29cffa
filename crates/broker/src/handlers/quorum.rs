//! DescribeQuorum: the metadata quorum's voters and observers with how far each has the
//! metadata log, as `kafka-metadata-quorum describe --status` and `--replication` show them.
//!
//! Only the quorum's leader knows every member's progress; another node forwards the request
//! there over a Kafka connection, as a Kafka broker forwards it to the active controller.

use std::sync::Arc;
use std::time::Duration;

use spate_protocol::messages::describe_quorum_response::{
    Listener, Node, PartitionData, ReplicaState, TopicData,
};
use spate_protocol::messages::{
    ApiKey, BrokerId, DescribeQuorumRequest, DescribeQuorumResponse, TopicName,
};
use spate_protocol::ResponseError;
use spate_protocol::StrBytes;

use crate::cluster::{Cluster, PeerConnection};
use crate::Broker;

/// The name Kafka gives the metadata log's topic.
const METADATA_TOPIC: &str = "__cluster_metadata";

/// How long a forwarded DescribeQuorum may take on the leader.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

/// Answers DescribeQuorum.
pub async fn describe(
    b: Arc<Broker>,
    version: i16,
    req: DescribeQuorumRequest,
) -> DescribeQuorumResponse {
    let Some(cluster) = b.topology().cluster().cloned() else {
        return standalone(&b, version);
    };
    if cluster.node().is_leader() {
        return on_leader(&cluster, version).await;
    }
    match forward(&cluster, version, &req).await {
        Ok(resp) => resp,
        Err(why) => {
            tracing::debug!(reason = %why, "DescribeQuorum not forwarded to the quorum leader");
            partition_error(ResponseError::NotLeaderOrFollower, why)
        }
    }
}

/// A standalone broker is its own quorum of one, with no metadata log.
fn standalone(b: &Broker, version: i16) -> DescribeQuorumResponse {
    let id = b.config.node_id;
    let mut p = PartitionData::default();
    p.leader_id = BrokerId(id);
    p.high_watermark = 0;
    p.current_voters = vec![replica(id, 0, -1, -1)];
    let mut resp = response(p);
    if version >= 2 {
        resp.nodes = vec![node_entry(
            id,
            &b.config.advertised_host,
            b.config.advertised_port,
        )];
    }
    resp
}

async fn on_leader(cluster: &Cluster, version: i16) -> DescribeQuorumResponse {
    let node = cluster.node();
    let quorum = node.metrics().await;
    let m = node.raft_metrics().borrow().clone();
    let now = crate::time::now_ms();
    // Raft indexes count from 0 and name the last entry; Kafka's offsets name the next one.
    let end_of = |index: Option<u64>| index.map_or(0, |i| i64::try_from(i).unwrap_or(i64::MAX) + 1);
    let leader_end = end_of(quorum.last_log_index);
    let members = node.members();
    let progress = |id: u64| -> ReplicaState {
        if id == node.node_id() {
            return replica(id as i32, leader_end, now, now);
        }
        let matched = m
            .replication
            .as_ref()
            .and_then(|r| r.get(&id))
            .map(|log_id| end_of(log_id.map(|l| l.index)));
        match matched {
            // Acknowledged in the current term: it fetched recently; caught up when it
            // holds the leader's whole log.
            Some(end) => {
                let caught_up = if end >= leader_end { now } else { -1 };
                replica(id as i32, end, now, caught_up)
            }
            None => replica(id as i32, -1, -1, -1),
        }
    };
    let mut p = PartitionData::default();
    p.leader_id = BrokerId(i32::try_from(node.node_id()).unwrap_or(-1));
    p.leader_epoch = i32::try_from(quorum.term).unwrap_or(i32::MAX);
    p.high_watermark = end_of(quorum.commit_index);
    p.current_voters = members.voters.iter().map(|&id| progress(id)).collect();
    p.observers = members
        .nodes
        .keys()
        .filter(|id| !members.voters.contains(id))
        .map(|&id| progress(id))
        .collect();
    let mut resp = response(p);
    if version >= 2 {
        let image = cluster.image();
        resp.nodes = members
            .nodes
            .keys()
            .filter_map(|&id| {
                let reg = image.broker(i32::try_from(id).ok()?)?;
                Some(node_entry(
                    reg.id,
                    &reg.kafka_host,
                    i32::from(reg.kafka_port),
                ))
            })
            .collect();
    }
    resp
}

async fn forward(
    cluster: &Cluster,
    version: i16,
    req: &DescribeQuorumRequest,
) -> Result<DescribeQuorumResponse, String> {
    let leader = cluster
        .controller_id()
        .ok_or_else(|| "no metadata quorum leader is known".to_owned())?;
    let reg = cluster
        .image()
        .broker(leader)
        .cloned()
        .ok_or_else(|| format!("the quorum leader {leader} has no broker registration"))?;
    let mut conn = PeerConnection::connect(
        cluster.transport(),
        &reg.inter_node_addr,
        "spate-describe-quorum".into(),
        FORWARD_TIMEOUT,
    )
    .await
    .map_err(|e| e.to_string())?;
    conn.call(ApiKey::DescribeQuorum, version, req, FORWARD_TIMEOUT)
        .await
        .map_err(|e| e.to_string())
}

fn response(mut p: PartitionData) -> DescribeQuorumResponse {
    p.partition_index = 0;
    let mut t = TopicData::default();
    t.topic_name = TopicName(StrBytes::from_static_str(METADATA_TOPIC));
    t.partitions = vec![p];
    let mut resp = DescribeQuorumResponse::default();
    resp.topics = vec![t];
    resp
}

fn partition_error(e: ResponseError, message: String) -> DescribeQuorumResponse {
    let mut p = PartitionData::default();
    p.error_code = e.code();
    p.error_message = Some(StrBytes::from_string(message));
    p.leader_id = BrokerId(-1);
    p.leader_epoch = -1;
    p.high_watermark = -1;
    response(p)
}

fn replica(id: i32, log_end_offset: i64, last_fetch: i64, last_caught_up: i64) -> ReplicaState {
    let mut r = ReplicaState::default();
    r.replica_id = BrokerId(id);
    r.log_end_offset = log_end_offset;
    r.last_fetch_timestamp = last_fetch;
    r.last_caught_up_timestamp = last_caught_up;
    r
}

fn node_entry(id: i32, host: &str, port: i32) -> Node {
    let mut l = Listener::default();
    l.name = StrBytes::from_static_str("PLAINTEXT");
    l.host = StrBytes::from_string(host.to_owned());
    l.port = u16::try_from(port).unwrap_or(0);
    let mut n = Node::default();
    n.node_id = BrokerId(id);
    n.listeners = vec![l];
    n
}
