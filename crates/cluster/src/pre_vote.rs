//! A pre-vote of our own (Raft thesis §9.6; openraft 0.9 has none): a voter starts a real
//! election, which raises its term, only after a majority of voters said they would vote for
//! it: they have not heard from a leader recently and its log is at least as complete as
//! theirs.
//!
//! Without it, a voter cut off from the others campaigns alone, raising its term again and
//! again, and on its return that higher term deposes a leader that kept its quorum all along:
//! an election, and a metadata outage, for nothing. With it, the isolated voter never gets a
//! majority of pre-votes, keeps its term, and simply follows again. openraft's own election
//! timer stays in charge of *when*; this only switches it on (`runtime_config().elect`) while
//! a majority agrees there is no leader.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::{LogId, ServerState};
use parking_lot::Mutex;

use crate::network::PeerClient;
use crate::raft::{LogReader, MetadataRaft, NodeId};

/// How often a voter reconsiders whether it may campaign.
const GUARD_TICK: Duration = Duration::from_millis(100);
/// How long one pre-vote request may take.
const ASK_TIMEOUT: Duration = Duration::from_millis(300);

/// One voter's side of the pre-vote: what it answers and whether it may campaign.
pub struct PreVote {
    raft: MetadataRaft,
    log: LogReader,
    /// When this node last heard from a leader (an AppendEntries, heartbeats included).
    leader_contact: Mutex<Option<Instant>>,
    /// A leader heard from within this long is still there (the shortest election timeout).
    quiet: Duration,
    /// How pre-votes reach the other voters.
    transport: crate::transport::Transport,
}

impl PreVote {
    /// The pre-vote state of a node whose log `log` reads; a leader silent for `quiet` is
    /// taken to be gone.
    pub fn new(
        raft: MetadataRaft,
        log: LogReader,
        quiet: Duration,
        transport: crate::transport::Transport,
    ) -> Self {
        Self {
            raft,
            log,
            leader_contact: Mutex::new(None),
            quiet,
            transport,
        }
    }

    /// A leader's AppendEntries arrived.
    pub fn heard_from_leader(&self) {
        *self.leader_contact.lock() = Some(Instant::now());
    }

    fn leader_is_recent(&self) -> bool {
        let m = self.raft.metrics().borrow().clone();
        if m.state == ServerState::Leader {
            return m
                .millis_since_quorum_ack
                .is_some_and(|ms| u128::from(ms) < self.quiet.as_millis());
        }
        self.leader_contact
            .lock()
            .is_some_and(|at| at.elapsed() < self.quiet)
    }

    /// Whether this node would vote for a candidate whose log ends at `candidate_last`: it
    /// knows of no live leader, and the candidate's log is at least as complete as its own.
    pub fn grant(&self, candidate_last: Option<LogId<NodeId>>) -> bool {
        !self.leader_is_recent() && candidate_last >= self.log.last_log_id()
    }

    /// Keeps this voter's elections switched off unless a majority of voters grants it a
    /// pre-vote. Runs for the node's lifetime.
    pub async fn guard(
        self: Arc<Self>,
        node_id: NodeId,
        voters_addrs: impl Fn() -> Vec<(NodeId, String)>,
    ) {
        let mut enabled: Option<bool> = None;
        let mut tick = tokio::time::interval(GUARD_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let state = self.raft.metrics().borrow().state;
            let voters = voters_addrs();
            let is_voter = voters.iter().any(|(id, _)| *id == node_id);
            let allow = match state {
                // A leader does not campaign; a learner never does.
                ServerState::Leader | ServerState::Learner | ServerState::Shutdown => true,
                _ if !is_voter => true,
                _ if self.leader_is_recent() => false,
                _ => self.majority_grants(node_id, &voters).await,
            };
            if enabled != Some(allow) {
                self.raft.runtime_config().elect(allow);
                if enabled.is_some() && allow {
                    tracing::info!(
                        node_id,
                        "a majority of voters granted a pre-vote: campaigning allowed"
                    );
                }
                enabled = Some(allow);
            }
        }
    }

    async fn majority_grants(&self, node_id: NodeId, voters: &[(NodeId, String)]) -> bool {
        let last = self.log.last_log_id();
        let asks = voters
            .iter()
            .filter(|(id, _)| *id != node_id)
            .map(|(id, addr)| {
                let mut client = PeerClient::new(node_id, *id, addr.clone(), &self.transport);
                async move { client.pre_vote(last, ASK_TIMEOUT).await.unwrap_or(false) }
            });
        let granted = 1 + futures::future::join_all(asks)
            .await
            .into_iter()
            .filter(|g| *g)
            .count();
        // `voters` comes from the membership's voter set: one entry per voter.
        granted * 2 > voters.len()
    }
}
