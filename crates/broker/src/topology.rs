//! The one seam between a standalone broker and a node of a cluster.
//!
//! A standalone broker decides about its topics alone, from its registry on disk; a cluster
//! node asks the metadata quorum and follows what it commits. Everything that differs between
//! the two is decided here (how topics and partitions are described, created, deleted and
//! configured, where DeleteRecords waits, whether acks=all waits for replicas, who may fetch
//! as a replica, where producer ids and quotas come from), so handlers have one path and the
//! dispatcher one arm per API.

use std::sync::Arc;

use futures::future::BoxFuture;
use spate_protocol::batch::ControlRecord;
use spate_protocol::messages::fetch_request::FetchPartition;
use spate_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse,
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    DeleteRecordsRequest, DeleteRecordsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    ElectLeadersRequest, ElectLeadersResponse, ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse, MetadataRequest, MetadataResponse,
};
use spate_protocol::ResponseError;
use spate_quotas::{QuotaEntity, QuotaKey, QuotaValue};

use crate::cluster::Cluster;
use crate::handlers;
use crate::partition::Partition;
use crate::registry::{Topic, TopicError};
use crate::replica;
use crate::topic_config::TopicConfig;
use crate::Broker;

/// Where this broker's topics are decided.
#[derive(Clone)]
pub enum Topology {
    /// By this broker alone: the registry on disk is the truth.
    Standalone,
    /// By the cluster's metadata quorum; the local registry follows its images.
    Cluster(Arc<Cluster>),
}

/// How a request is answered: at once, on the blocking pool (it touches the disk), or once the
/// quorum answers. The last two keep the connection's next request waiting (a topic change
/// must be seen by the request after it).
pub enum Work<T> {
    /// The answer, ready.
    Now(T),
    /// Runs on the blocking pool.
    Blocking(Box<dyn FnOnce(&Broker) -> T + Send>),
    /// Waits for the metadata quorum.
    Quorum(BoxFuture<'static, T>),
}

impl<T: Send + 'static> Work<T> {
    /// The same work with `f` applied to its answer.
    pub fn map(self, f: impl FnOnce(&mut T) + Send + 'static) -> Work<T> {
        match self {
            Work::Now(mut answer) => {
                f(&mut answer);
                Work::Now(answer)
            }
            Work::Blocking(g) => Work::Blocking(Box::new(move |b| {
                let mut answer = g(b);
                f(&mut answer);
                answer
            })),
            Work::Quorum(fut) => Work::Quorum(Box::pin(async move {
                let mut answer = fut.await;
                f(&mut answer);
                answer
            })),
        }
    }

    /// Runs the work to its answer, for callers outside the Kafka dispatcher (the admin HTTP
    /// API). `None` when the blocking step panicked (logged).
    pub async fn run(self, b: &Arc<Broker>) -> Option<T> {
        match self {
            Work::Now(answer) => Some(answer),
            Work::Blocking(f) => {
                let b = b.clone();
                match tokio::task::spawn_blocking(move || f(&b)).await {
                    Ok(answer) => Some(answer),
                    Err(e) => {
                        tracing::error!(error = %e, "a topic change failed on the blocking pool");
                        None
                    }
                }
            }
            Work::Quorum(fut) => Some(fut.await),
        }
    }
}

impl Broker {
    /// Where this broker's topics are decided.
    pub fn topology(&self) -> Topology {
        match self.cluster.get() {
            Some(c) => Topology::Cluster(c.clone()),
            None => Topology::Standalone,
        }
    }
}

