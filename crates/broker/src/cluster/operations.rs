//! Cluster operations over the Kafka API: AlterPartitionReassignments,
//! ListPartitionReassignments and ElectLeaders (what `kafka-reassign-partitions.sh` and
//! `kafka-leader-election.sh` send), plus changing dynamic broker configs. Each change is one
//! command through the quorum; the answer comes from its outcome.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use spate_cluster::metadata::{CommandError, MetadataCommand};
use spate_cluster::node::ProposeError;
use spate_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use spate_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use spate_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use spate_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId,
    ElectLeadersRequest, ElectLeadersResponse, ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse, TopicName,
};
use spate_protocol::{ResponseError, StrBytes};

use super::Cluster;
use crate::handlers::msg;
use crate::Broker;

/// ElectLeaders election types.
const PREFERRED: i8 = 0;
const UNCLEAN: i8 = 1;

fn code_of(e: &ProposeError) -> (i16, Option<StrBytes>) {
    (e.kafka_error_code(), msg(e.to_string()))
}

/// An empty answer to `req`, echoing whether it allowed replication factor changes (v1+).
fn reassignment_response(
    version: i16,
    req: &AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    let mut resp = AlterPartitionReassignmentsResponse::default();
    if version >= 1 {
        resp.allow_replication_factor_change = req.allow_replication_factor_change;
    }
    resp
}

/// AlterPartitionReassignments: start, replace or cancel (null replicas) each partition's move.
pub async fn alter_reassignments(
    cluster: Arc<Cluster>,
    version: i16,
    req: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    let mut resp = reassignment_response(version, &req);
    // Kafka refuses to change the replication factor unless asked (v1); v0 always allowed it.
    let allow_rf_change = version == 0 || req.allow_replication_factor_change;
    for t in req.topics {
        let mut tr = ReassignableTopicResponse::default();
        tr.name = t.name.clone();
        for p in t.partitions {
            let mut pr = ReassignablePartitionResponse::default();
            pr.partition_index = p.partition_index;
            let target: Option<Vec<i32>> =
                p.replicas.map(|r| r.into_iter().map(|id| id.0).collect());
            let image = cluster.image();
            let rf_change = match (&target, image.partition(&t.name, p.partition_index)) {
                (Some(target), Some(state)) => target.len() != state.target_replicas().len(),
                _ => false,
            };
            if rf_change && !allow_rf_change {
                pr.error_code = ResponseError::InvalidReplicationFactor.code();
                pr.error_message = msg(format!(
                    "{}-{}: the new replica list changes the replication factor; set allowReplicationFactorChange to do that",
                    t.name.as_str(),
                    p.partition_index
                ));
                tr.partitions.push(pr);
                continue;
            }
            let cmd = MetadataCommand::AlterReassignment {
                topic: t.name.to_string(),
                partition: p.partition_index,
                target,
            };
            if let Err(e) = cluster.propose(cmd).await {
                (pr.error_code, pr.error_message) = code_of(&e);
            }
            tr.partitions.push(pr);
        }
        resp.responses.push(tr);
    }
    resp
}

/// AlterPartitionReassignments on a standalone broker, which holds the only replica of each
/// partition: moving it anywhere else is refused, and "moving" it onto itself is already done.
pub fn standalone_reassignments(
    b: &Broker,
    version: i16,
    req: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    let mut resp = reassignment_response(version, &req);
    resp.responses = req
        .topics
        .into_iter()
        .map(|t| standalone_reassignment(b, t))
        .collect();
    resp
}

