//! Cluster mode: this broker as one node of a replicated cluster (KRaft's combined mode).
//!
//! The metadata quorum (`spate_cluster::node::MetadataNode`) says who leads what. This module
//! turns that into local state and traffic:
//! - [`reconcile`]: every new metadata image creates and deletes local topics and partitions
//!   and sets each partition's role (leader with its ISR view, follower of some leader);
//! - [`fetcher`]: a follower fetches from its leader with the Kafka Fetch API as a replica,
//!   after finding where its log diverges through OffsetForLeaderEpoch;
//! - the ISR tasks here: leaders propose ISR shrinks (followers that stopped catching up)
//!   and expansions (followers that caught up) to the quorum.

mod admin;
pub mod broker_configs;
mod fetcher;
mod operations;
mod peer;
mod reconcile;
mod security;
mod share;
mod throttle;
mod txn;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use spate_cluster::metadata::{BrokerId, CommandOutcome, MetadataCommand, MetadataImage};
use spate_cluster::node::{BrokerInfo, BrokerSession, MetadataNode, ProposeError};
use spate_cluster::replication::IsrChange;
use spate_metrics::Counter;
use tokio::sync::{mpsc, watch};

pub use admin::{
    create_partitions, create_topics, delete_topics, describe_metadata, metadata,
    metadata_may_create,
};
pub use fetcher::FollowerStatus;
pub use operations::{
    alter_reassignments, elect_leaders, list_reassignments, standalone_elect_leaders,
    standalone_reassignments, Move, OperationError,
};
pub use peer::{PeerConnection, PeerError, PeerPool};
pub use spate_cluster::transport::Transport;
pub(crate) use txn::{ask_coordinator, write_marker};

use crate::groups::OFFSETS_LOG;
use crate::partition::Partition;
use crate::replica::{self, isr_answer, IsrAnswer};
use crate::Broker;

/// Pause before applying an image again after a step of it failed.
const RECONCILE_RETRY: Duration = Duration::from_millis(500);

/// Longest a controlled shutdown waits for the controller to move leaderships away.
const CONTROLLED_SHUTDOWN_WAIT: Duration = Duration::from_secs(15);

/// How this node takes part in replication.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// A follower that has not caught up for this long leaves the ISR (Kafka's
    /// `replica.lag.time.max.ms`).
    pub replica_lag_time_max_ms: u64,
    /// Replication factor of auto-created topics and CreateTopics with -1.
    pub default_replication_factor: i16,
    /// How often this broker heartbeats to the controller.
    pub heartbeat_interval: Duration,
    /// How long a replica fetch waits on the leader for new records.
    pub replica_fetch_wait_max_ms: i32,
    /// Most bytes one replica fetch asks per partition.
    pub replica_fetch_max_bytes: i32,
    /// Most bytes in one replica fetch response.
    pub replica_fetch_response_max_bytes: i32,
    /// The HTTP address other nodes reach this one at (search fan-out, ingest routing).
    pub advertised_http: Option<String>,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            replica_lag_time_max_ms: 30_000,
            default_replication_factor: 3,
            heartbeat_interval: Duration::from_millis(1000),
            replica_fetch_wait_max_ms: 500,
            replica_fetch_max_bytes: 1 << 20,
            replica_fetch_response_max_bytes: 10 << 20,
            advertised_http: None,
        }
    }
}

/// Replication counters of this node.
#[derive(Debug, Default)]
pub struct ClusterMetrics {
    /// ISR shrinks this node committed as leader.
    pub isr_shrinks: Counter,
    /// ISR expansions this node committed as leader.
    pub isr_expands: Counter,
    /// Records removed from follower logs by divergence truncation.
    pub truncated_records: Counter,
    /// Bytes fetched for replicas under a follower replication throttle.
    pub throttled_bytes: Counter,
    /// Fetches that left throttled replicas out because the throttle rate was used up.
    pub throttled_fetches: Counter,
    /// Bytes this node served as a leader to followers of replicas under a leader throttle.
    pub leader_throttled_bytes: Counter,
}

/// An ISR change a leader wants committed.
struct IsrProposal {
    topic: String,
    partition: Arc<Partition>,
    change: IsrChange,
}

