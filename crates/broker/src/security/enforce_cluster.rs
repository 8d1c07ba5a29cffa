//! ACLs on the requests brokers send each other and on the cluster-wide admin requests that
//! name partitions or quota entities: how a refusal shows in each answer (Kafka's table:
//! WriteTxnMarkers and replica OffsetForLeaderEpoch need ClusterAction, a consumer's
//! OffsetForLeaderEpoch Describe on the topic, AlterReplicaLogDirs Alter on the cluster,
//! AlterClientQuotas AlterConfigs on the cluster, OffsetCommit Read on each topic).
//! Nodes of the cluster reach each other as internal sessions, which these never refuse.

use spate_auth::acl::{Operation, ResourceType};
use spate_protocol::messages::alter_client_quotas_response::{EntityData, EntryData};
use spate_protocol::messages::alter_replica_log_dirs_response::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult,
};
use spate_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use spate_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use spate_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use spate_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, AlterReplicaLogDirsRequest,
    AlterReplicaLogDirsResponse, OffsetCommitRequest, OffsetCommitResponse,
    OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
};
use spate_protocol::ResponseError;

use super::Session;
use crate::Broker;

const CLUSTER_DENIED: ResponseError = ResponseError::ClusterAuthorizationFailed;

/// WriteTxnMarkers without ClusterAction: every partition CLUSTER_AUTHORIZATION_FAILED.
pub fn write_txn_markers_refused(req: &WriteTxnMarkersRequest) -> WriteTxnMarkersResponse {
    let mut resp = WriteTxnMarkersResponse::default();
    for m in &req.markers {
        let mut mr = WritableTxnMarkerResult::default();
        mr.producer_id = m.producer_id;
        for t in &m.topics {
            let mut tr = WritableTxnMarkerTopicResult::default();
            tr.name = t.name.clone();
            for p in &t.partition_indexes {
                let mut pr = WritableTxnMarkerPartitionResult::default();
                pr.partition_index = *p;
                pr.error_code = CLUSTER_DENIED.code();
                tr.partitions.push(pr);
            }
            mr.topics.push(tr);
        }
        resp.markers.push(mr);
    }
    resp
}

/// AlterReplicaLogDirs without Alter on the cluster: every partition refused.
pub fn alter_replica_log_dirs_refused(
    req: &AlterReplicaLogDirsRequest,
) -> AlterReplicaLogDirsResponse {
    let mut resp = AlterReplicaLogDirsResponse::default();
    for t in req.dirs.iter().flat_map(|d| &d.topics) {
        let mut tr = AlterReplicaLogDirTopicResult::default();
        tr.topic_name = t.name.clone();
        for p in &t.partitions {
            let mut pr = AlterReplicaLogDirPartitionResult::default();
            pr.partition_index = *p;
            pr.error_code = CLUSTER_DENIED.code();
            tr.partitions.push(pr);
        }
        resp.results.push(tr);
    }
    resp
}

/// AlterClientQuotas without AlterConfigs on the cluster: every entry refused.
pub fn alter_client_quotas_refused(req: &AlterClientQuotasRequest) -> AlterClientQuotasResponse {
    let mut resp = AlterClientQuotasResponse::default();
    for e in &req.entries {
        let mut er = EntryData::default();
        er.error_code = CLUSTER_DENIED.code();
        er.error_message = Some("AlterConfigs on the cluster is needed to alter quotas".into());
        er.entity = e
            .entity
            .iter()
            .map(|d| {
                let mut ed = EntityData::default();
                ed.entity_type = d.entity_type.clone();
                ed.entity_name = d.entity_name.clone();
                ed
            })
            .collect();
        resp.entries.push(er);
    }
    resp
}

/// OffsetForLeaderEpoch: a replica's needs ClusterAction (every partition refused without
/// it); a consumer's needs Describe on each topic (denied topics are taken out of the
/// request and returned, to be answered TOPIC_AUTHORIZATION_FAILED).
pub fn offset_for_leader_epoch_request(
    b: &Broker,
    who: Option<&Session>,
    req: &mut OffsetForLeaderEpochRequest,
) -> Vec<OffsetForLeaderTopicResult> {
    let (op, rt, code) = if req.replica_id.0 >= 0 {
        (
            Operation::ClusterAction,
            ResourceType::Cluster,
            CLUSTER_DENIED,
        )
    } else {
        (
            Operation::Describe,
            ResourceType::Topic,
            ResponseError::TopicAuthorizationFailed,
        )
    };
    let mut denied = Vec::new();
    req.topics.retain(|t| {
        let name = if rt == ResourceType::Cluster {
            spate_auth::acl::CLUSTER_NAME
        } else {
            t.topic.as_str()
        };
        if b.authorizer.allows(who, op, rt, name) {
            return true;
        }
        let mut tr = OffsetForLeaderTopicResult::default();
        tr.topic = t.topic.clone();
        for p in &t.partitions {
            let mut e = EpochEndOffset::default();
            e.partition = p.partition;
            e.error_code = code.code();
            e.leader_epoch = -1;
            e.end_offset = -1;
            tr.partitions.push(e);
        }
        denied.push(tr);
        false
    });
    denied
}

/// Puts the refused topics of [`offset_for_leader_epoch_request`] back into the answer.
pub fn offset_for_leader_epoch_response(
    denied: Vec<OffsetForLeaderTopicResult>,
    resp: &mut OffsetForLeaderEpochResponse,
) {
    resp.topics.extend(denied);
}

/// OffsetCommit: Read on each topic (the group was checked before); denied topics are taken
/// out of the request and returned with every partition TOPIC_AUTHORIZATION_FAILED.
pub fn offset_commit_request(
    b: &Broker,
    who: Option<&Session>,
    req: &mut OffsetCommitRequest,
) -> Vec<OffsetCommitResponseTopic> {
    let mut denied = Vec::new();
    req.topics.retain(|t| {
        if b.authorizer
            .allows(who, Operation::Read, ResourceType::Topic, t.name.as_str())
        {
            return true;
        }
        let mut tr = OffsetCommitResponseTopic::default();
        tr.name = t.name.clone();
        tr.topic_id = t.topic_id;
        for p in &t.partitions {
            let mut pr = OffsetCommitResponsePartition::default();
            pr.partition_index = p.partition_index;
            pr.error_code = ResponseError::TopicAuthorizationFailed.code();
            tr.partitions.push(pr);
        }
        denied.push(tr);
        false
    });
    denied
}

/// Puts the refused topics of [`offset_commit_request`] back into the answer.
pub fn offset_commit_response(
    denied: Vec<OffsetCommitResponseTopic>,
    resp: &mut OffsetCommitResponse,
) {
    resp.topics.extend(denied);
}
