//! [`MetadataNode`]: one voter of the metadata quorum, wired together (storage, Raft,
//! transport, controller) and exposed the way a broker uses it: propose a command from any
//! node, watch the applied image, ask who leads.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use openraft::{Config, Raft, RaftMetrics, ServerState, SnapshotPolicy};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::controller::{reconcile, LivenessTracker, PassOptions};
use crate::heartbeat::{self, HeartbeatError};
use crate::membership::{Members, MembershipChange, MembershipError};
use crate::metadata::{BrokerId, CommandError, CommandOutcome, MetadataCommand, MetadataImage};
use crate::network::{
    serve, ClientWriteResult, NetworkFactory, PeerClient, PeerHealth, PeerServices,
};
use crate::raft::{open_storage, MetadataRaft, NodeId, PeerNode, StorageError};
use crate::transport::{KafkaHandoff, Transport};

/// A problem with the cluster configuration (peer list, node id).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The peer list is empty.
    #[error("--cluster-peers is empty; expected `1=host:port,2=host:port,3=host:port`")]
    EmptyPeers,
    /// An entry is not `id=host:port`.
    #[error("--cluster-peers entry {entry:?}: {reason}; expected `id=host:port`")]
    MalformedPeer {
        /// The entry.
        entry: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Two entries share an id.
    #[error("--cluster-peers names node {id} twice ({first} and {second})")]
    DuplicateId {
        /// The id.
        id: NodeId,
        /// First address.
        first: String,
        /// Second address.
        second: String,
    },
    /// Two ids share an address.
    #[error("--cluster-peers gives nodes {first} and {second} the same address {addr}")]
    DuplicateAddress {
        /// The address.
        addr: String,
        /// First id.
        first: NodeId,
        /// Second id.
        second: NodeId,
    },
    /// The node's own id is not in the peer list.
    #[error("--node-id {node_id} is not in --cluster-peers (which has {known:?}); every voter must list itself, and a node joining as an observer needs --cluster-listen")]
    OwnIdMissing {
        /// This node's id.
        node_id: NodeId,
        /// Ids in the list.
        known: Vec<NodeId>,
    },
    /// A node id cannot be a Kafka broker id.
    #[error("node id {id} is not a valid broker id (0..={max})", max = i32::MAX)]
    InvalidNodeId {
        /// The id.
        id: u64,
    },
    /// openraft refused the timing settings.
    #[error("invalid Raft timing: {0}")]
    Raft(String),
}

/// Parses `1=host:port,2=host:port,...` (spaces around entries are ignored).
pub fn parse_peers(list: &str) -> Result<BTreeMap<NodeId, String>, ConfigError> {
    let mut peers: BTreeMap<NodeId, String> = BTreeMap::new();
    for entry in list.split(',').map(str::trim) {
        if entry.is_empty() {
            if list.trim().is_empty() {
                return Err(ConfigError::EmptyPeers);
            }
            return Err(ConfigError::MalformedPeer {
                entry: entry.to_owned(),
                reason: "empty entry (stray comma?)".to_owned(),
            });
        }
        let malformed = |reason: &str| ConfigError::MalformedPeer {
            entry: entry.to_owned(),
            reason: reason.to_owned(),
        };
        let (id, addr) = entry
            .split_once('=')
            .ok_or_else(|| malformed("missing '='"))?;
        let id: NodeId = id
            .trim()
            .parse()
            .map_err(|_| malformed("the id is not a non-negative integer"))?;
        if id > i32::MAX as u64 {
            return Err(ConfigError::InvalidNodeId { id });
        }
        let addr = addr.trim();
        let (host, port) = addr
            .rsplit_once(':')
            .ok_or_else(|| malformed("the address has no ':port'"))?;
        if host.is_empty() {
            return Err(malformed("the host is empty"));
        }
        match port.parse::<u16>() {
            Ok(p) if p != 0 => {}
            _ => return Err(malformed("the port is not in 1..=65535")),
        }
        if let Some((&other, _)) = peers.iter().find(|(_, a)| a.as_str() == addr) {
            return Err(ConfigError::DuplicateAddress {
                addr: addr.to_owned(),
                first: other,
                second: id,
            });
        }
        if let Some(first) = peers.insert(id, addr.to_owned()) {
            return Err(ConfigError::DuplicateId {
                id,
                first,
                second: addr.to_owned(),
            });
        }
    }
    if peers.is_empty() {
        return Err(ConfigError::EmptyPeers);
    }
    Ok(peers)
}

/// Raft timing, in milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftTimings {
    /// Leader heartbeat interval (also openraft's AppendEntries timeout).
    pub heartbeat_ms: u64,
    /// Election timeout lower bound.
    pub election_min_ms: u64,
    /// Election timeout upper bound.
    pub election_max_ms: u64,
}

impl Default for RaftTimings {
    fn default() -> Self {
        // A heartbeat of 250 ms leaves room for a follower's fsync on a busy disk (openraft
        // uses the heartbeat interval as the AppendEntries timeout); elections after 1-2 s
        // of silence match KRaft's defaults (controller.quorum.election.timeout.ms = 1000).
        Self {
            heartbeat_ms: 250,
            election_min_ms: 1000,
            election_max_ms: 2000,
        }
    }
}

/// Everything [`MetadataNode::start`] needs.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// This node's id (its broker id too).
    pub node_id: NodeId,
    /// Every voter, this node included: `id -> inter-node address`.
    pub peers: BTreeMap<NodeId, String>,
    /// Where to listen for inter-node traffic.
    pub listen: SocketAddr,
    /// Data directory; the quorum keeps its files under `metadata/` in it.
    pub data_dir: PathBuf,
    /// Raft timing.
    pub timings: RaftTimings,
    /// A broker that shows no heartbeat for this long is fenced (Kafka's
    /// `broker.session.timeout.ms`, 9 s by default).
    pub session_timeout: Duration,
    /// How often the active controller re-evaluates liveness and leadership.
    pub controller_interval: Duration,
    /// How long [`MetadataNode::propose`] keeps trying (leader changes included).
    pub propose_timeout: Duration,
    /// A snapshot is taken after this many log entries (then the log before it is purged).
    pub snapshot_every_entries: u64,
    /// `Some(address other nodes reach this one at)` for an observer: a node not among the
    /// voters in `peers`, which follows the metadata log and serves as a broker without
    /// voting.
    pub observer_addr: Option<String>,
    /// Plain TCP or mutual TLS between nodes.
    pub transport: Transport,
    /// Where Kafka connections from other brokers on the inter-node port go.
    pub kafka: Option<KafkaHandoff>,
}

impl NodeConfig {
    /// A configuration with default timings; checks that `peers` contains `node_id`.
    pub fn new(
        node_id: NodeId,
        peers: BTreeMap<NodeId, String>,
        listen: SocketAddr,
        data_dir: PathBuf,
    ) -> Result<Self, ConfigError> {
        let config = Self::new_unchecked(node_id, peers, listen, data_dir);
        config.validate()?;
        Ok(config)
    }

    /// A configuration for an observer: `voters` does not hold `node_id`, and the voters
    /// reach this node at `addr`.
    pub fn observer(
        node_id: NodeId,
        voters: BTreeMap<NodeId, String>,
        listen: SocketAddr,
        addr: String,
        data_dir: PathBuf,
    ) -> Result<Self, ConfigError> {
        let mut config = Self::new_unchecked(node_id, voters, listen, data_dir);
        config.observer_addr = Some(addr);
        config.validate()?;
        Ok(config)
    }