/// The parts of this broker that the cluster's tasks keep in line with the metadata: what
/// [`Cluster`] holds instead of a handle on the whole broker (which owns the cluster).
pub(crate) struct Local {
    /// Topics and partitions on this node.
    pub(crate) topics: Arc<crate::registry::TopicRegistry>,
    /// Group coordinators of the offsets partitions this node leads.
    pub(crate) groups: Arc<crate::GroupService>,
    /// Client quotas every node applies from the image.
    pub(crate) quotas: Arc<crate::quotas::ClientQuotas>,
    /// The broker's clock.
    pub(crate) clock: crate::time::SharedClock,
    /// Under an fsync profile leaders count, and followers report, only what is on disk.
    pub(crate) sync_acks: bool,
    /// offsets.topic.num.partitions, for the offsets topic the controller creates.
    pub(crate) offsets_partitions: i32,
    /// offsets.topic.segment.bytes.
    pub(crate) offsets_segment_bytes: u64,
    /// Transaction coordinators of the `__transaction_state` partitions this node leads.
    pub(crate) txns: Arc<crate::transactions::TxnService>,
    /// Where the cluster's credentials and ACLs are copied to.
    pub(crate) security: security::SecurityTables,
    /// The data dir's free space: a full disk stops replica fetches of client topics.
    pub(crate) disk: Arc<crate::disk::DiskSpace>,
    /// Share groups: membership, share-partitions this node leads, share coordinators of
    /// the `__share_group_state` partitions it leads.
    pub(crate) shares: Arc<crate::share::ShareService>,
}

/// This node's part in the cluster; lives inside [`Broker`] once joined.
pub struct Cluster {
    /// Itself, for the tasks it starts (fetchers) to hold without keeping it alive.
    me: std::sync::Weak<Cluster>,
    local: Local,
    node: MetadataNode,
    broker_id: BrokerId,
    settings: ClusterSettings,
    derived_cluster_id: String,
    /// A proposal fixing the cluster id is out.
    setting_cluster_id: AtomicBool,
    session: Mutex<Option<BrokerSession>>,
    follows: fetcher::Follows,
    isr_tx: mpsc::UnboundedSender<IsrProposal>,
    isr_rx: Mutex<Option<mpsc::UnboundedReceiver<IsrProposal>>>,
    /// The last image every local partition was brought in line with.
    reconciled: watch::Sender<Option<Arc<MetadataImage>>>,
    /// Bumped when this broker's session lease is lost or regained: the current image is
    /// applied again, since whether this broker may lead changed without a new image.
    resync: watch::Sender<u64>,
    stopping: AtomicBool,
    /// A proposal creating the offsets topic is out.
    creating_offsets_topic: AtomicBool,
    /// A proposal to create `__transaction_state` is out (it is created on first use).
    creating_txn_topic: AtomicBool,
    /// A proposal to create `__share_group_state` is out (it is created on first use).
    creating_share_topic: AtomicBool,
    /// Connections to other brokers for transaction markers and KIP-890 verifications.
    pub(crate) txn_peers: PeerPool,
    /// This node's producer-id block: next id and end (exclusive).
    producer_ids: Mutex<(i64, i64)>,
    /// Follower-side replication throttle shared by this node's fetchers.
    follower_throttle: throttle::ByteRate,
    /// Leader-side replication throttle over what this node serves to followers.
    leader_throttle: throttle::ByteRate,
    /// Replication counters.
    pub metrics: ClusterMetrics,
}

impl Cluster {
    /// This node's broker id.
    pub fn broker_id(&self) -> BrokerId {
        self.broker_id
    }

    /// The metadata quorum node.
    pub fn node(&self) -> &MetadataNode {
        &self.node
    }

    /// Settings of cluster mode.
    pub fn settings(&self) -> &ClusterSettings {
        &self.settings
    }

    /// The cluster id every node reports: fixed in the metadata by the first controller
    /// (derived from the founding peers, which is also the answer until then).
    pub fn cluster_id(&self) -> String {
        self.image()
            .cluster_id()
            .map_or_else(|| self.derived_cluster_id.clone(), str::to_owned)
    }

    /// This node's leader-side replication throttle rate (bytes per second), when one is set;
    /// read once per replica fetch.
    pub(crate) fn leader_throttle_rate(&self) -> Option<u64> {
        broker_configs::throttle_rate(
            &self.image(),
            self.broker_id,
            "leader.replication.throttled.rate",
        )
    }

    /// Under a leader throttle of `rate`, how many bytes a replica fetch of
    /// `topic`-`partition` may take now (0 while the rate is used up); `None` when the
    /// topic does not list this replica as throttled.
    pub(crate) fn leader_throttle_budget(
        &self,
        rate: u64,
        topic: &crate::registry::Topic,
        partition: i32,
    ) -> Option<usize> {
        let listed = topic.with_config(|c| {
            c.get("leader.replication.throttled.replicas")
                .is_some_and(|(v, _)| crate::topic_config::throttles(v, partition, self.broker_id))
        });
        if !listed {
            return None;
        }
        if self
            .leader_throttle
            .may_fetch(rate, std::time::Instant::now())
        {
            Some(usize::try_from(rate).unwrap_or(usize::MAX).max(1))
        } else {
            Some(0)
        }
    }

    /// Counts bytes served under the leader-side throttle.
    pub(crate) fn record_leader_throttled(&self, bytes: usize) {
        self.leader_throttle.record(bytes);
        self.metrics.leader_throttled_bytes.add(bytes as u64);
    }

