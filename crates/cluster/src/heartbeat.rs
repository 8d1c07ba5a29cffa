//! Broker heartbeats as messages to the active controller, out of the Raft log (as KRaft's
//! BrokerHeartbeat is): a heartbeat costs one round trip and no log entry, no fsync on a
//! majority and no new metadata image on every node. Only what changes state goes through
//! the log: registration, fencing and unfencing, a controlled shutdown.
//!
//! The controller answers a heartbeat only after confirming with a quorum that it still
//! leads (Raft's leadership check, no disk write), so an acknowledged heartbeat proves that
//! the controller able to fence the broker had heard from it at that time: what the broker's
//! session lease counts from.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::metadata::{BrokerId, CommandError, MetadataImage};
use crate::raft::{MetadataRaft, NodeId};

/// Why a heartbeat was not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum HeartbeatError {
    /// The node asked does not lead the quorum; the leader, if known, does.
    #[error("node is not the active controller (leader: {leader:?})")]
    NotLeader {
        /// The leader's id and address, if known.
        leader: Option<(NodeId, String)>,
    },
    /// The registration named is not the broker's current one.
    #[error(transparent)]
    Refused(CommandError),
    /// No answer could be had (no leader known, a peer unreachable).
    #[error("{0}")]
    Failed(String),
}

/// Heartbeats the active controller received, per broker: the registration epoch they named
/// and how many arrived. The controller's liveness tracker reads it on every pass.
#[derive(Debug, Default)]
pub struct Heartbeats {
    seen: Mutex<BTreeMap<BrokerId, (i64, u64)>>,
}

impl Heartbeats {
    /// Counts one heartbeat of `broker` under registration `epoch`.
    pub fn record(&self, broker: BrokerId, epoch: i64) {
        let mut seen = self.seen.lock();
        let entry = seen.entry(broker).or_insert((epoch, 0));
        if entry.0 != epoch {
            *entry = (epoch, 0);
        }
        entry.1 = entry.1.wrapping_add(1);
    }

    /// What arrived so far: broker -> (epoch, count).
    pub fn snapshot(&self) -> BTreeMap<BrokerId, (i64, u64)> {
        self.seen.lock().clone()
    }

    /// Forgets everything (a controller starting a new term counts afresh).
    pub fn clear(&self) {
        self.seen.lock().clear();
    }
}

/// Everything a node needs to take heartbeats as the active controller.
#[derive(Clone)]
pub struct Receiver {
    /// This node's Raft.
    pub raft: MetadataRaft,
    /// The image this node applied.
    pub image: watch::Receiver<Arc<MetadataImage>>,
    /// Where accepted heartbeats are counted.
    pub board: Arc<Heartbeats>,
}

impl Receiver {
    /// Takes a heartbeat of `broker_id` at registration `broker_epoch`, if this node leads the
    /// quorum (confirmed with a majority) and the registration is current.
    pub async fn receive(
        &self,
        broker_id: BrokerId,
        broker_epoch: i64,
    ) -> Result<(), HeartbeatError> {
        self.raft.get_read_log_id().await.map_err(not_leader)?;
        let current = self
            .image
            .borrow()
            .broker(broker_id)
            .map(|b| b.epoch)
            .ok_or(HeartbeatError::Refused(CommandError::BrokerNotRegistered {
                broker_id,
            }))?;
        if current != broker_epoch {
            return Err(HeartbeatError::Refused(CommandError::StaleBrokerEpoch {
                broker_id,
                given: broker_epoch,
                current,
            }));
        }
        self.board.record(broker_id, broker_epoch);
        Ok(())
    }

    /// This leader's commit index, once a quorum has confirmed it still leads (Raft's
    /// ReadIndex): a node that applied up to it has everything committed before the ask.
    pub async fn read_index(&self) -> Result<Option<u64>, HeartbeatError> {
        let (read, _applied) = self.raft.get_read_log_id().await.map_err(not_leader)?;
        Ok(read.map(|l| l.index))
    }
}

fn not_leader(
    e: openraft::error::RaftError<
        NodeId,
        openraft::error::CheckIsLeaderError<NodeId, crate::raft::PeerNode>,
    >,
) -> HeartbeatError {
    match e {
        openraft::error::RaftError::APIError(
            openraft::error::CheckIsLeaderError::ForwardToLeader(f),
        ) => HeartbeatError::NotLeader {
            leader: f.leader_id.zip(f.leader_node.map(|n| n.addr)),
        },
        other => HeartbeatError::Failed(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_restart_with_a_new_registration() {
        let board = Heartbeats::default();
        board.record(1, 5);
        board.record(1, 5);
        board.record(2, 7);
        assert_eq!(board.snapshot(), BTreeMap::from([(1, (5, 2)), (2, (7, 1))]));
        board.record(1, 6);
        assert_eq!(board.snapshot()[&1], (6, 1));
        board.clear();
        assert!(board.snapshot().is_empty());
    }
}
