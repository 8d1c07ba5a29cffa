//! How a cluster node's share-partition leader reaches the share coordinators (Kafka's
//! persister): the [`StateRoute`] the cluster provides, and the per-share-partition [`Lane`]
//! that sends its changes one at a time, in the order they were made.
//!
//! Order matters because a write is a delta merged into the stored state: an acquisition
//! (delivery count up) applied after the acknowledgement that followed it would make an
//! accepted record available again.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use futures::future::BoxFuture;
use spate_protocol::ResponseError;
use tokio::sync::{mpsc, oneshot};

use super::coordinator::{StateSummary, StateWrite};
use super::{ShareService, SpKey};
use crate::groups::Written;

/// A group's members (by member id) with the topic names each subscribes to.
pub type Members = HashMap<String, Vec<String>>;

/// A change to share-partition state on its way to being durable.
pub enum Persisted {
    /// Appended to this broker's own state log: durable once committed there.
    Local(Written),
    /// Sent through a lane: the share coordinator's answer, once durable there.
    Remote(oneshot::Receiver<Result<(), ResponseError>>),
}

/// The share coordinators of a cluster, wherever each key's is now. Every call retries
/// through coordinator moves for a while, then gives up with a retriable error.
pub trait StateRoute: Send + Sync + 'static {
    /// ReadShareGroupState at `leader_epoch` (`None`: never initialized).
    fn read(
        &self,
        key: SpKey,
        leader_epoch: i32,
    ) -> BoxFuture<'static, Result<Option<spate_share::PartitionState>, ResponseError>>;
    /// InitializeShareGroupState.
    fn initialize(
        &self,
        key: SpKey,
        state_epoch: i32,
        start_offset: i64,
    ) -> BoxFuture<'static, Result<(), ResponseError>>;
    /// WriteShareGroupState.
    fn write(&self, key: SpKey, write: StateWrite)
        -> BoxFuture<'static, Result<(), ResponseError>>;
    /// DeleteShareGroupState.
    fn delete(&self, key: SpKey) -> BoxFuture<'static, Result<(), ResponseError>>;
    /// ReadShareGroupStateSummary of many share-partitions of one group: those with state.
    fn summaries(
        &self,
        group: String,
        keys: Vec<SpKey>,
    ) -> BoxFuture<'static, Result<Vec<(SpKey, StateSummary)>, ResponseError>>;
    /// The group's members, from its coordinator (ShareGroupDescribe); GROUP_ID_NOT_FOUND
    /// when it has none.
    fn members(&self, group: String) -> BoxFuture<'static, Result<Members, ResponseError>>;
}

/// What a lane sends.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum LaneOp {
    /// A delta (WriteShareGroupState).
    Write(StateWrite),
    /// The state starts again under a new state epoch (InitializeShareGroupState), then takes
    /// the batches given, if any.
    Reset(StateWrite),
}

type Reply = oneshot::Sender<Result<(), ResponseError>>;
type Queued = (LaneOp, Reply);

/// Consecutive writes merged into one (batches in order, the last start offset and epochs);
/// a reset stays on its own. Each merged op carries the replies of what it stands for.
fn coalesce(queued: Vec<Queued>) -> Vec<(LaneOp, Vec<Reply>)> {
    let mut out: Vec<(LaneOp, Vec<Reply>)> = Vec::new();
    for (op, reply) in queued {
        match (out.last_mut(), op) {
            (Some((LaneOp::Write(acc), replies)), LaneOp::Write(w))
                if acc.state_epoch == w.state_epoch =>
            {
                acc.leader_epoch = w.leader_epoch;
                if w.start_offset >= 0 {
                    acc.start_offset = w.start_offset;
                }
                acc.batches.extend(w.batches);
                replies.push(reply);
            }
            (_, op) => out.push((op, vec![reply])),
        }
    }
    out
}