    /// The latest metadata image this node applied.
    pub fn image(&self) -> Arc<MetadataImage> {
        self.node.image()
    }

    /// The controller (Raft leader) this node knows of.
    pub fn controller_id(&self) -> Option<BrokerId> {
        self.node
            .leader_id()
            .and_then(|id| BrokerId::try_from(id).ok())
    }

    /// The current broker epoch, once registered.
    pub fn broker_epoch(&self) -> Option<i64> {
        self.session
            .lock()
            .as_ref()
            .and_then(|s| *s.epoch().borrow())
    }

    /// Proposes a command to the quorum from this node.
    pub async fn propose(&self, cmd: MetadataCommand) -> Result<CommandOutcome, ProposeError> {
        self.node.propose(cmd).await
    }

    /// Waits until local partitions reflect an image for which `ready` holds, at most
    /// `timeout`; returns whether it happened.
    pub async fn wait_reconciled(
        &self,
        timeout: Duration,
        ready: impl Fn(&MetadataImage) -> bool,
    ) -> bool {
        let mut rx = self.reconciled.subscribe();
        let wait = async {
            loop {
                if rx.borrow_and_update().as_deref().is_some_and(&ready) {
                    return true;
                }
                if rx.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.unwrap_or(false)
    }

    /// Whether `image` holds this process's current registration: proof that the image is
    /// at least as new as everything the quorum had committed when this process registered.
    fn holds_own_registration(&self, image: &MetadataImage) -> bool {
        let Some(epoch) = self.broker_epoch() else {
            return false;
        };
        image
            .broker(self.broker_id)
            .is_some_and(|b| b.epoch == epoch)
    }

    /// Waits until local partitions reflect an image that holds this process's registration:
    /// the node has caught up with the metadata quorum, and what it answers about leaders,
    /// ISRs and offsets is no older than the quorum's state when it started. Kafka requests
    /// are not answered before this (as a Kafka broker starts its request processing only
    /// once it has caught up with the metadata log).
    pub async fn caught_up(&self) {
        let mut rx = self.reconciled.subscribe();
        loop {
            let done = rx
                .borrow_and_update()
                .as_deref()
                .is_some_and(|image| self.holds_own_registration(image));
            if done {
                return;
            }
            // The broker epoch arrives on another channel: look again now and then too.
            tokio::select! {
                r = rx.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }

    /// Whether the node is ready to serve: registered, a controller known, local state
    /// brought in line with the metadata, and every partition it follows caught up to its
    /// leader's high watermark.
    pub fn readiness(&self) -> Result<(), String> {
        if self.broker_epoch().is_none() {
            return Err("not registered with the controller yet".into());
        }
        if self.controller_id().is_none() {
            return Err("no controller known".into());
        }
        let Some(applied) = self.reconciled.borrow().clone() else {
            return Err("metadata not applied to local partitions yet".into());
        };
        if !self.holds_own_registration(&applied) {
            return Err("not caught up with the metadata quorum yet".into());
        }
        // Once enough brokers are up for the offsets topic it is about to exist, and this
        // node is about to follow some of its partitions: ready before that would be ready
        // for a moment, then catching up.
        if applied.topic(OFFSETS_LOG).is_none()
            && self.image().live_brokers().count() >= self.offsets_replication_factor()
        {
            return Err(format!("{OFFSETS_LOG} not created and applied yet"));
        }
        let lagging = self.follows.lagging();
        if !lagging.is_empty() {
            return Err(format!(
                "replicas still catching up: {}",
                lagging.join(", ")
            ));
        }
        Ok(())
    }

    /// The offsets topic's replication factor: three, or every voter in a smaller cluster.
    fn offsets_replication_factor(&self) -> usize {
        self.node.peers().len().min(3)
    }

    /// The node that coordinates `group`: the leader of the group's offsets partition, where
    /// its commits are stored, so the coordinator moves with it on failover and finds every
    /// committed offset there.
    pub fn group_coordinator(&self, group: &str) -> Option<(BrokerId, String, i32)> {
        let image = self.image();
        let count = image.topic(OFFSETS_LOG)?.partitions.len();
        let index = crate::groups::offsets_partition_for(group, count);
        let leader = image.partition(OFFSETS_LOG, index as i32)?.leader?;
        let reg = image.broker(leader).filter(|r| !r.fenced)?;
        Some((reg.id, reg.kafka_host.clone(), i32::from(reg.kafka_port)))
    }

    /// The node that coordinates transactional id `txn_id`: the leader of its
    /// `__transaction_state` partition, where its state is stored. The topic is created on
    /// first use, as Kafka does (`None` until it exists and has a leader).
    pub fn txn_coordinator(&self, txn_id: &str) -> Option<(BrokerId, String, i32)> {
        let image = self.image();
        let Some(topic) = image.topic(spate_txn::TXN_LOG) else {
            self.create_txn_topic(&image);
            return None;
        };
        let count = topic.partitions.len();
        let index = spate_txn::txn_partition_for(txn_id, count);
        let leader = image.partition(spate_txn::TXN_LOG, index as i32)?.leader?;
        let reg = image.broker(leader).filter(|r| !r.fenced)?;
        Some((reg.id, reg.kafka_host.clone(), i32::from(reg.kafka_port)))
    }

    /// How this node connects to the others (plain or mutual TLS).
    pub fn transport(&self) -> &spate_cluster::transport::Transport {
        self.node.transport()
    }

    /// The inter-node address of live broker `id`, where Kafka requests between brokers go.
    pub fn node_addr(&self, id: BrokerId) -> Option<String> {
        self.image()
            .broker(id)
            .filter(|r| !r.fenced)
            .map(|r| r.inter_node_addr.clone())
    }

    /// Each followed partition's fetch state, for status pages.
    pub fn follower_status(&self) -> Vec<FollowerStatus> {
        self.follows.status()
    }

    /// Stops heartbeating (with `controlled`, asks the controller to move leaderships away
    /// first) and stops fetching.
    ///
    /// A controlled leave waits (at most `CONTROLLED_SHUTDOWN_WAIT`) until the quorum has
    /// fenced this broker: its leaderships have moved and it has left every ISR it was not
    /// the last member of, so acks=all producers see the change at once and this node's vote
    /// is still there to commit it.
    pub async fn leave(&self, controlled: bool) {
        let session = self.session.lock().take();
        if let Some(s) = session {
            s.stop(controlled).await;
        }
        if controlled {
            let me = self.broker_id;
            let mut images = self.node.subscribe();
            let fenced = async {
                loop {
                    let done = images
                        .borrow_and_update()
                        .broker(me)
                        .is_none_or(|b| b.fenced);
                    if done || images.changed().await.is_err() {
                        return;
                    }
                }
            };
            if tokio::time::timeout(CONTROLLED_SHUTDOWN_WAIT, fenced)
                .await
                .is_err()
            {
                tracing::warn!("controlled shutdown: the controller did not fence this broker in time; stopping anyway");
            }
        }
        self.stopping.store(true, Ordering::SeqCst);
        self.follows.stop_all();
    }
}

/// A cluster id from the voter set: the same on every node of one cluster.
fn cluster_id_for(node: &MetadataNode) -> String {
    use std::hash::{Hash, Hasher};
    // Two independent 64-bit hashes of the sorted voter list make the 128 bits Kafka prints.
    let mut bytes = [0u8; 16];
    for (i, salt) in [0x5bd1e995u64, 0x27d4eb2f165667c5].iter().enumerate() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        salt.hash(&mut h);
        for (id, addr) in node.peers() {
            id.hash(&mut h);
            addr.hash(&mut h);
        }
        bytes[i * 8..i * 8 + 8].copy_from_slice(&h.finish().to_be_bytes());
    }
    crate::topology::cluster_id_text(&bytes)
}

impl Broker {
    /// The cluster this broker is a node of, when started in cluster mode.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.get()
    }

    /// Joins the cluster through a started metadata node: registers and heartbeats, keeps
    /// local partitions in line with every metadata image, fetches as a follower and
    /// proposes ISR changes as a leader. Call once, before serving clients.
    pub fn join_cluster(
        self: &Arc<Self>,
        node: MetadataNode,
        settings: ClusterSettings,
    ) -> Result<Arc<Cluster>, crate::BrokerError> {
        let broker_id = BrokerId::try_from(node.node_id()).map_err(|_| {
            crate::BrokerError::Cluster(format!("node id {} is not a broker id", node.node_id()))
        })?;
        let (isr_tx, isr_rx) = mpsc::unbounded_channel();
        let local = Local {
            topics: self.topics.clone(),
            groups: self.groups.clone(),
            quotas: self.quotas.clone(),
            clock: self.clock.clone(),
            sync_acks: self.config.fsync.acks_wait_for_fsync(),
            offsets_partitions: self.config.groups.offsets_partitions,
            offsets_segment_bytes: self.config.groups.offsets_segment_bytes,
            txns: self.txns.clone(),
            shares: self.shares.clone(),
            disk: self.disk.clone(),
            security: security::SecurityTables {
                credentials: self.credentials.clone(),
                authorizer: self.authorizer.clone(),
                bootstrap_users: self.config.security.bootstrap_users.clone(),
            },
        };
        let cluster = Arc::new_cyclic(|me| Cluster {
            me: me.clone(),
            local,
            derived_cluster_id: cluster_id_for(&node),
            setting_cluster_id: AtomicBool::new(false),
            broker_id,
            follows: fetcher::Follows::new(),
            session: Mutex::new(None),
            isr_tx,
            isr_rx: Mutex::new(Some(isr_rx)),
            reconciled: watch::Sender::new(None),
            resync: watch::Sender::new(0),
            stopping: AtomicBool::new(false),
            creating_offsets_topic: AtomicBool::new(false),
            creating_txn_topic: AtomicBool::new(false),
            creating_share_topic: AtomicBool::new(false),
            txn_peers: PeerPool::new("spate-txn", 4),
            producer_ids: Mutex::new((0, 0)),
            follower_throttle: throttle::ByteRate::new(),
            leader_throttle: throttle::ByteRate::new(),
            metrics: ClusterMetrics::default(),
            settings,
            node,
        });
        if self.cluster.set(cluster.clone()).is_err() {
            return Err(crate::BrokerError::Cluster(
                "this broker already joined a cluster".into(),
            ));
        }
        let info = BrokerInfo {
            kafka_host: self.config.advertised_host.clone(),
            kafka_port: u16::try_from(self.config.advertised_port).unwrap_or(0),
            rack: None,
            http_addr: cluster.settings.advertised_http.clone(),
            listeners: self
                .config
                .listeners
                .iter()
                .map(|l| spate_cluster::metadata::ListenerAddress {
                    name: l.protocol.name().to_owned(),
                    host: l.host.clone(),
                    port: l.port,
                })
                .collect(),
        };
        self.groups.set_clustered();
        self.txns.set_clustered();
        self.shares
            .set_route(Arc::new(Arc::new(share::ClusterStates {
                cluster: Arc::downgrade(&cluster),
                peers: PeerPool::new("spate-share", 4),
            })));
        let session = cluster
            .node
            .start_broker_session(info, cluster.settings.heartbeat_interval);
        *cluster.session.lock() = Some(session);
        tokio::spawn(reconcile_loop(Arc::downgrade(&cluster)));
        tokio::spawn(security::sync_loop(Arc::downgrade(&cluster)));
        tokio::spawn(watch_lease(Arc::downgrade(&cluster)));
        if let Some(rx) = cluster.isr_rx.lock().take() {
            tokio::spawn(propose_isr_changes(Arc::downgrade(&cluster), rx));
        }
        tokio::spawn(check_isr_loop(Arc::downgrade(&cluster)));
        Ok(cluster)
    }
}

/// Brings local partitions in line with each new image, once the node has caught up with
/// the quorum (an image from before that could delete topics that exist).
async fn reconcile_loop(cluster: std::sync::Weak<Cluster>) {
    let Some(cluster) = cluster.upgrade() else {
        return;
    };
    let mut images = cluster.node.subscribe();
    let mut resync = cluster.resync.subscribe();
    // An image from before this node caught up could delete topics that exist or show
    // leaderships long gone. The commit index restored from the local log proves nothing
    // (it may be far behind the quorum's); this process's own registration does: the leader
    // committed it, so once it is applied here, so is everything committed before it.
    loop {
        if cluster.stopping.load(Ordering::SeqCst) {
            return;
        }
        if cluster.holds_own_registration(&images.borrow_and_update()) {
            break;
        }
        tokio::select! {
            _ = images.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    // The last image applied in full (with the broker epoch then): the next one is applied
    // against it, touching only what changed.
    let mut applied: Option<(reconcile::Baseline, Option<i64>)> = None;
    loop {
        let image = images.borrow_and_update().clone();
        let epoch = cluster.broker_epoch();
        // Images that change nothing about topics or the brokers' registrations need no work.
        let same = applied.as_ref().is_some_and(|(prev, prev_epoch)| {
            *prev_epoch == epoch && reconcile::same_for_replication(&prev.image, &image)
        });
        let mut retry = false;
        if !same {
            let c = cluster.clone();
            let img = image.clone();
            // A changed broker epoch asks for a full pass, as does a first one.
            let baseline = applied
                .take()
                .filter(|(_, prev_epoch)| *prev_epoch == epoch)
                .map(|(base, _)| base);
            let done =
                tokio::task::spawn_blocking(move || reconcile::apply(&c, &img, baseline.as_ref()))
                    .await;
            match done {
                Ok((true, may_lead)) => {
                    applied = Some((
                        reconcile::Baseline {
                            image: image.clone(),
                            may_lead,
                        },
                        epoch,
                    ))
                }
                // Not marked applied: the same image is applied again after a pause, even if
                // no newer one comes, so a partition is not left in its old role until some
                // unrelated change.
                Ok((false, _)) => retry = true,
                Err(e) => {
                    tracing::error!(error = %e, "applying metadata to local partitions failed; retrying");
                    retry = true;
                }
            }
        }
        // Applied with every image (not only those changing topics), before it counts as
        // applied: a describe after an alter waits for that.
        cluster
            .local
            .shares
            .group_configs()
            .replace_all(image.group_configs());
        cluster.reconciled.send_replace(Some(image.clone()));
        cluster
            .local
            .quotas
            .set_table(image.client_quotas().clone());
        ensure_offsets_topic(&cluster, &image);
        ensure_cluster_id(&cluster, &image);
        let pause = if retry {
            RECONCILE_RETRY
        } else {
            Duration::MAX
        };
        tokio::select! {
            r = images.changed() => if r.is_err() { return },
            r = resync.changed() => {
                if r.is_err() { return }
                retry = true;
            }
            _ = tokio::time::sleep(pause) => {}
        }
        if retry {
            applied = None;
        }
        if cluster.stopping.load(Ordering::SeqCst) {
            return;
        }
    }
}

/// The controller fixes the cluster id in the metadata once, as the id derived from the
/// founding peers, so it stays the same as nodes join and leave.
fn ensure_cluster_id(cluster: &Arc<Cluster>, image: &MetadataImage) {
    if image.cluster_id().is_some() || !cluster.node.is_leader() {
        return;
    }
    if cluster.setting_cluster_id.swap(true, Ordering::SeqCst) {
        return;
    }
    let c = cluster.clone();
    tokio::spawn(async move {
        let cmd = MetadataCommand::SetClusterId {
            cluster_id: c.derived_cluster_id.clone(),
        };
        if let Err(e) = c.propose(cmd).await {
            tracing::debug!(error = %e, "fixing the cluster id failed; retried on the next image");
        }
        c.setting_cluster_id.store(false, Ordering::SeqCst);
    });
}

impl Cluster {
    /// Proposes `__transaction_state` (transaction.state.log.num.partitions partitions,
    /// replicated like the offsets topic, no retention), once at a time.
    fn create_txn_topic(&self, image: &MetadataImage) {
        let settings = self.local.txns.settings();
        self.create_on_first_use(
            image,
            spate_txn::TXN_LOG,
            settings.partitions.max(1),
            settings.segment_bytes,
            |c| &c.creating_txn_topic,
        );
    }

    /// Proposes internal topic `name` (`partitions` partitions, replicated like the offsets
    /// topic, compacted, no retention) once enough brokers are up, one proposal at a time
    /// (`creating` is its flag); Kafka creates these on first use too.
    pub(crate) fn create_on_first_use(
        &self,
        image: &MetadataImage,
        name: &'static str,
        partitions: i32,
        segment_bytes: u64,
        creating: fn(&Cluster) -> &AtomicBool,
    ) {
        let rf = self.offsets_replication_factor();
        if image.live_brokers().count() < rf {
            return;
        }
        let cmd = match spate_cluster::controller::create_topic_command(
            image,
            name,
            uuid::Uuid::new_v4(),
            partitions,
            rf as i16,
            crate::groups::offsets_topic_config(segment_bytes)
                .overrides()
                .clone(),
        ) {
            Ok(cmd) => cmd,
            Err(e) => {
                tracing::warn!(topic = name, error = %e, "cannot place an internal topic yet");
                return;
            }
        };
        if creating(self).swap(true, Ordering::SeqCst) {
            return;
        }
        let Some(c) = self.me.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            match c.propose(cmd).await {
                Ok(_) => tracing::info!(
                    topic = name,
                    replication_factor = rf,
                    "created a replicated internal topic"
                ),
                Err(e) => {
                    tracing::info!(topic = name, error = %e, "creating an internal topic did not go through; retried on the next request")
                }
            }
            creating(&c).store(false, Ordering::SeqCst);
        });
    }
}

/// The controller creates the replicated offsets topic once enough brokers are up to give it
/// its full replication factor (three, or every voter in a smaller cluster), with
/// offsets.topic.num.partitions partitions and no retention.
fn ensure_offsets_topic(cluster: &Arc<Cluster>, image: &MetadataImage) {
    if !cluster.node.is_leader() {
        return;
    }
    if image.topic(OFFSETS_LOG).is_some() {
        compact_internal_topics(cluster, image);
        return;
    }
    let rf = cluster.offsets_replication_factor();
    if image.live_brokers().count() < rf {
        return;
    }
    let cmd = match spate_cluster::controller::create_topic_command(
        image,
        OFFSETS_LOG,
        uuid::Uuid::new_v4(),
        cluster.local.offsets_partitions.max(1),
        rf as i16,
        crate::groups::offsets_topic_config(cluster.local.offsets_segment_bytes)
            .overrides()
            .clone(),
    ) {
        Ok(cmd) => cmd,
        Err(e) => {
            tracing::warn!(error = %e, "cannot place the offsets topic {OFFSETS_LOG} yet");
            return;
        }
    };
    // One proposal at a time; images arrive with every heartbeat.
    if cluster.creating_offsets_topic.swap(true, Ordering::SeqCst) {
        return;
    }
    let c = cluster.clone();
    tokio::spawn(async move {
        match c.propose(cmd).await {
            Ok(_) => tracing::info!(
                replication_factor = rf,
                "created the replicated offsets topic {OFFSETS_LOG}"
            ),
            Err(e) => {
                tracing::info!(error = %e, "creating {OFFSETS_LOG} did not go through; retried on the next image")
            }
        }
        c.creating_offsets_topic.store(false, Ordering::SeqCst);
    });
}

/// The controller makes the internal topics an earlier version created (kept small by
/// rewrites of their own, no cleanup policy) compacted, as they are created now; a cleanup
/// policy someone set on purpose is left alone.
fn compact_internal_topics(cluster: &Arc<Cluster>, image: &MetadataImage) {
    let Some(name) = [OFFSETS_LOG, spate_txn::TXN_LOG].into_iter().find(|name| {
        image
            .topic(name)
            .is_some_and(|t| !t.configs.contains_key("cleanup.policy"))
    }) else {
        return;
    };
    if cluster.creating_offsets_topic.swap(true, Ordering::SeqCst) {
        return;
    }
    let cmd = MetadataCommand::AlterTopicConfigs {
        name: name.to_string(),
        set: [("cleanup.policy".to_string(), "compact".to_string())].into(),
        remove: Vec::new(),
    };
    let c = cluster.clone();
    tokio::spawn(async move {
        match c.propose(cmd).await {
            Ok(_) => tracing::info!(topic = name, "internal topic is compacted from now on"),
            Err(e) => {
                tracing::info!(topic = name, error = %e, "compacting an internal topic did not go through; retried on the next image")
            }
        }
        c.creating_offsets_topic.store(false, Ordering::SeqCst);
    });
}

/// Most ISR changes proposed in one metadata entry.
const ISR_CHANGES_PER_PROPOSAL: usize = 1000;

/// Proposes the ISR changes leaders ask for, one at a time per partition (the partition
/// itself refuses a second while one is out), and everything queued meanwhile in the same
/// entry (`MetadataCommand::Each`, as Kafka's AlterPartition carries many partitions): after
/// a broker returns, its partitions' expansions take a few Raft rounds, not one each.
async fn propose_isr_changes(
    cluster: std::sync::Weak<Cluster>,
    mut rx: mpsc::UnboundedReceiver<IsrProposal>,
) {
    while let Some(first) = rx.recv().await {
        let mut queued = vec![first];
        while queued.len() < ISR_CHANGES_PER_PROPOSAL {
            match rx.try_recv() {
                Ok(p) => queued.push(p),
                Err(_) => break,
            }
        }
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        let mut cmds: Vec<MetadataCommand> = queued
            .iter()
            .map(|p| MetadataCommand::AlterIsr {
                topic: p.topic.clone(),
                partition: p.partition.index,
                leader: cluster.broker_id,
                leader_epoch: p.change.leader_epoch,
                partition_epoch: p.change.partition_epoch,
                isr: p.change.isr.clone(),
            })
            .collect();
        let cmd = if cmds.len() == 1 {
            cmds.remove(0)
        } else {
            MetadataCommand::Each(cmds)
        };
        let answers: Vec<Result<(), ProposeError>> = match cluster.propose(cmd).await {
            Ok(CommandOutcome::Each(results)) => results
                .into_iter()
                .map(|r| r.map(|_| ()).map_err(ProposeError::Refused))
                .collect(),
            Ok(_) => queued.iter().map(|_| Ok(())).collect(),
            Err(ProposeError::Refused(e)) if queued.len() == 1 => {
                vec![Err(ProposeError::Refused(e))]
            }
            Err(e) => {
                // Unanswered (or the entry itself refused): the same for every change.
                let why = e.to_string();
                queued
                    .iter()
                    .map(|_| Err(ProposeError::Stopped(why.clone())))
                    .collect()
            }
        };
        for (p, answer) in queued.into_iter().zip(answers) {
            settle_isr_change(&cluster, p, answer);
        }
    }
}

/// Acts on the quorum's answer to one proposed ISR change.
fn settle_isr_change(cluster: &Cluster, p: IsrProposal, answer: Result<(), ProposeError>) {
    let refusal = match &answer {
        Ok(()) => Ok(Ok(())),
        Err(ProposeError::Refused(e)) => Ok(Err(e)),
        Err(_) => Err(()),
    };
    let verdict = isr_answer(refusal);
    replica::settle_isr_change(&p.partition, &p.change, verdict);
    match verdict {
        IsrAnswer::Applied => {
            let shrink = p
                .partition
                .leader_view()
                .is_some_and(|l| p.change.isr.len() < l.isr().len());
            tracing::info!(topic = %p.topic, partition = p.partition.index, isr = ?p.change.isr, "ISR changed");
            if shrink {
                cluster.metrics.isr_shrinks.inc();
            } else {
                cluster.metrics.isr_expands.inc();
            }
        }
        IsrAnswer::Overtaken => {
            tracing::debug!(topic = %p.topic, partition = p.partition.index, "ISR change overtaken by a newer partition state");
        }
        IsrAnswer::NeverApplied => {
            tracing::info!(topic = %p.topic, partition = p.partition.index, isr = ?p.change.isr, answer = ?answer.err(), "ISR change refused");
        }
        IsrAnswer::Unanswered => {
            tracing::info!(topic = %p.topic, partition = p.partition.index, isr = ?p.change.isr, answer = ?answer.err(), "ISR change unanswered; retrying");
            let me = cluster.me.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let still_pending = p.partition.leader_view().is_some_and(|l| {
                    l.leader_epoch() == p.change.leader_epoch
                        && l.pending_isr() == Some(p.change.isr.as_slice())
                });
                if let (true, Some(c)) = (still_pending, me.upgrade()) {
                    let _ = c.isr_tx.send(p);
                }
            });
        }
    }
}