fn standalone_reassignment(
    b: &Broker,
    t: spate_protocol::messages::alter_partition_reassignments_request::ReassignableTopic,
) -> ReassignableTopicResponse {
    let topic = b.topics.get(t.name.as_str());
    let mut tr = ReassignableTopicResponse::default();
    for p in t.partitions {
        let mut pr = ReassignablePartitionResponse::default();
        pr.partition_index = p.partition_index;
        let refusal = match (&topic, &p.replicas) {
            (Some(t), _) if !t.has_partition(p.partition_index) => Some((
                ResponseError::UnknownTopicOrPartition,
                "no such partition".to_owned(),
            )),
            (None, _) => Some((
                ResponseError::UnknownTopicOrPartition,
                "no such topic".to_owned(),
            )),
            (_, None) => Some((
                ResponseError::NoReassignmentInProgress,
                "no reassignment is in progress".to_owned(),
            )),
            (_, Some(r)) if r.len() == 1 && r[0].0 == b.config.node_id => None,
            (_, Some(_)) => Some((
                ResponseError::InvalidReplicaAssignment,
                format!(
                    "a standalone broker holds the only replica (broker {}); start spate in cluster mode to move partitions",
                    b.config.node_id
                ),
            )),
        };
        if let Some((code, message)) = refusal {
            pr.error_code = code.code();
            pr.error_message = msg(message);
        }
        tr.partitions.push(pr);
    }
    tr.name = t.name;
    tr
}

/// ListPartitionReassignments: every move in progress, or those of the listed partitions.
pub fn list_reassignments(
    cluster: &Cluster,
    req: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    let image = cluster.image();
    let wanted: Option<BTreeMap<String, BTreeSet<i32>>> = req.topics.map(|ts| {
        ts.into_iter()
            .map(|t| {
                (
                    t.name.to_string(),
                    t.partition_indexes.into_iter().collect(),
                )
            })
            .collect()
    });
    let mut by_topic: BTreeMap<String, Vec<OngoingPartitionReassignment>> = BTreeMap::new();
    for (topic, partition, p) in image.reassignments() {
        if let Some(w) = &wanted {
            if !w.get(topic).is_some_and(|ps| ps.contains(&partition)) {
                continue;
            }
        }
        let mut o = OngoingPartitionReassignment::default();
        o.partition_index = partition;
        o.replicas = p.replicas.iter().map(|&r| BrokerId(r)).collect();
        o.adding_replicas = p.adding.iter().map(|&r| BrokerId(r)).collect();
        o.removing_replicas = p.removing.iter().map(|&r| BrokerId(r)).collect();
        by_topic.entry(topic.to_owned()).or_default().push(o);
    }
    let mut resp = ListPartitionReassignmentsResponse::default();
    resp.topics = by_topic
        .into_iter()
        .map(|(name, partitions)| {
            let mut t = OngoingTopicReassignment::default();
            t.name = TopicName(StrBytes::from_string(name));
            t.partitions = partitions;
            t
        })
        .collect();
    resp
}

/// ElectLeaders on a standalone broker, which leads every partition it has: no election is
/// ever needed.
pub fn standalone_elect_leaders(b: &Broker, req: ElectLeadersRequest) -> ElectLeadersResponse {
    let mut resp = ElectLeadersResponse::default();
    {
        for t in req.topic_partitions.into_iter().flatten() {
            let topic = b.topics.get(t.topic.as_str());
            let mut e = ReplicaElectionResult::default();
            e.partition_result = t
                .partitions
                .iter()
                .map(|&p| {
                    let mut r = PartitionResult::default();
                    r.partition_id = p;
                    let code = match &topic {
                        Some(t) if t.has_partition(p) => ResponseError::ElectionNotNeeded,
                        _ => ResponseError::UnknownTopicOrPartition,
                    };
                    r.error_code = code.code();
                    r
                })
                .collect();
            e.topic = t.topic;
            resp.replica_election_results.push(e);
        }
    }
    resp
}