/// One share-partition's ordered way to its share coordinator: a task taking its changes one
/// at a time. It ends when the share-partition is dropped (its sender with it).
pub(super) struct Lane {
    tx: mpsc::UnboundedSender<Queued>,
}

impl Lane {
    /// Starts the lane of `key`, taken on as `generation`.
    pub(super) fn spawn(
        route: Arc<dyn StateRoute>,
        service: Weak<ShareService>,
        key: SpKey,
        generation: u64,
    ) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Queued>();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                // Changes queued while the previous write was out go as one: deltas applied
                // in order are their batches in order (a later batch replaces what an earlier
                // one says of its offsets), so many members acknowledging one partition cost
                // one write per round trip, not one each.
                let mut queued = vec![first];
                while let Ok(next) = rx.try_recv() {
                    queued.push(next);
                }
                for (op, replies) in coalesce(queued) {
                    let outcome = match op {
                        LaneOp::Write(w) => route.write(key.clone(), w).await,
                        LaneOp::Reset(w) => {
                            let first = route
                                .initialize(key.clone(), w.state_epoch, w.start_offset)
                                .await;
                            match first {
                                Ok(()) if !w.batches.is_empty() => {
                                    route.write(key.clone(), w).await
                                }
                                other => other,
                            }
                        }
                    };
                    if let Err(e) = outcome {
                        // Later changes were made on top of this one: none of them may be
                        // sent without it, so the share-partition is read again.
                        if let Some(s) = service.upgrade() {
                            s.lane_failed(&key, generation, e);
                        }
                        for r in replies {
                            let _ = r.send(Err(e));
                        }
                        while let Ok((_, r)) = rx.try_recv() {
                            let _ = r.send(Err(e));
                        }
                        break;
                    }
                    for r in replies {
                        let _ = r.send(Ok(()));
                    }
                }
            }
        });
        Self { tx }
    }

    /// Queues a change; its outcome arrives once it is durable or refused.
    pub(super) fn send(&self, op: LaneOp) -> Persisted {
        let (reply, rx) = oneshot::channel();
        if let Err(mpsc::error::SendError((_, reply))) = self.tx.send((op, reply)) {
            let _ = reply.send(Err(ResponseError::NotLeaderOrFollower));
        }
        Persisted::Remote(rx)
    }
}

#[cfg(test)]
mod tests {
    use spate_share::state::StateBatch;

    use super::*;

    fn write(start: i64, batches: &[(i64, i64, i8)]) -> LaneOp {
        LaneOp::Write(StateWrite {
            state_epoch: 0,
            leader_epoch: 3,
            start_offset: start,
            batches: batches
                .iter()
                .map(|&(first, last, state)| StateBatch {
                    first_offset: first,
                    last_offset: last,
                    delivery_state: state,
                    delivery_count: 1,
                })
                .collect(),
        })
    }

    #[test]
    fn queued_writes_merge_in_order_and_a_reset_stays_apart() {
        let queued: Vec<Queued> = vec![
            write(-1, &[(0, 9, 0)]),
            write(-1, &[(3, 4, 2)]),
            write(5, &[]),
            LaneOp::Reset(StateWrite {
                state_epoch: 1,
                leader_epoch: 3,
                start_offset: 100,
                batches: Vec::new(),
            }),
            write(-1, &[(100, 100, 2)]),
        ]
        .into_iter()
        .map(|op| (op, oneshot::channel().0))
        .collect();
        let merged = coalesce(queued);
        let ops: Vec<&LaneOp> = merged.iter().map(|(op, _)| op).collect();
        let replies: Vec<usize> = merged.iter().map(|(_, r)| r.len()).collect();
        assert_eq!(replies, vec![3, 1, 1]);
        assert_eq!(ops[0], &write(5, &[(0, 9, 0), (3, 4, 2)]));
        assert!(matches!(ops[1], LaneOp::Reset(_)));
        // What follows a reset is not merged into it.
        assert!(matches!(ops[2], LaneOp::Write(w) if w.state_epoch == 0));
    }
}