/// How often a broker checks that its heartbeats still commit.
const LEASE_CHECK: Duration = Duration::from_millis(100);

/// Watches this broker's session lease: a broker whose heartbeats have not committed for the
/// session timeout (cut off from the quorum, or paused) may already have been fenced and
/// replaced as leader, so it steps down from every leadership rather than go on taking
/// produces and serving a frozen high watermark; it leads again once a heartbeat commits
/// and the image still names it.
async fn watch_lease(cluster: std::sync::Weak<Cluster>) {
    let mut was_valid = false;
    loop {
        tokio::time::sleep(LEASE_CHECK).await;
        let Some(c) = cluster.upgrade() else { return };
        if c.stopping.load(Ordering::SeqCst) {
            return;
        }
        let valid = c.lease_valid();
        if valid != was_valid {
            if valid {
                tracing::info!("heartbeats commit again: leading what the metadata assigns here");
            } else if c.broker_epoch().is_some() {
                tracing::warn!("no heartbeat committed for the session timeout: stepping down from every leadership until the quorum answers");
            }
            was_valid = valid;
            c.resync.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// Every quarter of `replica.lag.time.max.ms`, each led partition drops followers that
/// stopped catching up.
async fn check_isr_loop(cluster: std::sync::Weak<Cluster>) {
    let every = match cluster.upgrade() {
        Some(c) => Duration::from_millis((c.settings.replica_lag_time_max_ms / 4).max(50)),
        None => return,
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        if cluster.stopping.load(Ordering::SeqCst) {
            return;
        }
        let now = cluster.local.clock.monotonic_ms().max(0) as u64;
        for topic in cluster.local.topics.list() {
            for p in topic.partitions() {
                if let Some(change) = p.check_isr(now) {
                    cluster.request_isr_change(&topic.name, p, change);
                }
            }
        }
    }
}

impl Cluster {
    /// Queues an ISR change for the quorum.
    pub(crate) fn request_isr_change(
        &self,
        topic: &str,
        partition: Arc<Partition>,
        change: IsrChange,
    ) {
        let proposal = IsrProposal {
            topic: topic.to_owned(),
            partition,
            change,
        };
        if let Err(e) = self.isr_tx.send(proposal) {
            // Only when shutting down: forget the change so a later check may retry.
            e.0.partition.isr_change_failed(&e.0.change);
        }
    }

    /// Whether this broker's heartbeats are reaching the quorum (see
    /// `BrokerSession::lease_valid`).
    pub(crate) fn lease_valid(&self) -> bool {
        self.session
            .lock()
            .as_ref()
            .is_some_and(|s| s.lease_valid())
    }

    /// Whether the image names this process's own registration, unfenced: only then may it
    /// lead. A restarted process whose old registration still stands must not resume the
    /// old one's leaderships (its log may be shorter than what it acknowledged); it waits
    /// until the controller fences the old registration and elects in a new epoch.
    fn registered_in(&self, image: &MetadataImage) -> bool {
        let Some(epoch) = self.broker_epoch() else {
            return false;
        };
        image
            .broker(self.broker_id)
            .is_some_and(|b| b.epoch == epoch && !b.fenced)
    }

    /// Brokers the image lists as fenced.
    fn fenced(image: &MetadataImage) -> BTreeSet<BrokerId> {
        image
            .brokers()
            .values()
            .filter(|b| b.fenced)
            .map(|b| b.id)
            .collect()
    }
}

/// Images for the cluster module's unit tests.
#[cfg(test)]
pub(crate) mod test_image {
    use spate_cluster::metadata::{MetadataCommand, MetadataImage};

    /// Registers broker `id` (Kafka port 9090 + id) in `image`.
    pub(crate) fn register(image: &mut MetadataImage, id: i32) {
        image
            .apply(&MetadataCommand::RegisterBroker {
                broker_id: id,
                incarnation: uuid::Uuid::from_u128(id as u128),
                inter_node_addr: format!("127.0.0.1:{}", 9100 + id),
                kafka_host: "127.0.0.1".into(),
                kafka_port: 9090 + u16::try_from(id).expect("a small broker id"),
                rack: None,
                http_addr: None,
                now_ms: 0,
                listeners: vec![],
            })
            .expect("register");
    }
}
