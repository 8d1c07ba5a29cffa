//! Changing who is in the metadata quorum: adding a node (as a learner that catches up, then
//! a voter) and removing one, through openraft's joint-consensus membership changes.
//!
//! Only the Raft leader can change membership; [`change_on_leader`] runs there, and
//! `MetadataNode` forwards a change made on any other node to the leader.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, ServerState};
use serde::{Deserialize, Serialize};

use crate::metadata::{BrokerId, MetadataCommand};
use crate::raft::{MetadataRaft, NodeId, PeerNode};

/// How long a new node may take to catch up with the metadata log before adding it fails.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(20);

/// A change to the quorum's membership.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembershipChange {
    /// Add a node reachable at `addr`: it catches up as a learner, then becomes a voter.
    Add {
        /// The node's id.
        node_id: NodeId,
        /// Its inter-node address.
        addr: String,
    },
    /// Add a node reachable at `addr` as an observer: it follows the metadata log as a
    /// learner and serves as a broker, but does not vote (nodes beyond the voters).
    Observe {
        /// The node's id.
        node_id: NodeId,
        /// Its inter-node address.
        addr: String,
    },
    /// Remove a node from the quorum (voter or learner).
    Remove {
        /// The node's id.
        node_id: NodeId,
    },
}

/// Why a membership change did not happen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum MembershipError {
    /// This node does not lead the quorum; the leader, if known, can.
    #[error("this node is not the metadata quorum leader (leader: {leader:?})")]
    NotLeader {
        /// The leader's id and address, if known.
        leader: Option<(NodeId, String)>,
    },
    /// The change is not acceptable; the reason says why.
    #[error("{0}")]
    Refused(String),
    /// The change was accepted but did not finish.
    #[error("membership change did not finish: {0}")]
    Failed(String),
}

/// The quorum's current members.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Members {
    /// Voters, by id.
    pub voters: BTreeSet<NodeId>,
    /// Every member (voters and learners) with its address.
    pub nodes: BTreeMap<NodeId, String>,
}

/// The membership as `raft` last applied it.
pub fn members(raft: &MetadataRaft) -> Members {
    let metrics = raft.metrics();
    let m = metrics.borrow();
    let membership = m.membership_config.membership();
    Members {
        voters: membership.voter_ids().collect(),
        nodes: membership
            .nodes()
            .map(|(id, node)| (*id, node.addr.clone()))
            .collect(),
    }
}

/// Applies `change` on this node, which must lead the quorum.
pub async fn change_on_leader(
    raft: &MetadataRaft,
    change: &MembershipChange,
) -> Result<(), MembershipError> {
    let (state, leader) = {
        let m = raft.metrics();
        let m = m.borrow();
        let leader = m.current_leader.and_then(|id| {
            m.membership_config
                .membership()
                .get_node(&id)
                .map(|n| (id, n.addr.clone()))
        });
        (m.state, leader)
    };
    if state != ServerState::Leader {
        return Err(MembershipError::NotLeader { leader });
    }
    let current = members(raft);
    if let MembershipChange::Add { node_id, addr } | MembershipChange::Observe { node_id, addr } =
        change
    {
        if let Some((other, _)) = current
            .nodes
            .iter()
            .find(|(id, a)| *id != node_id && a.as_str() == addr)
        {
            return Err(MembershipError::Refused(format!(
                "address {addr} already belongs to node {other}"
            )));
        }
        if i32::try_from(*node_id).is_err() {
            return Err(MembershipError::Refused(format!(
                "node id {node_id} is not a valid broker id"
            )));
        }
    }
    match change {
        MembershipChange::Observe { node_id, addr } => {
            if current.voters.contains(node_id) {
                return Err(MembershipError::Refused(format!(
                    "node {node_id} is a voter of the metadata quorum; start it with its id in --cluster-peers"
                )));
            }
            match current.nodes.get(node_id) {
                Some(known) if known == addr => return Ok(()),
                Some(known) => {
                    return Err(MembershipError::Refused(format!(
                        "node {node_id} is already an observer at {known}, not {addr}"
                    )))
                }
                None => {}
            }
            // Not blocking: the learner catches up in the background, and the broker on it
            // registers once it has.
            raft.add_learner(*node_id, PeerNode { addr: addr.clone() }, false)
                .await
                .map_err(write_error)?;
            tracing::info!(
                node_id,
                addr,
                "node joined the metadata quorum as an observer"
            );
            Ok(())
        }
        MembershipChange::Add { node_id, addr } => {
            if current.voters.contains(node_id) {
                return match current.nodes.get(node_id) {
                    Some(known) if known == addr => Ok(()),
                    Some(known) => Err(MembershipError::Refused(format!(
                        "node {node_id} is already a member at {known}, not {addr}"
                    ))),
                    None => Ok(()),
                };
            }
            let node = PeerNode { addr: addr.clone() };
            match tokio::time::timeout(
                CATCH_UP_TIMEOUT,
                raft.add_learner(*node_id, node, true),
            )
            .await
            {
                Err(_) => {
                    return Err(MembershipError::Failed(format!(
                        "node {node_id} at {addr} did not catch up with the metadata log within {CATCH_UP_TIMEOUT:?}: is it running with --node-id {node_id} and --cluster-listen on that address? It stays a learner until it catches up or is removed"
                    )))
                }
                Ok(result) => result.map_err(write_error)?,
            };
            raft.change_membership(
                ChangeMembers::AddVoterIds(BTreeSet::from([*node_id])),
                false,
            )
            .await
            .map_err(write_error)?;
            // A node removed earlier may register as a broker again.
            if let Ok(broker_id) = BrokerId::try_from(*node_id) {
                raft.client_write(MetadataCommand::ReadmitBroker { broker_id })
                    .await
                    .map_err(write_error)?;
            }
            tracing::info!(
                node_id,
                addr,
                "node added to the metadata quorum as a voter"
            );
            Ok(())
        }
        MembershipChange::Remove { node_id } => {
            if !current.nodes.contains_key(node_id) {
                return Err(MembershipError::Refused(format!(
                    "node {node_id} is not a member of the metadata quorum (members: {:?})",
                    current.nodes.keys().collect::<Vec<_>>()
                )));
            }
            if current.voters.contains(node_id) {
                if current.voters.len() == 1 {
                    return Err(MembershipError::Refused(format!(
                        "node {node_id} is the last voter of the metadata quorum"
                    )));
                }
                raft.change_membership(
                    ChangeMembers::RemoveVoters(BTreeSet::from([*node_id])),
                    false,
                )
                .await
                .map_err(write_error)?;
            } else {
                raft.change_membership(
                    ChangeMembers::RemoveNodes(BTreeSet::from([*node_id])),
                    false,
                )
                .await
                .map_err(write_error)?;
            }
            tracing::info!(node_id, "node removed from the metadata quorum");
            Ok(())
        }
    }
}

fn write_error(e: RaftError<NodeId, ClientWriteError<NodeId, PeerNode>>) -> MembershipError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => MembershipError::NotLeader {
            leader: f.leader_id.zip(f.leader_node.map(|n| n.addr)),
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => {
            MembershipError::Refused(c.to_string())
        }
        RaftError::Fatal(f) => MembershipError::Failed(f.to_string()),
    }
}