impl Topology {
    /// The cluster, for what only a cluster has (the quorum's own state, reassignments).
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        match self {
            Topology::Standalone => None,
            Topology::Cluster(c) => Some(c),
        }
    }

    /// Whether partitions are replicated: an acks=all produce then waits for the ISR, and
    /// only a partition's leader answers for it.
    pub fn replicates(&self) -> bool {
        matches!(self, Topology::Cluster(_))
    }

    /// Whether this broker may take produces now. A cluster node whose heartbeats have not
    /// committed for the session timeout may already have been replaced as leader: it takes
    /// none, even before its roles catch up.
    pub fn takes_produce(&self) -> bool {
        match self {
            Topology::Standalone => true,
            Topology::Cluster(c) => c.lease_valid(),
        }
    }

    /// Topics, partitions and brokers as Metadata (and DescribeTopicPartitions, which reads
    /// the same view) shows them, creating none.
    pub fn describe_topics(
        &self,
        b: &Broker,
        version: i16,
        req: MetadataRequest,
    ) -> MetadataResponse {
        match self {
            Topology::Standalone => handlers::metadata::handle(b, version, req),
            Topology::Cluster(c) => crate::cluster::describe_metadata(b, c, version, req),
        }
    }

    /// Metadata: described at once, unless it auto-creates topics (on disk, or through the
    /// quorum).
    pub fn metadata(
        &self,
        b: &Arc<Broker>,
        version: i16,
        req: MetadataRequest,
    ) -> Work<MetadataResponse> {
        match self {
            Topology::Cluster(c) if crate::cluster::metadata_may_create(b, c, version, &req) => {
                Work::Quorum(Box::pin(crate::cluster::metadata(b.clone(), version, req)))
            }
            Topology::Standalone if b.metadata_may_create(version, &req) => {
                Work::Blocking(Box::new(move |b| {
                    handlers::metadata::handle(b, version, req)
                }))
            }
            _ => Work::Now(self.describe_topics(b, version, req)),
        }
    }

    /// CreateTopics.
    pub fn create_topics(
        &self,
        b: &Arc<Broker>,
        version: i16,
        req: CreateTopicsRequest,
    ) -> Work<CreateTopicsResponse> {
        match self {
            Topology::Standalone => {
                Work::Blocking(Box::new(move |b| handlers::topics::create(b, version, req)))
            }
            Topology::Cluster(_) => Work::Quorum(Box::pin(crate::cluster::create_topics(
                b.clone(),
                version,
                req,
            ))),
        }
    }

    /// DeleteTopics.
    pub fn delete_topics(
        &self,
        b: &Arc<Broker>,
        version: i16,
        req: DeleteTopicsRequest,
    ) -> Work<DeleteTopicsResponse> {
        match self {
            Topology::Standalone => {
                Work::Blocking(Box::new(move |b| handlers::topics::delete(b, version, req)))
            }
            Topology::Cluster(_) => Work::Quorum(Box::pin(crate::cluster::delete_topics(
                b.clone(),
                version,
                req,
            ))),
        }
    }

    /// CreatePartitions.
    pub fn create_partitions(
        &self,
        b: &Arc<Broker>,
        req: CreatePartitionsRequest,
    ) -> Work<CreatePartitionsResponse> {
        match self {
            Topology::Standalone => Work::Blocking(Box::new(move |b| {
                handlers::topics::create_partitions(b, req)
            })),
            Topology::Cluster(_) => {
                Work::Quorum(Box::pin(crate::cluster::create_partitions(b.clone(), req)))
            }
        }
    }

    /// DeleteRecords: standalone, done when the start moved on disk; in a cluster, when every
    /// in-sync replica holds the new start.
    pub fn delete_records(
        &self,
        b: &Arc<Broker>,
        req: DeleteRecordsRequest,
    ) -> Work<DeleteRecordsResponse> {
        match self {
            Topology::Standalone => {
                Work::Blocking(Box::new(move |b| handlers::delete_records::handle(b, req)))
            }
            Topology::Cluster(_) => Work::Quorum(Box::pin(
                handlers::delete_records::handle_replicated(b.clone(), req),
            )),
        }
    }

    /// ListPartitionReassignments: none outside a cluster.
    pub fn list_reassignments(
        &self,
        req: ListPartitionReassignmentsRequest,
    ) -> ListPartitionReassignmentsResponse {
        match self {
            Topology::Standalone => ListPartitionReassignmentsResponse::default(),
            Topology::Cluster(c) => crate::cluster::list_reassignments(c, req),
        }
    }

    /// Replaces a topic's config: on disk when standalone, through the quorum in a cluster.
    pub fn set_topic_config(
        &self,
        b: &Broker,
        topic: &Topic,
        config: TopicConfig,
    ) -> Result<(), TopicError> {
        match self {
            Topology::Standalone => b.topics.set_config(topic, config),
            Topology::Cluster(c) => c.set_topic_config(topic, &config),
        }
    }

    /// Alters client quotas: on disk when standalone, through the quorum in a cluster (every
    /// node then applies them).
    pub fn alter_client_quotas(
        &self,
        b: &Broker,
        entity: &QuotaEntity,
        ops: &[(QuotaKey, Option<QuotaValue>)],
    ) -> Result<(), (ResponseError, String)> {
        match self {
            Topology::Standalone => b.quotas.alter(entity, ops).map_err(|e| {
                tracing::error!(error = %e, "cannot save client quotas");
                (ResponseError::KafkaStorageError, e.to_string())
            }),
            Topology::Cluster(c) => c.alter_client_quotas(entity, ops),
        }
    }

    /// How many partitions `topic` has (0 when it does not exist).
    pub fn partition_count(&self, b: &Broker, topic: &str) -> i32 {
        match self {
            Topology::Standalone => b.topics.get(topic).map_or(0, |t| t.partition_count()),
            Topology::Cluster(c) => c
                .image()
                .topic(topic)
                .map_or(0, |t| i32::try_from(t.partitions.len()).unwrap_or(i32::MAX)),
        }
    }

    /// A new producer id: from this broker's own block on disk, or from the blocks the quorum
    /// hands out (unique across the cluster). The error is the code to answer with.
    pub fn allocate_producer_id(&self, b: &Broker) -> Result<i64, ResponseError> {
        match self {
            Topology::Standalone => b.producer_ids.allocate().map_err(|e| {
                tracing::error!(error = %e, "cannot allocate a producer id");
                ResponseError::KafkaStorageError
            }),
            Topology::Cluster(c) => c.allocate_producer_id().map_err(|e| {
                tracing::warn!(error = %e, "cannot allocate a producer id from the cluster");
                // Retriable: the client asks again once the quorum answers.
                ResponseError::CoordinatorNotAvailable
            }),
        }
    }

    /// The cluster id clients see.
    pub fn cluster_id(&self, b: &Broker) -> String {
        match self {
            Topology::Standalone => b.cluster_id.clone(),
            Topology::Cluster(c) => c.cluster_id(),
        }
    }

    /// The controller clients are told of (-1 while none is known).
    pub fn controller_id(&self, b: &Broker) -> i32 {
        match self {
            Topology::Standalone => b.config.node_id,
            Topology::Cluster(c) => c.controller_id().unwrap_or(-1),
        }
    }

    /// The brokers, with fenced ones (registered but not live) when `with_fenced`.
    pub fn brokers(&self, b: &Broker, with_fenced: bool) -> Vec<BrokerView> {
        match self {
            Topology::Standalone => vec![BrokerView {
                id: b.config.node_id,
                host: b.config.advertised_host.clone(),
                port: b.config.advertised_port,
                rack: None,
                fenced: false,
            }],
            Topology::Cluster(c) => c
                .image()
                .brokers()
                .values()
                .filter(|reg| with_fenced || !reg.fenced)
                .map(|reg| BrokerView {
                    id: reg.id,
                    host: reg.kafka_host.clone(),
                    port: i32::from(reg.kafka_port),
                    rack: reg.rack.clone(),
                    fenced: reg.fenced,
                })
                .collect(),
        }
    }

    /// The broker coordinating `group` (id, host, port): this one when standalone; in a
    /// cluster the leader of the group's offsets partition (`None` while there is none).
    pub fn group_coordinator(&self, b: &Broker, group: &str) -> Option<(i32, String, i32)> {
        match self {
            Topology::Standalone => Some((
                b.config.node_id,
                b.config.advertised_host.clone(),
                b.config.advertised_port,
            )),
            Topology::Cluster(c) => c.group_coordinator(group),
        }
    }

    /// The share coordinator of a share-partition: the leader of its `__share_group_state`
    /// partition (standalone: this broker).
    pub fn share_coordinator(
        &self,
        b: &Broker,
        key: &crate::share::SpKey,
    ) -> Option<(i32, String, i32)> {
        match self {
            Topology::Standalone => Some((
                b.config.node_id,
                b.config.advertised_host.clone(),
                b.config.advertised_port,
            )),
            Topology::Cluster(c) => {
                let id = c.share_coordinator(key)?;
                let image = c.image();
                let reg = image.broker(id)?;
                Some((reg.id, reg.kafka_host.clone(), i32::from(reg.kafka_port)))
            }
        }
    }

    /// The node that coordinates transactional id `txn_id`: the leader of its
    /// `__transaction_state` partition.
    pub fn txn_coordinator(&self, b: &Broker, txn_id: &str) -> Option<(i32, String, i32)> {
        match self {
            Topology::Standalone => {
                // The state topic is created on first use (once; it makes its directories).
                if let Err(e) = b.txns.ensure_standalone(&b.topics) {
                    tracing::error!(error = %e, "cannot create the transaction state topic");
                    return None;
                }
                Some((
                    b.config.node_id,
                    b.config.advertised_host.clone(),
                    b.config.advertised_port,
                ))
            }
            Topology::Cluster(c) => c.txn_coordinator(txn_id),
        }
    }

    /// Writes a transaction marker to `topic`/`partition` and waits until it is committed:
    /// here when this node leads the partition, with WriteTxnMarkers to its leader otherwise.
    pub fn write_marker(
        &self,
        b: &Arc<Broker>,
        topic: &str,
        partition: i32,
        producer_id: i64,
        producer_epoch: i16,
        marker: ControlRecord,
    ) -> BoxFuture<'static, Result<(), ResponseError>> {
        let b = b.clone();
        let topic = topic.to_string();
        match self {
            Topology::Standalone => Box::pin(async move {
                crate::transactions::write_marker_here(
                    &b,
                    &topic,
                    partition,
                    producer_id,
                    producer_epoch,
                    marker,
                )
                .await
            }),
            Topology::Cluster(c) => {
                let c = c.clone();
                Box::pin(async move {
                    crate::cluster::write_marker(
                        &b,
                        &c,
                        &topic,
                        partition,
                        producer_id,
                        producer_epoch,
                        marker,
                    )
                    .await
                })
            }
        }
    }

    /// Admits a replica's fetch of `p` (a partition of `topic`) at this leader: nothing
    /// replicates from a standalone broker; in a cluster the fetch counts as the follower's
    /// progress and may propose an ISR expansion. `None` admits it.
    pub fn admit_replica_fetch(
        &self,
        topic: &Topic,
        p: &Arc<Partition>,
        follower: i32,
        fetch: &FetchPartition,
        now_ms: u64,
    ) -> Option<ResponseError> {
        let Topology::Cluster(c) = self else {
            return Some(ResponseError::NotLeaderOrFollower);
        };
        match replica::admit_replica_fetch(
            p,
            follower,
            fetch.current_leader_epoch,
            fetch.fetch_offset,
            fetch.log_start_offset,
            now_ms,
        ) {
            Ok(Some(change)) => {
                c.request_isr_change(&topic.name, p.clone(), change);
                None
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(topic = %topic.name, partition = p.index, follower, "replica fetch refused: the fetching broker holds no replica of this partition here");
                Some(e)
            }
        }
    }

    /// The leader-side replication throttle rate (bytes per second) set for this broker.
    pub fn leader_throttle_rate(&self) -> Option<u64> {
        self.cluster().and_then(|c| c.leader_throttle_rate())
    }

    /// Under a leader throttle of `rate`, how many bytes a replica fetch of `topic`-`index`
    /// may take now (0 while the rate is used up); `None` when the replica is not throttled.
    pub fn leader_throttle_budget(&self, rate: u64, topic: &Topic, index: i32) -> Option<usize> {
        self.cluster()
            .and_then(|c| c.leader_throttle_budget(rate, topic, index))
    }

    /// Counts bytes a fetch served under the leader-side throttle.
    pub fn record_leader_throttled(&self, bytes: usize) {
        if let Some(c) = self.cluster() {
            c.record_leader_throttled(bytes);
        }
    }

    /// DescribeConfigs of broker `name`: a standalone broker's static settings; in a cluster
    /// its settings plus the dynamic ones from the image (`""`: the cluster-wide defaults).
    pub(crate) fn broker_configs(
        &self,
        b: &Broker,
        name: &str,
    ) -> Result<Vec<handlers::configs::Entry>, (ResponseError, String)> {
        match self {
            Topology::Standalone => handlers::configs::own_broker_entries(b, name),
            Topology::Cluster(c) => handlers::configs::cluster_broker_entries(b, c, name),
        }
    }

    /// IncrementalAlterConfigs of a broker: dynamic configs through the quorum in a cluster;
    /// a standalone broker's disk watermark in its data dir (its other settings are fixed at
    /// start-up).
    pub(crate) fn alter_broker_configs(
        &self,
        b: &Broker,
        r: &spate_protocol::messages::incremental_alter_configs_request::AlterConfigsResource,
        validate_only: bool,
    ) -> Result<(), TopicError> {
        match self {
            Topology::Standalone => {
                handlers::configs::alter_standalone_broker_configs(b, r, validate_only)
            }
            Topology::Cluster(c) => {
                handlers::configs::alter_cluster_broker_configs(c, r, validate_only)
            }
        }
    }

    /// AlterPartitionReassignments.
    pub fn alter_reassignments(
        &self,
        b: &Broker,
        version: i16,
        req: AlterPartitionReassignmentsRequest,
    ) -> Work<AlterPartitionReassignmentsResponse> {
        match self {
            Topology::Standalone => {
                Work::Now(crate::cluster::standalone_reassignments(b, version, req))
            }
            Topology::Cluster(c) => Work::Quorum(Box::pin(crate::cluster::alter_reassignments(
                c.clone(),
                version,
                req,
            ))),
        }
    }

    /// ElectLeaders.
    pub fn elect_leaders(
        &self,
        b: &Broker,
        version: i16,
        req: ElectLeadersRequest,
    ) -> Work<ElectLeadersResponse> {
        match self {
            Topology::Standalone => Work::Now(crate::cluster::standalone_elect_leaders(b, req)),
            Topology::Cluster(c) => Work::Quorum(Box::pin(crate::cluster::elect_leaders(
                c.clone(),
                version,
                req,
            ))),
        }
    }
}

/// A cluster id as Kafka prints one: 16 bytes in URL-safe base64 without padding.
pub(crate) fn cluster_id_text(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A broker as DescribeCluster shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerView {
    /// Broker id.
    pub id: i32,
    /// Advertised Kafka host.
    pub host: String,
    /// Advertised Kafka port.
    pub port: i32,
    /// Rack, if configured.
    pub rack: Option<String>,
    /// Registered but not live.
    pub fenced: bool,
}
