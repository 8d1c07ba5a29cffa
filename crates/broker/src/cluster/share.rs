//! Share groups across the cluster: where a share-partition's durable state is (the leader of
//! its `__share_group_state` partition), and the share-group state APIs sent there over the
//! inter-node connections when it is another node ([`ClusterStates`], the share-partition
//! leaders' [`StateRoute`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use spate_cluster::metadata::BrokerId;
use spate_protocol::messages::*;
use spate_protocol::{Decodable, Encodable, ResponseError, StrBytes};

use super::{Cluster, PeerPool};
use crate::share::{
    state_partition_for, Members, SpKey, StateRoute, StateSummary, StateWrite, CLUSTER_PARTITIONS,
    SHARE_STATE_LOG,
};

/// How long a call keeps trying through coordinator moves (a failover takes a few seconds).
const RETRY_FOR: Duration = Duration::from_secs(20);
/// How long one call to another node may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors a share coordinator answers while it moves or loads: asked again.
fn retriable(e: ResponseError) -> bool {
    matches!(
        e,
        ResponseError::NotCoordinator
            | ResponseError::CoordinatorNotAvailable
            | ResponseError::CoordinatorLoadInProgress
            | ResponseError::NotLeaderOrFollower
            | ResponseError::NetworkException
            | ResponseError::RequestTimedOut
            | ResponseError::UnknownLeaderEpoch
            | ResponseError::NotEnoughReplicas
            | ResponseError::NotEnoughReplicasAfterAppend
    )
}

/// Where the share coordinator of `key` is now.
enum Coordinator {
    Here,
    At(String),
}

impl Cluster {
    /// The node leading the `__share_group_state` partition of `key`: its share coordinator.
    /// The topic is created on first use, as Kafka does (`None` until it exists and has a
    /// live leader).
    pub fn share_coordinator(&self, key: &SpKey) -> Option<BrokerId> {
        let image = self.image();
        let Some(topic) = image.topic(SHARE_STATE_LOG) else {
            self.create_share_state_topic(&image);
            return None;
        };
        let index = state_partition_for(key, topic.partitions.len());
        let leader = topic.partition(index as i32)?.leader?;
        image.broker(leader).filter(|r| !r.fenced).map(|r| r.id)
    }

    fn share_coordinator_addr(&self, key: &SpKey) -> Option<Coordinator> {
        let id = self.share_coordinator(key)?;
        if id == self.broker_id {
            return Some(Coordinator::Here);
        }
        self.node_addr(id).map(Coordinator::At)
    }

    /// Proposes `__share_group_state` ([`CLUSTER_PARTITIONS`] partitions, replicated like
    /// the offsets topic, compacted), once at a time.
    fn create_share_state_topic(&self, image: &spate_cluster::metadata::MetadataImage) {
        self.create_on_first_use(
            image,
            SHARE_STATE_LOG,
            CLUSTER_PARTITIONS,
            self.local.offsets_segment_bytes,
            |c| &c.creating_share_topic,
        );
    }
}

/// The share-partition leaders' way to the share coordinators of a cluster.
pub(crate) struct ClusterStates {
    pub(crate) cluster: Weak<Cluster>,
    pub(crate) peers: PeerPool,
}

/// One share-group state call to another node.
async fn call<Req: Encodable, Resp: Decodable>(
    c: &Cluster,
    peers: &PeerPool,
    addr: &str,
    key: ApiKey,
    req: &Req,
) -> Result<Resp, ResponseError> {
    let mut conn = peers
        .connection(c.transport(), addr, Duration::from_secs(3))
        .await
        .map_err(|_| ResponseError::NetworkException)?;
    let resp = conn
        .call(key, 0, req, CALL_TIMEOUT)
        .await
        .map_err(|_| ResponseError::NetworkException)?;
    peers.put_back(conn);
    Ok(resp)
}