/// ElectLeaders: preferred (move leadership back to the first replica) or, only when asked,
/// unclean (a live out-of-sync replica may lead a partition with no live in-sync one).
pub async fn elect_leaders(
    cluster: Arc<Cluster>,
    version: i16,
    req: ElectLeadersRequest,
) -> ElectLeadersResponse {
    let mut resp = ElectLeadersResponse::default();
    let election_type = if version >= 1 {
        req.election_type
    } else {
        PREFERRED
    };
    if election_type != PREFERRED && election_type != UNCLEAN {
        resp.error_code = ResponseError::InvalidRequest.code();
        return resp;
    }
    let partitions = req.topic_partitions.map(|tps| {
        tps.iter()
            .flat_map(|t| t.partitions.iter().map(|&p| (t.topic.to_string(), p)))
            .collect()
    });
    let mut results: BTreeMap<String, Vec<PartitionResult>> = BTreeMap::new();
    for ((topic, partition), outcome) in cluster.elect(election_type == UNCLEAN, partitions).await {
        let mut r = PartitionResult::default();
        r.partition_id = partition;
        if let Err(e) = outcome {
            r.error_code = e.kafka_code;
            r.error_message = msg(e.message);
        }
        results.entry(topic).or_default().push(r);
    }
    resp.replica_election_results = results
        .into_iter()
        .map(|(topic, partition_result)| {
            let mut e = ReplicaElectionResult::default();
            e.topic = TopicName(StrBytes::from_string(topic));
            e.partition_result = partition_result;
            e
        })
        .collect();
    resp
}

/// Why an operator's cluster change was refused or did not finish.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct OperationError {
    /// Kafka's error code for it (0 when Kafka has none, e.g. a quorum change).
    pub kafka_code: i16,
    /// Whether retrying later may succeed (timeouts, no leader) rather than the request
    /// being wrong.
    pub retriable: bool,
    /// What is wrong, for people.
    pub message: String,
}

impl OperationError {
    fn invalid(message: impl Into<String>) -> Self {
        Self {
            kafka_code: ResponseError::InvalidRequest.code(),
            retriable: false,
            message: message.into(),
        }
    }
}

impl From<ProposeError> for OperationError {
    fn from(e: ProposeError) -> Self {
        let retriable = !matches!(e, ProposeError::Refused(_));
        Self {
            kafka_code: e.kafka_error_code(),
            retriable,
            message: e.to_string(),
        }
    }
}

/// One partition move: the replicas `topic`-`partition` should end with (`None` cancels).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Move {
    /// Topic name.
    pub topic: String,
    /// Partition number.
    pub partition: i32,
    /// Target replicas, preferred leader first; `None` cancels the move in progress.
    pub replicas: Option<Vec<i32>>,
}

/// How long adding a node may take (its catch-up with the metadata log included).
const ADD_NODE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(40);

impl Cluster {
    /// Adds node `node_id`, reachable for inter-node traffic at `addr`, to the metadata
    /// quorum as a voter; once its process registers it is eligible for replicas.
    pub async fn add_node(&self, node_id: u64, addr: String) -> Result<(), OperationError> {
        if addr.parse::<std::net::SocketAddr>().is_err() && !addr.contains(':') {
            return Err(OperationError::invalid(format!(
                "'{addr}' is not host:port"
            )));
        }
        let change = spate_cluster::membership::MembershipChange::Add { node_id, addr };
        self.node
            .change_membership(change, ADD_NODE_TIMEOUT)
            .await
            .map_err(|e| OperationError {
                kafka_code: 0,
                retriable: !matches!(e, spate_cluster::membership::MembershipError::Refused(_)),
                message: e.to_string(),
            })
    }

