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
pub(super) enum LaneOp {
    /// A delta (WriteShareGroupState).
    Write(StateWrite),
    /// The state starts again under a new state epoch (InitializeShareGroupState), then takes
    /// the batches given, if any.
    Reset(StateWrite),
}

type Queued = (LaneOp, oneshot::Sender<Result<(), ResponseError>>);

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
            while let Some((op, reply)) = rx.recv().await {
                let outcome = match op {
                    LaneOp::Write(w) => route.write(key.clone(), w).await,
                    LaneOp::Reset(w) => {
                        let first = route
                            .initialize(key.clone(), w.state_epoch, w.start_offset)
                            .await;
                        match first {
                            Ok(()) if !w.batches.is_empty() => route.write(key.clone(), w).await,
                            other => other,
                        }
                    }
                };
                if let Err(e) = outcome {
                    // Later changes were made on top of this one: none of them may be sent
                    // without it, so the share-partition is read again.
                    if let Some(s) = service.upgrade() {
                        s.lane_failed(&key, generation, e);
                    }
                    let _ = reply.send(Err(e));
                    while let Ok((_, r)) = rx.try_recv() {
                        let _ = r.send(Err(e));
                    }
                    continue;
                }
                let _ = reply.send(Ok(()));
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