    fn new_unchecked(
        node_id: NodeId,
        peers: BTreeMap<NodeId, String>,
        listen: SocketAddr,
        data_dir: PathBuf,
    ) -> Self {
        Self {
            node_id,
            peers,
            listen,
            data_dir,
            timings: RaftTimings::default(),
            session_timeout: Duration::from_secs(9),
            controller_interval: Duration::from_millis(500),
            propose_timeout: Duration::from_secs(10),
            snapshot_every_entries: 1000,
            observer_addr: None,
            transport: Transport::plain(),
            kafka: None,
        }
    }

    /// Whether this node joins as an observer (not one of the configured voters).
    pub fn is_observer(&self) -> bool {
        !self.peers.contains_key(&self.node_id)
    }

    /// Checks the node id and peer list.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.node_id > i32::MAX as u64 {
            return Err(ConfigError::InvalidNodeId { id: self.node_id });
        }
        if self.peers.is_empty() {
            return Err(ConfigError::EmptyPeers);
        }
        if !self.peers.contains_key(&self.node_id) && self.observer_addr.is_none() {
            return Err(ConfigError::OwnIdMissing {
                node_id: self.node_id,
                known: self.peers.keys().copied().collect(),
            });
        }
        if let Some(&id) = self.peers.keys().find(|&&id| id > i32::MAX as u64) {
            return Err(ConfigError::InvalidNodeId { id });
        }
        Ok(())
    }

    fn raft_config(&self) -> Result<Config, ConfigError> {
        Config {
            cluster_name: "spate-metadata".to_owned(),
            heartbeat_interval: self.timings.heartbeat_ms,
            election_timeout_min: self.timings.election_min_ms,
            election_timeout_max: self.timings.election_max_ms,
            // Chunks travel as JSON arrays (~4 bytes per byte): keep frames well below the limit.
            snapshot_max_chunk_size: 1 << 20,
            install_snapshot_timeout: 5_000,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_every_entries),
            max_in_snapshot_log_to_keep: self.snapshot_every_entries,
            ..Config::default()
        }
        .validate()
        .map_err(|e| ConfigError::Raft(e.to_string()))
    }
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The inter-node listener could not bind.
    #[error("cannot listen on {addr} for inter-node traffic: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The bind error.
        source: std::io::Error,
    },
    /// The on-disk state could not be opened.
    #[error("cannot open the metadata log in {dir}: {source}")]
    Storage {
        /// The directory.
        dir: PathBuf,
        /// The storage error (boxed: openraft's error type is large).
        source: Box<StorageError>,
    },
    /// openraft refused to start.
    #[error("raft failed to start: {0}")]
    Raft(String),
    /// The data dir was written by a node with another id.
    #[error("the metadata in {dir} belongs to node {found}, but this node is configured as node {configured}; fix --node-id or the data dir")]
    WrongNodeId {
        /// The directory.
        dir: PathBuf,
        /// The id recorded in it.
        found: NodeId,
        /// The configured id.
        configured: NodeId,
    },
    /// The node identity file could not be read or written.
    #[error("cannot use {path}: {source}")]
    Identity {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Records which node owns `dir` on first start and refuses to open it as another node:
/// a Raft log replayed under the wrong id would vote and acknowledge as somebody else.
fn claim_data_dir(dir: &std::path::Path, node_id: NodeId) -> Result<(), StartError> {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Identity {
        node_id: NodeId,
    }
    let path = dir.join("node.json");
    let io_err = |source| StartError::Identity {
        path: path.clone(),
        source,
    };
    match std::fs::read(&path) {
        Ok(bytes) => {
            let found: Identity = serde_json::from_slice(&bytes)
                .map_err(|e| io_err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
            if found.node_id != node_id {
                return Err(StartError::WrongNodeId {
                    dir: dir.to_path_buf(),
                    found: found.node_id,
                    configured: node_id,
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(io_err)?;
            let bytes = serde_json::to_vec(&Identity { node_id })
                .map_err(|e| io_err(std::io::Error::other(e)))?;
            crate::raft::write_durably(dir, "node.json", &bytes).map_err(io_err)
        }
        Err(e) => Err(io_err(e)),
    }
}

/// Why a proposal did not produce an outcome.
#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    /// The command was committed and refused by the state machine (the image is unchanged).
    #[error(transparent)]
    Refused(#[from] CommandError),
    /// No leader accepted the command before the deadline (no quorum, or elections ongoing).
    #[error("no leader accepted the command within {waited:?}: {last_error}")]
    Timeout {
        /// How long the proposal tried.
        waited: Duration,
        /// The last obstacle met.
        last_error: String,
    },
    /// This node's Raft has stopped.
    #[error("the metadata quorum on this node has stopped: {0}")]
    Stopped(String),
}

impl ProposeError {
    /// The Kafka error code a broker should answer with.
    pub fn kafka_error_code(&self) -> i16 {
        match self {
            ProposeError::Refused(e) => e.kafka_error_code(),
            // REQUEST_TIMED_OUT: the client may retry.
            ProposeError::Timeout { .. } => 7,
            ProposeError::Stopped(_) => -1,
        }
    }
}

/// A point-in-time view of this node's Raft state, for Prometheus and `/ready`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuorumMetrics {
    /// This node's id.
    pub node_id: NodeId,
    /// Leader, follower, candidate, learner or shutdown.
    pub state: ServerState,
    /// The leader this node knows of.
    pub leader: Option<NodeId>,
    /// Current Raft term.
    pub term: u64,
    /// Index of the last entry in this node's log.
    pub last_log_index: Option<u64>,
    /// Index of the last entry known committed.
    pub commit_index: Option<u64>,
    /// Index of the last entry applied to the image.
    pub applied_index: Option<u64>,
    /// Index covered by the last snapshot.
    pub snapshot_index: Option<u64>,
}

impl QuorumMetrics {
    /// A leader is known and everything committed has been applied here.
    pub fn caught_up(&self) -> bool {
        self.leader.is_some() && self.applied_index >= self.commit_index
    }
}

/// How a broker describes itself when registering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerInfo {
    /// Host advertised to Kafka clients.
    pub kafka_host: String,
    /// Port advertised to Kafka clients.
    pub kafka_port: u16,
    /// Optional rack.
    pub rack: Option<String>,
    /// Advertised HTTP address, for node-to-node HTTP.
    pub http_addr: Option<String>,
    /// Every advertised Kafka listener.
    pub listeners: Vec<crate::metadata::ListenerAddress>,
}

struct Inner {
    node_id: NodeId,
    raft: MetadataRaft,
    image: watch::Receiver<Arc<MetadataImage>>,
    peers: BTreeMap<NodeId, String>,
    local_addr: SocketAddr,
    propose_timeout: Duration,
    /// How long the controller waits for a broker's heartbeat before fencing it.
    session_timeout: Duration,
    /// The address voters reach this node at, when it is an observer.
    observer_addr: Option<String>,
    /// Takes broker heartbeats while this node is the active controller.
    heartbeats: heartbeat::Receiver,
    /// Idle connections to leaders, for forwarded proposals.
    forward_pool: Mutex<BTreeMap<NodeId, Vec<PeerClient>>>,
    /// Plain or TLS, for every inter-node connection.
    transport: Transport,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
    }
}

/// One voter of the metadata quorum (cheap to clone: all clones are the same node).
#[derive(Clone)]
pub struct MetadataNode {
    inner: Arc<Inner>,
}

/// Most idle forwarding connections kept per leader.
const FORWARD_POOL_MAX: usize = 4;

impl MetadataNode {
    /// Binds `config.listen` and starts the node (see [`MetadataNode::start_with_listener`]).
    pub async fn start(config: NodeConfig) -> Result<Self, StartError> {
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| StartError::Bind {
                    addr: config.listen,
                    source,
                })?;
        Self::start_with_listener(config, listener).await
    }

    /// Starts the node on an already bound listener: opens (or recovers) its log and
    /// snapshot, starts Raft, serves peers, forms the cluster if it is the lowest id and the
    /// cluster is new, and runs the controller while it leads.
    pub async fn start_with_listener(
        config: NodeConfig,
        listener: TcpListener,
    ) -> Result<Self, StartError> {
        config.validate()?;
        let raft_config = Arc::new(config.raft_config()?);
        let local_addr = listener.local_addr().map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
        let dir = config.data_dir.join("metadata");
        let fresh = !dir.exists();
        claim_data_dir(&dir, config.node_id)?;
        let lowest = config.peers.keys().next().copied();
        if fresh && lowest != Some(config.node_id) {
            tracing::info!(
                node_id = config.node_id,
                "empty metadata directory: joining the cluster as a fresh replica; the leader sends the metadata log (a new node, or a wiped data dir)"
            );
        }
        // Asked before this node serves its peers, so no peer can form the cluster on its
        // answer in between: a voter that finds the cluster already formed with an empty
        // log of its own lost (or never had) what it may have acknowledged, and must not
        // vote until it has caught up.
        let rejoining = fresh
            && !config.is_observer()
            && formed_elsewhere(config.node_id, &config.peers, &config.transport).await;
        if rejoining {
            tracing::warn!(
                node_id = config.node_id,
                "a voter with an empty metadata log in a formed cluster: it grants no vote until it has caught up with the leader"
            );
        }
        let rejoining = Arc::new(std::sync::atomic::AtomicBool::new(rejoining));
        let (mut log, sm) = open_storage(&dir)
            .await
            .map_err(|source| StartError::Storage {
                dir: dir.clone(),
                source: Box::new(source),
            })?;
        let log_reader = openraft::storage::RaftLogStorage::get_log_reader(&mut log).await;
        if log.torn_bytes_dropped() > 0 {
            tracing::warn!(
                node_id = config.node_id,
                bytes = log.torn_bytes_dropped(),
                "metadata log: a torn tail from an earlier crash was cut off"
            );
        }
        let image = sm.subscribe();
        let health = Arc::new(PeerHealth::default());
        let raft = Raft::new(
            config.node_id,
            raft_config,
            NetworkFactory::new(
                config.node_id,
                config.peers.clone(),
                health.clone(),
                config.transport.clone(),
            ),
            log,
            sm,
        )
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;

        let pre_vote = Arc::new(crate::pre_vote::PreVote::new(
            raft.clone(),
            log_reader,
            Duration::from_millis(config.timings.election_min_ms),
            config.transport.clone(),
        ));
        let heartbeats = heartbeat::Receiver {
            raft: raft.clone(),
            image: image.clone(),
            board: Arc::new(heartbeat::Heartbeats::default()),
        };
        let inner = Arc::new(Inner {
            node_id: config.node_id,
            raft: raft.clone(),
            image,
            peers: config.peers.clone(),
            local_addr,
            propose_timeout: config.propose_timeout,
            session_timeout: config.session_timeout,
            observer_addr: config.observer_addr.clone(),
            heartbeats: heartbeats.clone(),
            forward_pool: Mutex::new(BTreeMap::new()),
            tasks: Mutex::new(Vec::new()),
            transport: config.transport.clone(),
        });
        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(serve(
            listener,
            raft.clone(),
            config.node_id,
            config.peers.clone(),
            PeerServices {
                heartbeats: heartbeats.clone(),
                rejoining: rejoining.clone(),
                pre_vote: pre_vote.clone(),
                transport: config.transport.clone(),
                kafka: config.kafka.clone(),
            },
        )));
        let voters = {
            let raft = raft.clone();
            let peers = config.peers.clone();
            move || {
                let m = crate::membership::members(&raft);
                m.voters
                    .iter()
                    .filter_map(|&id| Some((id, peer_addr(&peers, &m, id)?)))
                    .collect::<Vec<_>>()
            }
        };
        tasks.push(tokio::spawn(pre_vote.guard(config.node_id, voters)));
        if rejoining.load(std::sync::atomic::Ordering::SeqCst) {
            tasks.push(tokio::spawn(catch_up_before_voting(
                raft.clone(),
                config.node_id,
                config.peers.clone(),
                rejoining,
                config.transport.clone(),
            )));
        }
        if lowest == Some(config.node_id) {
            tasks.push(tokio::spawn(form_cluster(
                raft.clone(),
                config.node_id,
                config.peers.clone(),
                config.transport.clone(),
            )));
        }
        tasks.push(tokio::spawn(run_controller(
            raft.clone(),
            health,
            heartbeats.board.clone(),
            inner.image.clone(),
            config.session_timeout,
            config.controller_interval,
            config.propose_timeout,
        )));
        if let (true, Some(addr)) = (config.is_observer(), config.observer_addr.clone()) {
            tasks.push(tokio::spawn(join_as_observer(
                raft.clone(),
                config.node_id,
                addr,
                config.peers.clone(),
                config.transport.clone(),
            )));
        }
        inner.tasks.lock().extend(tasks);
        tracing::info!(
            node_id = config.node_id,
            listen = %local_addr,
            voters = ?config.peers.keys().collect::<Vec<_>>(),
            "metadata quorum node started"
        );
        Ok(Self { inner })
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.inner.node_id
    }

    /// The address peers reach this node on.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// How this node connects to the others (plain or mutual TLS).
    pub fn transport(&self) -> &Transport {
        &self.inner.transport
    }

    /// The voters' inter-node addresses as configured (`--cluster-peers`).
    pub fn peers(&self) -> &BTreeMap<NodeId, String> {
        &self.inner.peers
    }

    /// The latest applied image.
    pub fn image(&self) -> Arc<MetadataImage> {
        self.inner.image.borrow().clone()
    }

    /// A receiver that sees every newly applied image.
    pub fn subscribe(&self) -> watch::Receiver<Arc<MetadataImage>> {
        self.inner.image.clone()
    }

    /// Whether this node leads the quorum (and so is the controller): it is Raft leader and
    /// a quorum has acknowledged it. A view, not a guarantee: a deposed leader learns it at
    /// its next contact with the others. (A node restarted with a vote for itself briefly
    /// calls itself leader of its old term; the quorum-ack condition keeps that out.)
    pub fn is_leader(&self) -> bool {
        let m = self.inner.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.millis_since_quorum_ack.is_some()
    }

    /// The leader (controller) this node knows of.
    pub fn leader_id(&self) -> Option<NodeId> {
        self.inner.raft.metrics().borrow().current_leader
    }

    /// openraft's full metrics channel.
    pub fn raft_metrics(&self) -> watch::Receiver<RaftMetrics<NodeId, PeerNode>> {
        self.inner.raft.metrics()
    }

    /// Term, commit index, applied index and friends.
    pub async fn metrics(&self) -> QuorumMetrics {
        let m = self.inner.raft.metrics().borrow().clone();
        let commit_index = self
            .inner
            .raft
            .with_raft_state(|st| st.committed.map(|c| c.index))
            .await
            .unwrap_or(None);
        QuorumMetrics {
            node_id: m.id,
            state: m.state,
            leader: m.current_leader,
            term: m.current_term,
            last_log_index: m.last_log_index,
            commit_index,
            applied_index: m.last_applied.map(|l| l.index),
            snapshot_index: m.snapshot.map(|l| l.index),
        }
    }

    /// Waits until some node is known to lead; returns its id.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Option<NodeId> {
        let mut rx = self.inner.raft.metrics();
        let wait = async {
            loop {
                if let Some(l) = rx.borrow_and_update().current_leader {
                    return Some(l);
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }

    /// Proposes `cmd` and waits until it is committed and applied, from any node: a
    /// follower forwards it to the leader, and leader changes are retried until the
    /// configured propose timeout.
    ///
    /// A retry after an unanswered attempt may apply a command twice; every command is safe
    /// under that (registration and topic creation are idempotent, partition changes carry
    /// epochs, a second producer-id block is only a gap).
    pub async fn propose(&self, cmd: MetadataCommand) -> Result<CommandOutcome, ProposeError> {
        let started = Instant::now();
        let deadline = started + self.inner.propose_timeout;
        let mut backoff = Duration::from_millis(20);
        let mut last_error = String::from("no attempt finished");
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(ProposeError::Timeout {
                    waited: started.elapsed(),
                    last_error,
                });
            }
            let local = tokio::time::timeout(remaining, self.inner.raft.client_write(cmd.clone()));
            let forward_to = match local.await {
                Err(_) => {
                    last_error = "the local write did not finish".to_owned();
                    continue;
                }
                // This node's own Raft is down (shut down or a storage failure): no retry helps.
                Ok(Err(RaftError::Fatal(f))) => return Err(ProposeError::Stopped(f.to_string())),
                Ok(result) => match settle(result) {
                    Settled::Done(r) => return r,
                    Settled::Forward(id, addr) => Some((id, addr)),
                    Settled::Retry(why) => {
                        last_error = why;
                        None
                    }
                },
            };
            if let Some((leader, addr)) = forward_to {
                let remaining = deadline.saturating_duration_since(Instant::now());
                // A leader cut off from us may never answer: stop waiting on it as soon as
                // this node learns of another leader, and retry there. Otherwise a broker
                // heartbeat stays stuck on the old leader past its session timeout and the
                // new controller fences live brokers.
                let attempt = tokio::select! {
                    r = self.forward(leader, addr, cmd.clone(), remaining) => Some(r),
                    () = self.leader_moves_from(leader) => None,
                };
                match attempt {
                    Some(Ok(result)) => match settle(result) {
                        Settled::Done(r) => return r,
                        Settled::Forward(..) => {
                            last_error = format!("node {leader} is no longer the leader");
                        }
                        Settled::Retry(why) => last_error = why,
                    },
                    Some(Err(e)) => last_error = e.to_string(),
                    None => {
                        last_error =
                            format!("node {leader} stopped leading while the command waited on it");
                    }
                }
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(backoff.min(remaining)).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    /// Sends a broker heartbeat of `broker_id` at registration `broker_epoch` to the active
    /// controller (taken here when this node is it), within `timeout`. Not a log entry: see
    /// [`crate::heartbeat`].
    pub async fn heartbeat(
        &self,
        broker_id: BrokerId,
        broker_epoch: i64,
        timeout: Duration,
    ) -> Result<(), HeartbeatError> {
        let deadline = Instant::now() + timeout;
        let mut leader = self.leader_id();
        // The local Raft's view first, then at most one redirect to the leader it names.
        for _ in 0..2 {
            let Some(id) = leader else {
                return Err(HeartbeatError::Failed(
                    "no metadata quorum leader is known".into(),
                ));
            };
            let result = if id == self.inner.node_id {
                self.inner.heartbeats.receive(broker_id, broker_epoch).await
            } else {
                let addr = peer_addr(&self.inner.peers, &self.members(), id).ok_or_else(|| {
                    HeartbeatError::Failed(format!("leader {id} has no known address"))
                })?;
                let remaining = deadline.saturating_duration_since(Instant::now());
                let mut client =
                    PeerClient::new(self.inner.node_id, id, addr, &self.inner.transport);
                let sent = tokio::select! {
                    r = client.broker_heartbeat(broker_id, broker_epoch, remaining) => r,
                    () = self.leader_moves_from(id) => {
                        leader = self.leader_id();
                        continue;
                    }
                };
                sent.unwrap_or_else(|e| Err(HeartbeatError::Failed(e.to_string())))
            };
            match result {
                Err(HeartbeatError::NotLeader {
                    leader: Some((next, _)),
                }) if next != id => leader = Some(next),
                other => return other,
            }
        }
        Err(HeartbeatError::Failed(
            "the quorum leader moved while the heartbeat was sent".into(),
        ))
    }

    /// The quorum's voters and members as this node last applied them.
    pub fn members(&self) -> Members {
        crate::membership::members(&self.inner.raft)
    }

    /// Changes the quorum's membership from any node: the leader applies it (forwarded
    /// there when this node does not lead), retrying leader changes for up to `timeout`.
    pub async fn change_membership(
        &self,
        change: MembershipChange,
        timeout: Duration,
    ) -> Result<(), MembershipError> {
        let deadline = Instant::now() + timeout;
        let mut last = MembershipError::NotLeader { leader: None };
        while Instant::now() < deadline {
            let result = match crate::membership::change_on_leader(&self.inner.raft, &change).await
            {
                Err(MembershipError::NotLeader {
                    leader: Some((id, addr)),
                }) if id != self.inner.node_id => {
                    let addr = self.inner.peers.get(&id).cloned().unwrap_or(addr);
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    let mut client =
                        PeerClient::new(self.inner.node_id, id, addr, &self.inner.transport);
                    match client.change_membership(change.clone(), remaining).await {
                        Ok(r) => r,
                        Err(e) => Err(MembershipError::Failed(e.to_string())),
                    }
                }
                other => other,
            };
            match result {
                Ok(()) => return Ok(()),
                Err(e @ MembershipError::Refused(_)) => return Err(e),
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(last)
    }

    /// Returns once this node knows of a leader other than `leader` (never if Raft stops).
    async fn leader_moves_from(&self, leader: NodeId) {
        let mut rx = self.inner.raft.metrics();
        loop {
            let current = rx.borrow_and_update().current_leader;
            if current.is_some_and(|l| l != leader) {
                return;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    async fn forward(
        &self,
        leader: NodeId,
        addr: String,
        cmd: MetadataCommand,
        timeout: Duration,
    ) -> Result<ClientWriteResult, crate::network::TransportError> {
        let pooled = self
            .inner
            .forward_pool
            .lock()
            .get_mut(&leader)
            .and_then(Vec::pop);
        // The configured address wins over the one recorded in the membership (see
        // NetworkFactory::new).
        let addr = self.inner.peers.get(&leader).cloned().unwrap_or(addr);
        let mut client = pooled.unwrap_or_else(|| {
            PeerClient::new(self.inner.node_id, leader, addr, &self.inner.transport)
        });
        let result = client.client_write(cmd, timeout).await;
        if result.is_ok() {
            let mut pool = self.inner.forward_pool.lock();
            let idle = pool.entry(leader).or_default();
            if idle.len() < FORWARD_POOL_MAX {
                idle.push(client);
            }
        }
        result
    }

    /// Registers this node as a broker and heartbeats every `interval` in the background,
    /// re-registering (with a new incarnation) whenever the registration is lost.
    ///
    /// The broker epoch is published on the returned session's channel; `None` while not
    /// registered. A registration refused because a previous process of this broker id is
    /// still considered alive is retried: it succeeds once the controller fences the old one
    /// (after the session timeout).
    pub fn start_broker_session(&self, info: BrokerInfo, interval: Duration) -> BrokerSession {
        let (epoch_tx, epoch_rx) = watch::channel(None);
        let (stop_tx, stop_rx) = watch::channel(false);
        let node = self.clone();
        let lease = Arc::new(Mutex::new(None));
        let task = tokio::spawn(broker_session(
            node,
            info,
            interval,
            epoch_tx,
            stop_rx,
            lease.clone(),
        ));
        BrokerSession {
            epoch: epoch_rx,
            stop: stop_tx,
            task,
            node: self.clone(),
            lease,
            session_timeout: self.inner.session_timeout,
        }
    }

    /// Stops serving and shuts Raft down. Peers see this node as down.
    pub async fn shutdown(self) {
        let tasks: Vec<_> = self.inner.tasks.lock().drain(..).collect();
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!(error = %e, "metadata quorum: raft did not shut down cleanly");
        }
    }
}

enum Settled {
    Done(Result<CommandOutcome, ProposeError>),
    Forward(NodeId, String),
    Retry(String),
}

fn settle(result: ClientWriteResult) -> Settled {
    match result {
        Ok(resp) => Settled::Done(resp.data.map_err(ProposeError::Refused)),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
            match (f.leader_id, f.leader_node) {
                (Some(id), Some(node)) => Settled::Forward(id, node.addr),
                (Some(id), None) => Settled::Retry(format!("leader {id} has no known address")),
                _ => Settled::Retry("no leader is known yet".to_owned()),
            }
        }
        Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
            // Metadata commands never change membership; report rather than loop.
            Settled::Done(Err(ProposeError::Stopped(e.to_string())))
        }
        Err(RaftError::Fatal(f)) => Settled::Retry(format!("raft stopped: {f}")),
    }
}

/// A broker's registration and heartbeat loop; see [`MetadataNode::start_broker_session`].
pub struct BrokerSession {
    epoch: watch::Receiver<Option<i64>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    node: MetadataNode,
    /// When the last registration or heartbeat that committed was sent.
    lease: Arc<Mutex<Option<Instant>>>,
    session_timeout: Duration,
}

impl BrokerSession {
    /// The current broker epoch (`None` until registered).
    pub fn epoch(&self) -> watch::Receiver<Option<i64>> {
        self.epoch.clone()
    }

    /// Whether a registration or heartbeat sent less than the session timeout ago committed.
    /// Once not, the controller may have fenced this broker and elected other leaders (it
    /// counts the session from when it received that heartbeat, which is no earlier than
    /// its sending): a broker cut off from the quorum must stop leading by then.
    pub fn lease_valid(&self) -> bool {
        self.lease
            .lock()
            .is_some_and(|sent| sent.elapsed() < self.session_timeout)
    }

    /// Waits until the broker is registered; returns its epoch.
    pub async fn registered(&self, timeout: Duration) -> Option<i64> {
        let mut rx = self.epoch.clone();
        let wait = async {
            loop {
                if let Some(e) = *rx.borrow_and_update() {
                    return Some(e);
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }

    /// Stops heartbeating. With `controlled`, first asks the controller to fence this broker
    /// and move its leaderships away (Kafka's controlled shutdown), so clients fail over
    /// without waiting for the session timeout.
    pub async fn stop(self, controlled: bool) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        let epoch = *self.epoch.borrow();
        if let (true, Some(broker_epoch)) = (controlled, epoch) {
            let Ok(broker_id) = BrokerId::try_from(self.node.node_id()) else {
                return;
            };
            let cmd = MetadataCommand::BrokerHeartbeat {
                broker_id,
                broker_epoch,
                now_ms: wall_clock_ms(),
                shutting_down: true,
            };
            if let Err(e) = self.node.propose(cmd).await {
                tracing::warn!(error = %e, "controlled shutdown request failed");
            }
        }
    }
}

fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn broker_session(
    node: MetadataNode,
    info: BrokerInfo,
    interval: Duration,
    epoch_tx: watch::Sender<Option<i64>>,
    mut stop: watch::Receiver<bool>,
    lease: Arc<Mutex<Option<Instant>>>,
) {
    let Ok(broker_id) = BrokerId::try_from(node.node_id()) else {
        tracing::error!(node_id = node.node_id(), "node id is not a valid broker id");
        return;
    };
    let inter_node_addr = node
        .peers()
        .get(&node.node_id())
        .cloned()
        .or_else(|| node.inner.observer_addr.clone())
        .unwrap_or_else(|| node.local_addr().to_string());
    let mut incarnation = Uuid::new_v4();
    // A heartbeat waits at most half a session: a later one may still arrive in time.
    let heartbeat_timeout = node.inner.session_timeout / 2;
    loop {
        let registered = *epoch_tx.borrow();
        if let Some(broker_epoch) = registered {
            let sent = Instant::now();
            let result = tokio::select! {
                r = node.heartbeat(broker_id, broker_epoch, heartbeat_timeout) => r,
                _ = stop.changed() => return,
            };
            match result {
                Ok(()) => *lease.lock() = Some(sent),
                Err(HeartbeatError::Refused(
                    e @ (CommandError::StaleBrokerEpoch { .. }
                    | CommandError::BrokerNotRegistered { .. }),
                )) => {
                    tracing::warn!(broker_id, error = %e, "broker registration lost; registering again");
                    *lease.lock() = None;
                    incarnation = Uuid::new_v4();
                    epoch_tx.send_replace(None);
                    continue;
                }
                Err(e) => tracing::warn!(broker_id, error = %e, "broker heartbeat failed"),
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.changed() => return,
            }
            continue;
        }
        // Registration goes through the log: it changes the metadata every node needs.
        let cmd = MetadataCommand::RegisterBroker {
            broker_id,
            incarnation,
            inter_node_addr: inter_node_addr.clone(),
            kafka_host: info.kafka_host.clone(),
            kafka_port: info.kafka_port,
            rack: info.rack.clone(),
            http_addr: info.http_addr.clone(),
            now_ms: wall_clock_ms(),
            listeners: info.listeners.clone(),
        };
        let sent = Instant::now();
        let proposal = node.propose(cmd);
        let result = tokio::select! {
            r = proposal => r,
            _ = stop.changed() => return,
        };
        match result {
            Ok(CommandOutcome::BrokerRegistered { broker_epoch }) => {
                tracing::info!(broker_id, broker_epoch, "broker registered");
                *lease.lock() = Some(sent);
                epoch_tx.send_replace(Some(broker_epoch));
            }
            Ok(_) => {}
            Err(ProposeError::Refused(e @ CommandError::BrokerRetired { .. })) => {
                tracing::warn!(broker_id, error = %e, "this node was decommissioned: it no longer registers; stop it, or add it to the cluster again");
                epoch_tx.send_replace(None);
                return;
            }
            Err(ProposeError::Refused(CommandError::DuplicateBrokerRegistration { .. })) => {
                tracing::warn!(
                    broker_id,
                    "broker id still registered by an earlier process; retrying until the controller fences it"
                );
            }
            Err(e) => tracing::warn!(broker_id, error = %e, "broker registration failed; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Where to reach node `id`: its address in this node's configuration first (as
/// `NetworkFactory::new` decides), else the one the membership records (an observer's).
fn peer_addr(peers: &BTreeMap<NodeId, String>, members: &Members, id: NodeId) -> Option<String> {
    peers.get(&id).or_else(|| members.nodes.get(&id)).cloned()
}

/// Whether some peer's Raft already holds a membership: the cluster was formed without this
/// node's current log.
async fn formed_elsewhere(
    node_id: NodeId,
    peers: &BTreeMap<NodeId, String>,
    transport: &Transport,
) -> bool {
    for (&id, addr) in peers.iter().filter(|(&id, _)| id != node_id) {
        let mut client = PeerClient::new(node_id, id, addr.clone(), transport);
        if let Ok(hello) = client.hello(Duration::from_secs(1)).await {
            if hello.initialized {
                return true;
            }
        }
    }
    false
}

/// Clears `rejoining` once this node has applied everything the leader had committed when
/// asked (Raft's ReadIndex on the leader): from then on its vote is as good as any voter's.
async fn catch_up_before_voting(
    raft: MetadataRaft,
    node_id: NodeId,
    peers: BTreeMap<NodeId, String>,
    rejoining: Arc<std::sync::atomic::AtomicBool>,
    transport: Transport,
) {
    loop {
        let leader = raft.metrics().borrow().current_leader;
        match leader {
            Some(l) if l == node_id => break,
            Some(l) => {
                let addr = peer_addr(&peers, &crate::membership::members(&raft), l);
                if let Some(addr) = addr {
                    let mut client = PeerClient::new(node_id, l, addr, &transport);
                    if let Ok(Ok(index)) = client.read_index(Duration::from_secs(5)).await {
                        let caught_up = match index {
                            None => true,
                            Some(i) => raft
                                .wait(Some(Duration::from_secs(30)))
                                .applied_index_at_least(Some(i), "rejoining voter catches up")
                                .await
                                .is_ok(),
                        };
                        if caught_up {
                            break;
                        }
                    }
                }
            }
            None => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    rejoining.store(false, std::sync::atomic::Ordering::SeqCst);
    tracing::info!(
        node_id,
        "caught up with the metadata quorum after an empty start: voting again"
    );
}

/// Asks the voters, until one that leads accepts, to take this node in as an observer (a
/// learner that never votes); returns once the membership this node applied holds it.
async fn join_as_observer(
    raft: MetadataRaft,
    node_id: NodeId,
    addr: String,
    voters: BTreeMap<NodeId, String>,
    transport: Transport,
) {
    let change = MembershipChange::Observe {
        node_id,
        addr: addr.clone(),
    };
    let mut warned = false;
    loop {
        if crate::membership::members(&raft)
            .nodes
            .contains_key(&node_id)
        {
            tracing::info!(
                node_id,
                addr,
                "following the metadata quorum as an observer"
            );
            return;
        }
        let mut targets: Vec<(NodeId, String)> =
            voters.iter().map(|(id, a)| (*id, a.clone())).collect();
        let mut asked = 0;
        while let Some((id, target)) = targets.pop() {
            asked += 1;
            if asked > voters.len() + 2 {
                break;
            }
            let mut client = PeerClient::new(node_id, id, target, &transport);
            match client
                .change_membership(change.clone(), Duration::from_secs(5))
                .await
            {
                Ok(Ok(())) => break,
                Ok(Err(MembershipError::NotLeader {
                    leader: Some((leader, leader_addr)),
                })) => {
                    let leader_addr = voters.get(&leader).cloned().unwrap_or(leader_addr);
                    targets.push((leader, leader_addr));
                }
                Ok(Err(MembershipError::Refused(why))) => {
                    tracing::error!(node_id, reason = %why, "the metadata quorum refused this node as an observer");
                    return;
                }
                Ok(Err(e)) => {
                    tracing::debug!(node_id, voter = id, error = %e, "joining as an observer")
                }
                Err(e) => {
                    tracing::debug!(node_id, voter = id, error = %e, "joining as an observer")
                }
            }
        }
        if !warned {
            tracing::info!(node_id, voters = ?voters.keys().collect::<Vec<_>>(), "asking the voters to take this node in as an observer");
            warned = true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Forms the cluster from the lowest node id: once a majority of the peers answer with the
/// same peer map and none of them reports an already formed cluster, initialize Raft with all
/// voters. Initializing an already initialized node is refused by openraft and ignored here,
/// so restarts and races are harmless; a node restarted with an empty data dir sees its
/// peers' formed cluster and joins it instead of forming a new one.
async fn form_cluster(
    raft: MetadataRaft,
    node_id: NodeId,
    peers: BTreeMap<NodeId, String>,
    transport: Transport,
) {
    let majority = peers.len() / 2 + 1;
    let mut warned_empty_restart = false;
    loop {
        match raft.is_initialized().await {
            Ok(true) => return,
            Ok(false) => {}
            Err(_) => return, // raft stopped
        }
        let mut agreeing = 1; // this node
        let mut formed_elsewhere = None;
        let mut disagreeing = Vec::new();
        for (&id, addr) in peers.iter().filter(|(&id, _)| id != node_id) {
            let mut client = PeerClient::new(node_id, id, addr.clone(), &transport);
            match client.hello(Duration::from_secs(1)).await {
                Ok(hello) if hello.peers != peers => disagreeing.push((id, hello.peers)),
                Ok(hello) => {
                    agreeing += 1;
                    if hello.initialized {
                        formed_elsewhere = Some(id);
                    }
                }
                Err(e) => {
                    tracing::debug!(peer = id, error = %e, "waiting for peer to form the cluster")
                }
            }
        }
        for (id, theirs) in &disagreeing {
            tracing::error!(
                peer = id,
                ours = ?peers,
                theirs = ?theirs,
                "--cluster-peers differs between this node and a peer; not forming the cluster until they agree"
            );
        }
        if let Some(peer) = formed_elsewhere {
            if !warned_empty_restart {
                tracing::warn!(
                    node_id,
                    peer,
                    "this node has an empty metadata log but the cluster is already formed: joining it as a fresh replica (was the data dir wiped?)"
                );
                warned_empty_restart = true;
            }
        } else if disagreeing.is_empty() && agreeing >= majority {
            let members: BTreeMap<NodeId, PeerNode> = peers
                .iter()
                .map(|(&id, addr)| (id, PeerNode { addr: addr.clone() }))
                .collect();
            match raft.initialize(members).await {
                Ok(()) => {
                    tracing::info!(node_id, voters = ?peers.keys().collect::<Vec<_>>(), "metadata quorum formed");
                    return;
                }
                Err(RaftError::APIError(e)) => {
                    tracing::info!(error = %e, "metadata quorum already initialized");
                    return;
                }
                Err(RaftError::Fatal(e)) => {
                    tracing::error!(error = %e, "metadata quorum failed while initializing");
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The active controller: while this node leads, observe heartbeats and propose what
/// [`reconcile`] decides, as one atomic batch per pass.
/// How long a peer must refuse every connection before the controller takes its process
/// for gone; Raft retries a failed peer about every half second, so this spans a few tries.
const REFUSED_FOR_DOWN: Duration = Duration::from_secs(1);

async fn run_controller(
    raft: MetadataRaft,
    health: Arc<PeerHealth>,
    heartbeats: Arc<heartbeat::Heartbeats>,
    image: watch::Receiver<Arc<MetadataImage>>,
    session_timeout: Duration,
    interval: Duration,
    propose_timeout: Duration,
) {
    let started = Instant::now();
    let session_timeout_ms = session_timeout.as_millis() as u64;
    let mut tracker: Option<(u64, LivenessTracker)> = None;
    // When this controller last moved leaderships back to preferred replicas (or started).
    let mut last_rebalance_ms: Option<u64> = None;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (state, acked, term, applied_term) = {
            let m = raft.metrics();
            let m = m.borrow();
            (
                m.state,
                m.millis_since_quorum_ack.is_some(),
                m.current_term,
                m.last_applied.map(|l| l.leader_id.term),
            )
        };
        if state != ServerState::Leader {
            tracker = None;
            last_rebalance_ms = None;
            continue;
        }
        // A leader no quorum has acknowledged yet (e.g. restored from its own vote after a
        // restart) may be stale: its decisions could not commit anyway.
        if !acked {
            continue;
        }
        // Decide only once this term's first entry is applied: the image then holds
        // everything committed by earlier leaders.
        if applied_term != Some(term) {
            continue;
        }
        let now_ms = started.elapsed().as_millis() as u64;
        let tracker = match &mut tracker {
            Some((t, tr)) if *t == term => tr,
            slot => {
                tracing::info!(term, "this node is now the active controller");
                // Counts from an earlier term mean nothing to a new tracker.
                heartbeats.clear();
                &mut slot.insert((term, LivenessTracker::new())).1
            }
        };
        let current = image.borrow().clone();
        tracker.observe(&current, now_ms);
        tracker.observe_heartbeats(&heartbeats.snapshot(), now_ms);
        for (peer, refusing) in health.down(REFUSED_FOR_DOWN) {
            if let Ok(id) = BrokerId::try_from(peer) {
                let refusing_ms = u64::try_from(refusing.as_millis()).unwrap_or(u64::MAX);
                if !tracker.mark_down(id, refusing_ms, now_ms) {
                    // It heartbeated since: the refusals are stale, not a dead process.
                    health.reached(peer);
                    continue;
                }
                if current.is_live(id) {
                    tracing::info!(broker = id, "its inter-node port refuses connections: fencing it without waiting for the session timeout");
                }
            }
        }
        let settings = RebalanceSettings::from_image(&current);
        let rebalance_due = settings.enabled
            && now_ms.saturating_sub(*last_rebalance_ms.get_or_insert(now_ms))
                >= settings.interval_ms;
        if rebalance_due {
            last_rebalance_ms = Some(now_ms);
        }
        let options = PassOptions {
            rebalance_leaders: rebalance_due.then_some(settings.imbalance_percent),
        };
        retire_decommissioned(&raft, &current, propose_timeout).await;
        let cmds = reconcile(&current, tracker, now_ms, session_timeout_ms, options);
        if cmds.is_empty() {
            continue;
        }
        tracing::info!(commands = cmds.len(), "controller proposes changes");
        tracing::debug!(commands = ?cmds, "controller proposal");
        match tokio::time::timeout(
            propose_timeout,
            raft.client_write(MetadataCommand::Batch(cmds)),
        )
        .await
        {
            Ok(Ok(resp)) => {
                if let Err(e) = resp.data {
                    // Decided on an image that moved meanwhile: the next pass decides again.
                    tracing::info!(error = %e, "controller decision refused");
                }
            }
            Ok(Err(e)) => tracing::info!(error = %e, "controller proposal not committed"),
            Err(_) => tracing::warn!("controller proposal timed out"),
        }
    }
}

/// Kafka's automatic leader rebalance settings, read from the dynamic broker configs.
struct RebalanceSettings {
    enabled: bool,
    interval_ms: u64,
    imbalance_percent: u32,
}

impl RebalanceSettings {
    fn from_image(image: &MetadataImage) -> Self {
        let get = |key: &str| image.broker_config(None, key);
        Self {
            enabled: get("auto.leader.rebalance.enable").is_none_or(|v| v != "false"),
            interval_ms: get("leader.imbalance.check.interval.seconds")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(300)
                .saturating_mul(1000),
            imbalance_percent: get("leader.imbalance.per.broker.percentage")
                .and_then(|v| v.parse().ok())
                .unwrap_or(10),
        }
    }
}

/// The last step of decommissioning: a broker that no longer holds any replica leaves the
/// quorum, then its registration is removed (so it cannot register again unless re-added).
async fn retire_decommissioned(raft: &MetadataRaft, image: &MetadataImage, timeout: Duration) {
    let emptied: Vec<BrokerId> = image
        .brokers()
        .values()
        .filter(|b| b.decommissioning)
        .filter(|b| {
            !image
                .partitions_iter()
                .any(|(_, _, p)| p.replicas.contains(&b.id))
        })
        .map(|b| b.id)
        .collect();
    for broker_id in emptied {
        let Ok(node_id) = NodeId::try_from(broker_id) else {
            continue;
        };
        if crate::membership::members(raft)
            .nodes
            .contains_key(&node_id)
        {
            let change = MembershipChange::Remove { node_id };
            match tokio::time::timeout(timeout, crate::membership::change_on_leader(raft, &change))
                .await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(broker_id, error = %e, "cannot remove a decommissioned node from the quorum yet");
                    continue;
                }
                Err(_) => {
                    tracing::warn!(
                        broker_id,
                        "removing a decommissioned node from the quorum timed out"
                    );
                    continue;
                }
            }
        }
        match tokio::time::timeout(
            timeout,
            raft.client_write(MetadataCommand::UnregisterBroker { broker_id }),
        )
        .await
        {
            Ok(Ok(resp)) => match resp.data {
                Ok(_) => tracing::info!(
                    broker_id,
                    "decommissioned: the node holds no replica and left the cluster"
                ),
                Err(e) => {
                    tracing::info!(broker_id, error = %e, "decommissioned node not unregistered")
                }
            },
            Ok(Err(e)) => {
                tracing::info!(broker_id, error = %e, "unregistering a decommissioned node not committed")
            }
            Err(_) => tracing::warn!(broker_id, "unregistering a decommissioned node timed out"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_list_parses_ids_and_addresses() {
        let peers = parse_peers(" 1=127.0.0.1:9101, 2=localhost:9102 ,3=[::1]:9103").unwrap();
        assert_eq!(peers.len(), 3);
        assert_eq!(peers[&1], "127.0.0.1:9101");
        assert_eq!(peers[&2], "localhost:9102");
        assert_eq!(peers[&3], "[::1]:9103");
    }

    #[test]
    fn malformed_peer_lists_get_clear_errors() {
        assert_eq!(parse_peers("").unwrap_err(), ConfigError::EmptyPeers);
        assert_eq!(parse_peers("  ").unwrap_err(), ConfigError::EmptyPeers);
        for (list, needle) in [
            ("1=a:1,", "stray comma"),
            ("1", "missing '='"),
            ("x=a:1", "not a non-negative integer"),
            ("-1=a:1", "not a non-negative integer"),
            ("1=a", "no ':port'"),
            ("1=:80", "host is empty"),
            ("1=a:0", "port"),
            ("1=a:99999", "port"),
        ] {
            let err = parse_peers(list).unwrap_err();
            assert!(err.to_string().contains(needle), "{list:?}: {err}");
        }
        assert_eq!(
            parse_peers("3000000000=a:1").unwrap_err(),
            ConfigError::InvalidNodeId { id: 3_000_000_000 }
        );
    }

    #[test]
    fn duplicate_ids_or_addresses_in_peer_list_are_refused() {
        let err = parse_peers("1=a:1,2=b:2,1=c:3").unwrap_err();
        assert!(
            matches!(err, ConfigError::DuplicateId { id: 1, .. }),
            "{err}"
        );
        let err = parse_peers("1=a:1,2=a:1").unwrap_err();
        assert!(matches!(err, ConfigError::DuplicateAddress { .. }), "{err}");
        assert!(err.to_string().contains("same address"));
    }

    #[test]
    fn config_without_own_id_in_peers_is_refused() {
        let peers = parse_peers("1=a:1,2=b:2").unwrap();
        let err =
            NodeConfig::new(3, peers, "127.0.0.1:0".parse().unwrap(), "/tmp/x".into()).unwrap_err();
        assert!(matches!(err, ConfigError::OwnIdMissing { node_id: 3, .. }));
        assert!(err.to_string().contains("every voter must list itself"));
        // With its own address it is an observer.
        let peers = parse_peers("1=a:1,2=b:2").unwrap();
        let observer = NodeConfig::observer(
            3,
            peers,
            "127.0.0.1:0".parse().unwrap(),
            "c:3".into(),
            "/tmp/x".into(),
        )
        .unwrap();
        assert!(observer.is_observer());
    }

    #[test]
    fn default_timings_are_accepted_by_openraft() {
        let peers = parse_peers("1=a:1").unwrap();
        let config =
            NodeConfig::new(1, peers, "127.0.0.1:0".parse().unwrap(), "/tmp/x".into()).unwrap();
        let raft = config.raft_config().unwrap();
        assert_eq!(raft.heartbeat_interval, 250);
        let mut bad = config;
        bad.timings.election_min_ms = 10;
        bad.timings.heartbeat_ms = 100;
        assert!(matches!(bad.raft_config(), Err(ConfigError::Raft(_))));
    }

    fn fast(config: &mut NodeConfig) {
        config.timings = RaftTimings {
            heartbeat_ms: 100,
            election_min_ms: 500,
            election_max_ms: 1000,
        };
        config.controller_interval = Duration::from_millis(100);
    }

    fn register(id: BrokerId, incarnation: u128) -> MetadataCommand {
        MetadataCommand::RegisterBroker {
            broker_id: id,
            incarnation: Uuid::from_u128(incarnation),
            inter_node_addr: "127.0.0.1:1".to_owned(),
            kafka_host: "127.0.0.1".to_owned(),
            kafka_port: 9092,
            rack: None,
            http_addr: None,
            now_ms: 0,
            listeners: vec![],
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn single_node_forms_a_quorum_and_keeps_its_image_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let peers = BTreeMap::from([(1, addr.to_string())]);
        let mut config = NodeConfig::new(1, peers.clone(), addr, dir.path().into()).unwrap();
        fast(&mut config);
        let node = MetadataNode::start_with_listener(config.clone(), listener)
            .await
            .unwrap();
        assert_eq!(node.wait_for_leader(Duration::from_secs(10)).await, Some(1));
        assert_eq!(
            node.propose(register(1, 1)).await.unwrap(),
            CommandOutcome::BrokerRegistered { broker_epoch: 1 }
        );
        // Initializing an initialized node is refused by openraft and changes nothing.
        let members: BTreeMap<NodeId, PeerNode> = BTreeMap::from([(
            1,
            PeerNode {
                addr: addr.to_string(),
            },
        )]);
        assert!(matches!(
            node.inner.raft.initialize(members).await,
            Err(RaftError::APIError(_))
        ));
        node.propose(register(2, 2)).await.unwrap();
        let image = node.image();
        assert_eq!(image.brokers().len(), 2);
        node.shutdown().await;

        let node = MetadataNode::start(config).await.unwrap();
        assert_eq!(node.wait_for_leader(Duration::from_secs(10)).await, Some(1));
        let deadline = Instant::now() + Duration::from_secs(10);
        while node.image() != image {
            assert!(Instant::now() < deadline, "the image was not restored");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let err = node.propose(register(1, 9)).await.unwrap_err();
        assert_eq!(err.kafka_error_code(), 101, "{err}");
        node.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn propose_without_a_quorum_times_out_with_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Peers 2 and 3 are ports nothing listens on.
        let mut peers = BTreeMap::from([(1, addr.to_string())]);
        for id in [2, 3] {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            peers.insert(id, l.local_addr().unwrap().to_string());
        }
        let mut config = NodeConfig::new(1, peers, addr, dir.path().into()).unwrap();
        fast(&mut config);
        config.propose_timeout = Duration::from_millis(800);
        let node = MetadataNode::start_with_listener(config, listener)
            .await
            .unwrap();
        // An empty log answers every query.
        let m = node.metrics().await;
        assert_eq!(
            (m.leader, m.commit_index, m.applied_index),
            (None, None, None)
        );
        assert!(!m.caught_up());
        assert!(!node.is_leader());
        assert_eq!(node.image().brokers().len(), 0);
        let err = node.propose(register(1, 1)).await.unwrap_err();
        assert!(matches!(err, ProposeError::Timeout { .. }), "{err}");
        assert!(err.to_string().contains("no leader"), "{err}");
        assert_eq!(err.kafka_error_code(), 7);
        node.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn data_dir_of_another_node_id_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut config = NodeConfig::new(
            1,
            BTreeMap::from([(1, addr.to_string())]),
            addr,
            dir.path().into(),
        )
        .unwrap();
        let node = MetadataNode::start_with_listener(config.clone(), listener)
            .await
            .unwrap();
        node.shutdown().await;
        config.node_id = 2;
        config.peers = BTreeMap::from([(2, addr.to_string())]);
        let err = MetadataNode::start(config).await.err().unwrap();
        assert!(
            matches!(
                err,
                StartError::WrongNodeId {
                    found: 1,
                    configured: 2,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("belongs to node 1"), "{err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn request_addressed_to_another_node_id_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = NodeConfig::new(
            1,
            BTreeMap::from([(1, addr.to_string())]),
            addr,
            dir.path().into(),
        )
        .unwrap();
        let node = MetadataNode::start_with_listener(config, listener)
            .await
            .unwrap();
        // A peer whose map says node 2 lives at node 1's address.
        let mut client = PeerClient::new(3, 2, addr.to_string(), &Transport::plain());
        let err = client.hello(Duration::from_secs(5)).await.unwrap_err();
        assert!(err.to_string().contains("peer maps disagree"), "{err}");
        let mut client = PeerClient::new(3, 1, addr.to_string(), &Transport::plain());
        let hello = client.hello(Duration::from_secs(5)).await.unwrap();
        assert_eq!(hello.node_id, 1);
        node.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_is_not_formed_while_peer_lists_disagree() {
        let mut listeners = Vec::new();
        for _ in 0..3 {
            listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let two = BTreeMap::from([(1, addrs[0].to_string()), (2, addrs[1].to_string())]);
        let mut three = two.clone();
        three.insert(3, addrs[2].to_string());
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let mut listeners = listeners.into_iter();
        let mut c1 = NodeConfig::new(1, two, addrs[0], dirs[0].path().into()).unwrap();
        fast(&mut c1);
        let mut c2 = NodeConfig::new(2, three, addrs[1], dirs[1].path().into()).unwrap();
        fast(&mut c2);
        let n1 = MetadataNode::start_with_listener(c1, listeners.next().unwrap())
            .await
            .unwrap();
        let n2 = MetadataNode::start_with_listener(c2, listeners.next().unwrap())
            .await
            .unwrap();
        // Both are up and talking; node 1 keeps refusing to form a cluster with node 2.
        assert_eq!(n1.wait_for_leader(Duration::from_millis(1500)).await, None);
        assert!(!n1.inner.raft.is_initialized().await.unwrap());
        n1.shutdown().await;
        n2.shutdown().await;
    }

    #[tokio::test]
    async fn start_on_a_busy_port_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let busy = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = busy.local_addr().unwrap();
        let config = NodeConfig::new(
            1,
            BTreeMap::from([(1, addr.to_string())]),
            addr,
            dir.path().into(),
        )
        .unwrap();
        let err = MetadataNode::start(config).await.err().unwrap();
        assert!(err.to_string().contains("cannot listen on"), "{err}");
    }
}