    /// Starts (or with `cancel`, stops) decommissioning `broker`: the controller moves its
    /// replicas to the other brokers, then removes it from the quorum and the cluster.
    /// Refused when the rest of the cluster could not hold its replicas (replication factor,
    /// min.insync.replicas) or the quorum would lose its majority.
    pub async fn decommission(&self, broker: i32, cancel: bool) -> Result<(), OperationError> {
        let image = self.image();
        if image.broker(broker).is_none() {
            return Err(OperationError {
                kafka_code: ResponseError::BrokerNotAvailable.code(),
                retriable: false,
                message: format!(
                    "broker {broker} is not registered (brokers: {:?})",
                    image.brokers().keys().collect::<Vec<_>>()
                ),
            });
        }
        if !cancel {
            let voters: BTreeSet<i32> = self
                .node
                .members()
                .voters
                .iter()
                .filter_map(|&v| i32::try_from(v).ok())
                .collect();
            let mut leaving: BTreeSet<i32> = image
                .brokers()
                .values()
                .filter(|b| b.decommissioning)
                .map(|b| b.id)
                .collect();
            leaving.insert(broker);
            if let Some(why) =
                spate_cluster::reassignment::removal_blocker(&image, &voters, &leaving)
            {
                return Err(OperationError::invalid(format!(
                    "cannot decommission broker {broker}: {why}"
                )));
            }
        }
        self.propose(MetadataCommand::SetDecommissioning {
            broker_id: broker,
            decommissioning: !cancel,
        })
        .await?;
        Ok(())
    }

    /// Starts, replaces or cancels partition moves, one proposal each; the result of each in
    /// order.
    pub async fn reassign(&self, moves: Vec<Move>) -> Vec<(Move, Result<(), OperationError>)> {
        let mut out = Vec::with_capacity(moves.len());
        let mut seen = BTreeSet::new();
        for m in moves {
            if !seen.insert((m.topic.clone(), m.partition)) {
                out.push((
                    m,
                    Err(OperationError::invalid("the partition is listed twice")),
                ));
                continue;
            }
            let cmd = MetadataCommand::AlterReassignment {
                topic: m.topic.clone(),
                partition: m.partition,
                target: m.replicas.clone(),
            };
            let r = self.propose(cmd).await.map(|_| ()).map_err(Into::into);
            out.push((m, r));
        }
        out
    }

    /// Moves that spread replicas and preferred leaderships evenly over the brokers.
    pub fn balance_plan(&self) -> Vec<Move> {
        spate_cluster::reassignment::balance_plan(&self.image())
            .into_iter()
            .map(|(topic, partition, replicas)| Move {
                topic,
                partition,
                replicas: Some(replicas),
            })
            .collect()
    }

    /// Elects leaders: preferred (back to the first replica), or unclean (any live replica
    /// of a partition with no live in-sync one). `None` means every partition needing it.
    /// Returns each partition with its new leader or why not.
    pub async fn elect(
        &self,
        unclean: bool,
        partitions: Option<Vec<(String, i32)>>,
    ) -> Vec<((String, i32), Result<Option<i32>, OperationError>)> {
        let image = self.image();
        let all = partitions.is_none();
        let targets = partitions.unwrap_or_else(|| {
            image
                .partitions_iter()
                .filter(|(_, _, p)| {
                    if unclean {
                        p.leader.is_none_or(|l| !image.is_live(l))
                    } else {
                        p.replicas.first().is_some_and(|&r| p.leader != Some(r))
                    }
                })
                .map(|(t, i, _)| (t.to_owned(), i))
                .collect()
        });
        let mut out = Vec::new();
        for (topic, partition) in targets {
            let cmd = if unclean {
                MetadataCommand::ElectUncleanLeader {
                    topic: topic.clone(),
                    partition,
                }
            } else {
                MetadataCommand::ElectPreferredLeader {
                    topic: topic.clone(),
                    partition,
                }
            };
            let r = match self.propose(cmd).await {
                Ok(spate_cluster::metadata::CommandOutcome::LeaderChanged { leader, .. }) => {
                    Ok(leader)
                }
                Ok(_) => Ok(None),
                // Asked for "all": a partition that already has its leader is not a failure.
                Err(ProposeError::Refused(CommandError::ElectionNotNeeded { .. })) if all => {
                    continue
                }
                Err(e) => Err(e.into()),
            };
            out.push(((topic, partition), r));
        }
        out
    }
}