fn code(e: i16) -> Result<(), ResponseError> {
    match ResponseError::try_from_code(e) {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

fn group(key: &SpKey) -> StrBytes {
    StrBytes::from_string(key.0.clone())
}

/// A share-group state request (`$req`) about the one share-partition `$key`: one topic
/// entry (`$data`) holding `$partition`.
macro_rules! one_partition {
    ($req:ty, $data:ty, $key:expr, $partition:expr) => {{
        let mut t = <$data>::default();
        t.topic_id = $key.1;
        t.partitions = vec![$partition];
        let mut req = <$req>::default();
        req.group_id = group(&$key);
        req.topics = vec![t];
        req
    }};
}

/// The one partition result of the answer to a [`one_partition!`] request.
macro_rules! only_result {
    ($resp:expr) => {
        $resp
            .results
            .into_iter()
            .flat_map(|t| t.partitions)
            .next()
            .ok_or(ResponseError::UnknownServerError)
    };
}

impl ClusterStates {
    /// Runs `attempt` against the share coordinator of `key` until it answers something
    /// other than a retriable error, or [`RETRY_FOR`] has passed.
    async fn with_coordinator<T, F, Fut>(&self, key: &SpKey, attempt: F) -> Result<T, ResponseError>
    where
        F: Fn(Arc<Cluster>, Coordinator) -> Fut,
        Fut: Future<Output = Result<T, ResponseError>>,
    {
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        let mut pause = Duration::from_millis(50);
        loop {
            let c = self
                .cluster
                .upgrade()
                .ok_or(ResponseError::CoordinatorNotAvailable)?;
            let outcome = match c.share_coordinator_addr(key) {
                Some(at) => attempt(c, at).await,
                None => Err(ResponseError::CoordinatorNotAvailable),
            };
            match outcome {
                Err(e) if retriable(e) && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(e) if retriable(e) => {
                    tracing::warn!(group = %key.0, partition = key.2, error = ?e, "share coordinator not reached");
                    return Err(ResponseError::CoordinatorNotAvailable);
                }
                other => return other,
            }
        }
    }
}

impl StateRoute for Arc<ClusterStates> {
    fn read(
        &self,
        key: SpKey,
        leader_epoch: i32,
    ) -> BoxFuture<'static, Result<Option<spate_share::PartitionState>, ResponseError>> {
        let me = self.clone();
        Box::pin(async move {
            me.with_coordinator(&key, |c, at| {
                let (me, key) = (me.clone(), key.clone());
                async move {
                    match at {
                        Coordinator::Here => {
                            let shares = &c.local.shares;
                            if !shares.coordinator().owns(&key) {
                                return Err(ResponseError::CoordinatorLoadInProgress);
                            }
                            Ok(shares
                                .coordinator()
                                .read(&key, leader_epoch)?
                                .map(|s| s.partition_state()))
                        }
                        Coordinator::At(addr) => {
                            use read_share_group_state_request::{PartitionData, ReadStateData};
                            let mut p = PartitionData::default();
                            p.partition = key.2;
                            p.leader_epoch = leader_epoch;
                            let req =
                                one_partition!(ReadShareGroupStateRequest, ReadStateData, key, p);
                            let resp: ReadShareGroupStateResponse =
                                call(&c, &me.peers, &addr, ApiKey::ReadShareGroupState, &req)
                                    .await?;
                            let p = only_result!(resp)?;
                            code(p.error_code)?;
                            if p.start_offset < 0 && p.state_batches.is_empty() {
                                return Ok(None);
                            }
                            Ok(Some(spate_share::PartitionState {
                                state_epoch: p.state_epoch,
                                leader_epoch,
                                start_offset: p.start_offset,
                                batches: p
                                    .state_batches
                                    .iter()
                                    .map(|b| spate_share::state::StateBatch {
                                        first_offset: b.first_offset,
                                        last_offset: b.last_offset,
                                        delivery_state: b.delivery_state,
                                        delivery_count: b.delivery_count,
                                    })
                                    .collect(),
                            }))
                        }
                    }
                }
            })
            .await
        })
    }

    fn initialize(
        &self,
        key: SpKey,
        state_epoch: i32,
        start_offset: i64,
    ) -> BoxFuture<'static, Result<(), ResponseError>> {
        let me = self.clone();
        Box::pin(async move {
            me.with_coordinator(&key, |c, at| {
                let (me, key) = (me.clone(), key.clone());
                async move {
                    match at {
                        Coordinator::Here => {
                            let shares = &c.local.shares;
                            let now = shares.now_ms();
                            let w = shares.coordinator().initialize(
                                &c.local.topics,
                                &key,
                                state_epoch,
                                start_offset,
                                now,
                            )?;
                            shares.written_durable(&w).await
                        }
                        Coordinator::At(addr) => {
                            use initialize_share_group_state_request::{
                                InitializeStateData, PartitionData,
                            };
                            let mut p = PartitionData::default();
                            p.partition = key.2;
                            p.state_epoch = state_epoch;
                            p.start_offset = start_offset;
                            let req = one_partition!(
                                InitializeShareGroupStateRequest,
                                InitializeStateData,
                                key,
                                p
                            );
                            let resp: InitializeShareGroupStateResponse = call(
                                &c,
                                &me.peers,
                                &addr,
                                ApiKey::InitializeShareGroupState,
                                &req,
                            )
                            .await?;
                            let p = only_result!(resp)?;
                            code(p.error_code)
                        }
                    }
                }
            })
            .await
        })
    }

    fn write(
        &self,
        key: SpKey,
        write: StateWrite,
    ) -> BoxFuture<'static, Result<(), ResponseError>> {
        let me = self.clone();
        Box::pin(async move {
            me.with_coordinator(&key, |c, at| {
                let (me, key, write) = (me.clone(), key.clone(), write.clone());
                async move {
                    match at {
                        Coordinator::Here => {
                            let shares = &c.local.shares;
                            let now = shares.now_ms();
                            let w =
                                shares
                                    .coordinator()
                                    .write(&c.local.topics, &key, &write, now)?;
                            shares.written_durable(&w).await
                        }
                        Coordinator::At(addr) => {
                            use write_share_group_state_request::{
                                PartitionData, StateBatch, WriteStateData,
                            };
                            let mut p = PartitionData::default();
                            p.partition = key.2;
                            p.state_epoch = write.state_epoch;
                            p.leader_epoch = write.leader_epoch;
                            p.start_offset = write.start_offset;
                            p.state_batches = write
                                .batches
                                .iter()
                                .map(|b| {
                                    let mut out = StateBatch::default();
                                    out.first_offset = b.first_offset;
                                    out.last_offset = b.last_offset;
                                    out.delivery_state = b.delivery_state;
                                    out.delivery_count = b.delivery_count;
                                    out
                                })
                                .collect();
                            let req =
                                one_partition!(WriteShareGroupStateRequest, WriteStateData, key, p);
                            let resp: WriteShareGroupStateResponse =
                                call(&c, &me.peers, &addr, ApiKey::WriteShareGroupState, &req)
                                    .await?;
                            let p = only_result!(resp)?;
                            code(p.error_code)
                        }
                    }
                }
            })
            .await
        })
    }

    fn delete(&self, key: SpKey) -> BoxFuture<'static, Result<(), ResponseError>> {
        let me = self.clone();
        Box::pin(async move {
            me.with_coordinator(&key, |c, at| {
                let (me, key) = (me.clone(), key.clone());
                async move {
                    match at {
                        Coordinator::Here => {
                            let shares = &c.local.shares;
                            let now = shares.now_ms();
                            match shares.coordinator().delete(&c.local.topics, &key, now)? {
                                Some(w) => shares.written_durable(&w).await,
                                None => Ok(()),
                            }
                        }
                        Coordinator::At(addr) => {
                            use delete_share_group_state_request::{
                                DeleteStateData, PartitionData,
                            };
                            let mut p = PartitionData::default();
                            p.partition = key.2;
                            let req = one_partition!(
                                DeleteShareGroupStateRequest,
                                DeleteStateData,
                                key,
                                p
                            );
                            let resp: DeleteShareGroupStateResponse =
                                call(&c, &me.peers, &addr, ApiKey::DeleteShareGroupState, &req)
                                    .await?;
                            let p = only_result!(resp)?;
                            code(p.error_code)
                        }
                    }
                }
            })
            .await
        })
    }

    fn summaries(
        &self,
        group_id: String,
        keys: Vec<SpKey>,
    ) -> BoxFuture<'static, Result<Vec<(SpKey, StateSummary)>, ResponseError>> {
        let me = self.clone();
        Box::pin(async move {
            // One ReadShareGroupStateSummary per coordinator node, not one per share-partition:
            // describing a group asks about every partition of its topics.
            let c = me
                .cluster
                .upgrade()
                .ok_or(ResponseError::CoordinatorNotAvailable)?;
            let mut by_node: BTreeMap<BrokerId, Vec<SpKey>> = BTreeMap::new();
            for k in keys {
                let node = c
                    .share_coordinator(&k)
                    .ok_or(ResponseError::CoordinatorNotAvailable)?;
                by_node.entry(node).or_default().push(k);
            }
            let mut out = Vec::new();
            for (node, keys) in by_node {
                if node == c.broker_id {
                    let coordinator = c.local.shares.coordinator();
                    for k in keys {
                        if !coordinator.owns(&k) {
                            return Err(ResponseError::CoordinatorLoadInProgress);
                        }
                        if let Some(s) = coordinator.summary(&k) {
                            out.push((k, s));
                        }
                    }
                    continue;
                }
                let addr = c
                    .node_addr(node)
                    .ok_or(ResponseError::CoordinatorNotAvailable)?;
                use read_share_group_state_summary_request::{PartitionData, ReadStateSummaryData};
                let mut topics: BTreeMap<uuid::Uuid, Vec<i32>> = BTreeMap::new();
                for k in &keys {
                    topics.entry(k.1).or_default().push(k.2);
                }
                let mut req = ReadShareGroupStateSummaryRequest::default();
                req.group_id = StrBytes::from_string(group_id.clone());
                req.topics = topics
                    .into_iter()
                    .map(|(id, ps)| {
                        let mut t = ReadStateSummaryData::default();
                        t.topic_id = id;
                        t.partitions = ps
                            .into_iter()
                            .map(|p| {
                                let mut d = PartitionData::default();
                                d.partition = p;
                                d.leader_epoch = -1;
                                d
                            })
                            .collect();
                        t
                    })
                    .collect();
                let resp: ReadShareGroupStateSummaryResponse = call(
                    &c,
                    &me.peers,
                    &addr,
                    ApiKey::ReadShareGroupStateSummary,
                    &req,
                )
                .await?;
                for t in resp.results {
                    for p in t.partitions {
                        code(p.error_code)?;
                        if p.start_offset >= 0 {
                            out.push((
                                (group_id.clone(), t.topic_id, p.partition),
                                StateSummary {
                                    state_epoch: p.state_epoch,
                                    leader_epoch: p.leader_epoch,
                                    start_offset: p.start_offset,
                                },
                            ));
                        }
                    }
                }
            }
            Ok(out)
        })
    }

    fn members(&self, group_id: String) -> BoxFuture<'static, Result<Members, ResponseError>> {
        let me = self.clone();
        Box::pin(async move {
            let c = me
                .cluster
                .upgrade()
                .ok_or(ResponseError::CoordinatorNotAvailable)?;
            let (id, ..) = c
                .group_coordinator(&group_id)
                .ok_or(ResponseError::CoordinatorNotAvailable)?;
            if id == c.broker_id {
                let d = c
                    .local
                    .shares
                    .describe(&group_id)
                    .ok_or(ResponseError::GroupIdNotFound)?;
                return Ok(d
                    .members
                    .into_iter()
                    .map(|m| (m.member_id, m.subscribed_topic_names))
                    .collect());
            }
            let addr = c
                .node_addr(id)
                .ok_or(ResponseError::CoordinatorNotAvailable)?;
            let mut req = ShareGroupDescribeRequest::default();
            req.group_ids = vec![StrBytes::from_string(group_id.clone()).into()];
            let mut conn = me
                .peers
                .connection(c.transport(), &addr, Duration::from_secs(3))
                .await
                .map_err(|_| ResponseError::NetworkException)?;
            let resp: ShareGroupDescribeResponse = conn
                .call(ApiKey::ShareGroupDescribe, 1, &req, CALL_TIMEOUT)
                .await
                .map_err(|_| ResponseError::NetworkException)?;
            me.peers.put_back(conn);
            let g = resp
                .groups
                .into_iter()
                .next()
                .ok_or(ResponseError::UnknownServerError)?;
            code(g.error_code)?;
            Ok(g.members
                .into_iter()
                .map(|m| {
                    (
                        m.member_id.to_string(),
                        m.subscribed_topic_names
                            .iter()
                            .map(|t| t.to_string())
                            .collect(),
                    )
                })
                .collect())
        })
    }
}
