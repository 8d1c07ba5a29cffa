//! Inter-node transport of the metadata quorum: openraft's `RaftNetwork` over plain TCP, and
//! the server side that answers it.
//!
//! Frames are `u32 BE body length | body`, the body being serde_json. JSON rather than
//! bincode because: openraft's messages carry errors built on `AnyError` and serde attributes
//! that only self-describing formats are guaranteed to round-trip; metadata traffic is a few
//! small messages per second, so size and speed do not matter here; and a frame can be read
//! in a packet capture when a cluster misbehaves. Frames above [`MAX_FRAME_BYTES`] are
//! refused on both sides (an oversized AppendEntries is reported to openraft as
//! `PayloadTooLarge`, which makes it send fewer entries).
//!
//! A client keeps one connection per peer and sends one request at a time (openraft never
//! has two RPCs in flight on one `RaftNetwork`); any error or timeout drops the connection so
//! a late answer can never be mistaken for the next one's.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    ClientWriteError, InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError,
    RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, ClientWriteResponse, InstallSnapshotRequest,
    InstallSnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::RPCTypes;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
#[cfg(test)]
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::heartbeat::{self, HeartbeatError};
use crate::membership::{MembershipChange, MembershipError};
use crate::metadata::MetadataCommand;
use crate::raft::{MetadataRaft, NodeId, PeerNode, TypeConfig};
use crate::transport::{BoxedStream, KafkaHandoff, Transport};

/// Largest frame accepted or sent (the log's record limit: one entry must fit in a frame).
pub const MAX_FRAME_BYTES: usize = 64 << 20;
/// Connect timeout to a peer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// A server connection idle this long is closed (Raft heartbeats keep live ones busy).
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Bound on how long the server lets one request run (a client write waits for commit).
const HANDLER_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on concurrent inbound connections: peers need a handful each.
const MAX_CONNECTIONS: usize = 64;

/// The result of a client write as the leader's Raft returns it.
pub type ClientWriteResult =
    Result<ClientWriteResponse<TypeConfig>, RaftError<NodeId, ClientWriteError<NodeId, PeerNode>>>;

/// What one node says about itself when asked: used to check peer maps agree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloResponse {
    /// The node's id.
    pub node_id: NodeId,
    /// Its peer map (`id -> address`).
    pub peers: BTreeMap<NodeId, String>,
    /// Whether its Raft log holds a membership (the cluster was formed).
    pub initialized: bool,
}

#[derive(Serialize, Deserialize)]
struct RequestEnvelope {
    from: NodeId,
    to: NodeId,
    body: Request,
}

#[derive(Serialize, Deserialize)]
enum Request {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    ClientWrite(MetadataCommand),
    Hello,
    Membership(MembershipChange),
    /// A broker's heartbeat, for the active controller (out of the Raft log).
    BrokerHeartbeat {
        broker_id: crate::metadata::BrokerId,
        broker_epoch: i64,
    },
    /// The leader's commit index, confirmed with a quorum (Raft's ReadIndex).
    ReadIndex,
    /// Would the peer vote for a candidate whose log ends here (see `pre_vote`)?
    PreVote {
        last_log: Option<openraft::LogId<NodeId>>,
    },
}

#[derive(Serialize, Deserialize)]
enum Response {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    ClientWrite(ClientWriteResult),
    Hello(HelloResponse),
    Membership(Result<(), MembershipError>),
    BrokerHeartbeat(Result<(), HeartbeatError>),
    ReadIndex(Result<Option<u64>, HeartbeatError>),
    PreVote(bool),
    /// The server would not handle the request; the reason says why.
    Refused(String),
}

/// Why an RPC to a peer failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Nothing accepted the connection: the peer is down or the address is wrong.
    #[error("node {target} at {addr} is unreachable: {source}")]
    PeerDown {
        /// Target node.
        target: NodeId,
        /// Its address.
        addr: String,
        /// The connect error.
        source: io::Error,
    },
    /// No answer within the deadline.
    #[error("node {target} at {addr} did not answer within {after:?}")]
    Timeout {
        /// Target node.
        target: NodeId,
        /// Its address.
        addr: String,
        /// The deadline.
        after: Duration,
    },
    /// The connection failed mid-call.
    #[error("connection to node {target} at {addr} failed: {source}")]
    Io {
        /// Target node.
        target: NodeId,
        /// Its address.
        addr: String,
        /// The I/O error.
        source: io::Error,
    },
    /// A frame exceeded [`MAX_FRAME_BYTES`].
    #[error("frame of {size} bytes exceeds the {max}-byte limit")]
    FrameTooLarge {
        /// Frame size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// A frame did not encode or decode.
    #[error("bad frame: {0}")]
    Codec(#[from] serde_json::Error),
    /// The peer refused the request (e.g. it is not the node we think it is).
    #[error("node {target} at {addr} refused the request: {reason}")]
    Refused {
        /// Target node.
        target: NodeId,
        /// Its address.
        addr: String,
        /// The peer's reason.
        reason: String,
    },
    /// The peer answered with a response of another kind.
    #[error("node {target} answered with an unexpected response")]
    UnexpectedResponse {
        /// Target node.
        target: NodeId,
    },
}

async fn write_frame<S: AsyncWrite + Unpin + ?Sized>(
    stream: &mut S,
    body: &[u8],
) -> io::Result<()> {
    // One buffer, one write: with TCP_NODELAY a separate length write would be its own packet.
    let len = u32::try_from(body.len()).map_err(io::Error::other)?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(body);
    stream.write_all(&frame).await?;
    stream.flush().await
}

/// Reads one frame; `Ok(None)` on a clean end of stream before a frame starts.
async fn read_frame<S: AsyncRead + Unpin + ?Sized>(stream: &mut S) -> io::Result<Option<Vec<u8>>> {
    match read_len(stream).await? {
        Some(len) => read_body(stream, len).await.map(Some),
        None => Ok(None),
    }
}

/// Reads a frame's length; `Ok(None)` on a clean end of stream before it.
async fn read_len<S: AsyncRead + Unpin + ?Sized>(stream: &mut S) -> io::Result<Option<usize>> {
    let mut len = [0u8; 4];
    match stream.read_exact(&mut len).await {
        Ok(_) => Ok(Some(u32::from_be_bytes(len) as usize)),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads a frame's body of `len` bytes.
async fn read_body<S: AsyncRead + Unpin + ?Sized>(
    stream: &mut S,
    len: usize,
) -> io::Result<Vec<u8>> {
    if len > MAX_FRAME_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte limit"),
        ));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).await?;
    Ok(body)
}

/// What this node's Raft connections say about each peer's process. A peer whose port
/// refuses connections has a host that answers and nothing listening: its process is gone
/// (killed, crashed, or restarting). Timeouts and unreachable networks say nothing of the
/// sort and are left to the heartbeat session timeout.
#[derive(Debug, Default)]
pub struct PeerHealth {
    /// Since when each peer has refused every connection, with no success in between.
    refusing: parking_lot::Mutex<BTreeMap<NodeId, std::time::Instant>>,
}

impl PeerHealth {
    /// A connection to `peer` was refused.
    pub fn refused(&self, peer: NodeId) {
        self.refusing
            .lock()
            .entry(peer)
            .or_insert_with(std::time::Instant::now);
    }

    /// `peer` answered.
    pub fn reached(&self, peer: NodeId) {
        self.refusing.lock().remove(&peer);
    }

    /// Peers that have refused every connection for at least `streak`, with how long.
    pub fn down(&self, streak: Duration) -> Vec<(NodeId, Duration)> {
        self.refusing
            .lock()
            .iter()
            .map(|(id, since)| (*id, since.elapsed()))
            .filter(|(_, refusing)| *refusing >= streak)
            .collect()
    }
}

/// A connection to one peer, used for Raft RPCs and for forwarding client writes.
pub struct PeerClient {
    from: NodeId,
    target: NodeId,
    addr: String,
    transport: Transport,
    conn: Option<BoxedStream>,
    health: Option<Arc<PeerHealth>>,
}

impl PeerClient {
    /// A client from node `from` to node `target` at `addr` over `transport` (connects
    /// lazily).
    pub fn new(from: NodeId, target: NodeId, addr: String, transport: &Transport) -> Self {
        Self {
            from,
            target,
            addr,
            transport: transport.clone(),
            conn: None,
            health: None,
        }
    }

    /// Records refused connections and successes in `health`.
    pub fn with_health(mut self, health: Arc<PeerHealth>) -> Self {
        self.health = Some(health);
        self
    }

    async fn call(&mut self, body: Request, timeout: Duration) -> Result<Response, TransportError> {
        let frame = serde_json::to_vec(&RequestEnvelope {
            from: self.from,
            to: self.target,
            body,
        })?;
        if frame.len() > MAX_FRAME_BYTES {
            return Err(TransportError::FrameTooLarge {
                size: frame.len(),
                max: MAX_FRAME_BYTES,
            });
        }
        let result = tokio::time::timeout(timeout, self.exchange(&frame)).await;
        let result = match result {
            Ok(r) => r,
            Err(_) => Err(TransportError::Timeout {
                target: self.target,
                addr: self.addr.clone(),
                after: timeout,
            }),
        };
        match result {
            Ok(Response::Refused(reason)) => Err(TransportError::Refused {
                target: self.target,
                addr: self.addr.clone(),
                reason,
            }),
            Ok(resp) => Ok(resp),
            Err(e) => {
                // The stream may hold half a frame or a late answer: never reuse it.
                self.conn = None;
                Err(e)
            }
        }
    }

    async fn exchange(&mut self, frame: &[u8]) -> Result<Response, TransportError> {
        let io_err = |source| TransportError::Io {
            target: self.target,
            addr: self.addr.clone(),
            source,
        };
        let mut stream = match self.conn.take() {
            Some(s) => s,
            None => match self.transport.connect(&self.addr, CONNECT_TIMEOUT).await {
                Ok(s) => s,
                Err(source) => {
                    if source.kind() == io::ErrorKind::ConnectionRefused {
                        if let Some(h) = &self.health {
                            h.refused(self.target);
                        }
                    }
                    return Err(TransportError::PeerDown {
                        target: self.target,
                        addr: self.addr.clone(),
                        source,
                    });
                }
            },
        };
        write_frame(&mut stream, frame).await.map_err(io_err)?;
        let body = read_frame(&mut stream)
            .await
            .map_err(io_err)?
            .ok_or_else(|| {
                io_err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the connection",
                ))
            })?;
        let resp = serde_json::from_slice(&body)?;
        self.conn = Some(stream);
        if let Some(h) = &self.health {
            h.reached(self.target);
        }
        Ok(resp)
    }

    /// Asks the peer to propose `cmd` through its Raft (it must be the leader to accept).
    pub async fn client_write(
        &mut self,
        cmd: MetadataCommand,
        timeout: Duration,
    ) -> Result<ClientWriteResult, TransportError> {
        match self.call(Request::ClientWrite(cmd), timeout).await? {
            Response::ClientWrite(r) => Ok(r),
            _ => Err(TransportError::UnexpectedResponse {
                target: self.target,
            }),
        }
    }

    /// Asks the peer to change the quorum's membership (it must be the leader to accept).
    pub async fn change_membership(
        &mut self,
        change: MembershipChange,
        timeout: Duration,
    ) -> Result<Result<(), MembershipError>, TransportError> {
        match self.call(Request::Membership(change), timeout).await? {
            Response::Membership(r) => Ok(r),
            _ => Err(TransportError::UnexpectedResponse {
                target: self.target,
            }),
        }
    }

    /// Sends a broker heartbeat to the peer, which takes it if it is the active controller.
    pub async fn broker_heartbeat(
        &mut self,
        broker_id: crate::metadata::BrokerId,
        broker_epoch: i64,
        timeout: Duration,
    ) -> Result<Result<(), HeartbeatError>, TransportError> {
        let req = Request::BrokerHeartbeat {
            broker_id,
            broker_epoch,
        };
        match self.call(req, timeout).await? {
            Response::BrokerHeartbeat(r) => Ok(r),
            _ => Err(TransportError::UnexpectedResponse {
                target: self.target,
            }),
        }
    }

    /// Asks the peer whether it would vote for a candidate whose log ends at `last_log`.
    pub async fn pre_vote(
        &mut self,
        last_log: Option<openraft::LogId<NodeId>>,
        timeout: Duration,
    ) -> Result<bool, TransportError> {
        match self.call(Request::PreVote { last_log }, timeout).await? {
            Response::PreVote(granted) => Ok(granted),
            _ => Err(TransportError::UnexpectedResponse {
                target: self.target,
            }),
        }
    }

    /// Asks the peer, if it leads, for its commit index confirmed with a quorum.
    pub async fn read_index(
        &mut self,
        timeout: Duration,
    ) -> Result<Result<Option<u64>, HeartbeatError>, TransportError> {
        match self.call(Request::ReadIndex, timeout).await? {
            Response::ReadIndex(r) => Ok(r),
            _ => Err(TransportError::UnexpectedResponse {
                target: self.target,
            }),
        }
    }

    /// Asks the peer who it is and what peers it knows.
    pub async fn hello(&mut self, timeout: Duration) -> Result<HelloResponse, TransportError> {
        match self.call(Request::Hello, timeout).await? {
            Response::Hello(r) => Ok(r),
            _ => Err(TransportError::UnexpectedResponse {
                target: self.target,
            }),
        }
    }

    fn rpc_error<E: std::error::Error>(
        &self,
        e: TransportError,
        action: RPCTypes,
        timeout: Duration,
        entries: usize,
    ) -> RPCError<NodeId, PeerNode, E> {
        match e {
            TransportError::PeerDown { .. } | TransportError::Refused { .. } => {
                RPCError::Unreachable(Unreachable::new(&e))
            }
            TransportError::Timeout { .. } => RPCError::Timeout(Timeout {
                action,
                id: self.from,
                target: self.target,
                timeout,
            }),
            TransportError::FrameTooLarge { .. } if entries > 1 => {
                RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint((entries / 2) as u64))
            }
            _ => RPCError::Network(NetworkError::new(&e)),
        }
    }

    fn unexpected<E: std::error::Error>(&self) -> RPCError<NodeId, PeerNode, E> {
        RPCError::Network(NetworkError::new(&TransportError::UnexpectedResponse {
            target: self.target,
        }))
    }
}

/// Creates a [`PeerClient`] per target for openraft.
pub struct NetworkFactory {
    from: NodeId,
    peers: Arc<BTreeMap<NodeId, String>>,
    health: Arc<PeerHealth>,
    transport: Transport,
}

impl NetworkFactory {
    /// A factory for node `from`. Addresses come from `peers` (this node's configuration)
    /// first and from the Raft membership only for ids it does not list, so an address
    /// change in the configuration takes effect without a membership change.
    pub fn new(
        from: NodeId,
        peers: BTreeMap<NodeId, String>,
        health: Arc<PeerHealth>,
        transport: Transport,
    ) -> Self {
        Self {
            from,
            peers: Arc::new(peers),
            health,
            transport,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &PeerNode) -> PeerClient {
        let addr = self
            .peers
            .get(&target)
            .cloned()
            .unwrap_or_else(|| node.addr.clone());
        PeerClient::new(self.from, target, addr, &self.transport).with_health(self.health.clone())
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, PeerNode, RaftError<NodeId>>> {
        let entries = rpc.entries.len();
        let ttl = option.hard_ttl();
        match self.call(Request::AppendEntries(rpc), ttl).await {
            Ok(Response::AppendEntries(Ok(r))) => Ok(r),
            Ok(Response::AppendEntries(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.rpc_error(e, RPCTypes::AppendEntries, ttl, entries)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, PeerNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let ttl = option.hard_ttl();
        match self.call(Request::InstallSnapshot(rpc), ttl).await {
            Ok(Response::InstallSnapshot(Ok(r))) => Ok(r),
            Ok(Response::InstallSnapshot(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.rpc_error(e, RPCTypes::InstallSnapshot, ttl, 0)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, PeerNode, RaftError<NodeId>>> {
        let ttl = option.hard_ttl();
        match self.call(Request::Vote(rpc), ttl).await {
            Ok(Response::Vote(Ok(r))) => Ok(r),
            Ok(Response::Vote(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.rpc_error(e, RPCTypes::Vote, ttl, 0)),
        }
    }
}

/// What the inter-node server answers from besides Raft itself.
#[derive(Clone)]
pub struct PeerServices {
    /// Takes broker heartbeats (and read-index requests) while this node leads the quorum.
    pub heartbeats: heartbeat::Receiver,
    /// Set while this voter rejoins after losing its metadata log: it grants no vote, since
    /// it no longer holds entries it may have acknowledged (Raft's safety rests on voters
    /// keeping their logs; KIP-853 treats such a node as a new one for the same reason).
    pub rejoining: Arc<std::sync::atomic::AtomicBool>,
    /// What this voter answers to pre-votes, and when it last heard from a leader.
    pub pre_vote: Arc<crate::pre_vote::PreVote>,
    /// Plain or TLS.
    pub transport: Transport,
    /// Where connections carrying Kafka requests between brokers go (refused without one).
    pub kafka: Option<KafkaHandoff>,
}

/// Serves Raft RPCs, forwarded client writes and hellos for `raft` on `listener` until the
/// returned future is dropped (dropping it also closes every connection it accepted).
///
/// `node_id` and `peers` are this node's identity: a request addressed to another node id is
/// refused with a message saying the peer maps disagree.
pub async fn serve(
    listener: TcpListener,
    raft: MetadataRaft,
    node_id: NodeId,
    peers: BTreeMap<NodeId, String>,
    services: PeerServices,
) {
    let services = Arc::new(services);
    let peers = Arc::new(peers);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        // Reap finished connection tasks so the set stays bounded.
        while connections.try_join_next().is_some() {}
        let (stream, remote) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Usually EMFILE: back off instead of spinning on the error.
                tracing::warn!(error = %e, "metadata quorum: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%remote, limit = MAX_CONNECTIONS, "metadata quorum: too many inter-node connections, closing a new one");
            continue;
        };
        let raft = raft.clone();
        let peers = peers.clone();
        let services = services.clone();
        connections.spawn(async move {
            let stream = match services.transport.accept(stream).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(%remote, error = %e, "inter-node connection refused");
                    return;
                }
            };
            match serve_connection(stream, raft, node_id, peers, services.clone()).await {
                Ok(Some(kafka)) => match &services.kafka {
                    // The slot goes with the task: the broker bounds its own connections.
                    Some(handoff) => handoff.take(kafka, remote),
                    None => tracing::warn!(%remote, "a Kafka connection on the inter-node port, but no broker takes them"),
                },
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(%remote, error = %e, "metadata quorum: connection closed")
                }
            }
            drop(permit);
        });
    }
}

/// Serves one connection's Raft frames; returns the stream when its first frame is the
/// Kafka preface instead (a broker's connection for Kafka requests).
async fn serve_connection(
    mut stream: BoxedStream,
    raft: MetadataRaft,
    node_id: NodeId,
    peers: Arc<BTreeMap<NodeId, String>>,
    services: Arc<PeerServices>,
) -> io::Result<Option<BoxedStream>> {
    let mut first = true;
    loop {
        let len = match tokio::time::timeout(IDLE_TIMEOUT, read_len(&mut stream)).await {
            Ok(Ok(Some(len))) => len,
            Ok(Ok(None)) | Err(_) => return Ok(None),
            Ok(Err(e)) => return Err(e),
        };
        if len == 0 && first {
            if crate::transport::rest_is_kafka_preface(&mut stream).await? {
                return Ok(Some(stream));
            }
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "an empty frame that is not the Kafka preface",
            ));
        }
        first = false;
        let body = match tokio::time::timeout(IDLE_TIMEOUT, read_body(&mut stream, len)).await {
            Ok(Ok(body)) => body,
            Err(_) => return Ok(None),
            Ok(Err(e)) => return Err(e),
        };
        let response = match serde_json::from_slice::<RequestEnvelope>(&body) {
            Err(e) => Response::Refused(format!("malformed request: {e}")),
            Ok(req) if req.to != node_id => {
                tracing::warn!(
                    from = req.from,
                    addressed_to = req.to,
                    node_id,
                    "metadata quorum: request meant for another node; the peer maps disagree"
                );
                Response::Refused(format!(
                    "this is node {node_id}, not node {}: the peer maps disagree",
                    req.to
                ))
            }
            Ok(req) => {
                match tokio::time::timeout(
                    HANDLER_TIMEOUT,
                    handle(&raft, node_id, &peers, &services, req.body),
                )
                .await
                {
                    Ok(r) => r,
                    Err(_) => {
                        Response::Refused(format!("request not handled within {HANDLER_TIMEOUT:?}"))
                    }
                }
            }
        };
        let out = serde_json::to_vec(&response).map_err(io::Error::other)?;
        if out.len() > MAX_FRAME_BYTES {
            let msg = Response::Refused(format!("response of {} bytes is too large", out.len()));
            write_frame(
                &mut stream,
                &serde_json::to_vec(&msg).map_err(io::Error::other)?,
            )
            .await?;
            continue;
        }
        write_frame(&mut stream, &out).await?;
    }
}

async fn handle(
    raft: &MetadataRaft,
    node_id: NodeId,
    peers: &BTreeMap<NodeId, String>,
    state: &PeerServices,
    req: Request,
) -> Response {
    match req {
        Request::AppendEntries(r) => {
            state.pre_vote.heard_from_leader();
            Response::AppendEntries(raft.append_entries(r).await)
        }
        // A voter that lost its log must not help elect a leader that lacks what it had
        // acknowledged: no vote until it has caught up again (see `PeerServices::rejoining`).
        Request::Vote(_) if state.rejoining.load(std::sync::atomic::Ordering::SeqCst) => {
            Response::Refused(
                "this voter lost its metadata log and grants no vote until it has caught up"
                    .to_owned(),
            )
        }
        Request::Vote(r) => Response::Vote(raft.vote(r).await),
        Request::InstallSnapshot(r) => Response::InstallSnapshot(raft.install_snapshot(r).await),
        // Only the leader accepts; anyone else answers ForwardToLeader and the caller retries
        // there. No second hop: a stale leader view is fixed by the caller's retry loop.
        Request::ClientWrite(cmd) => Response::ClientWrite(raft.client_write(cmd).await),
        Request::Membership(change) => {
            Response::Membership(crate::membership::change_on_leader(raft, &change).await)
        }
        Request::BrokerHeartbeat {
            broker_id,
            broker_epoch,
        } => Response::BrokerHeartbeat(state.heartbeats.receive(broker_id, broker_epoch).await),
        Request::ReadIndex => Response::ReadIndex(state.heartbeats.read_index().await),
        Request::PreVote { last_log } => Response::PreVote(
            !state.rejoining.load(std::sync::atomic::Ordering::SeqCst)
                && state.pre_vote.grant(last_log),
        ),
        Request::Hello => Response::Hello(HelloResponse {
            node_id,
            peers: peers.clone(),
            initialized: raft.is_initialized().await.unwrap_or(false),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refused_connections_mark_a_peer_down_until_it_answers() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let health = Arc::new(PeerHealth::default());
        let mut client = PeerClient::new(1, 2, addr.to_string(), &Transport::plain())
            .with_health(health.clone());
        assert!(client.hello(Duration::from_secs(2)).await.is_err());
        assert_eq!(
            health
                .down(Duration::ZERO)
                .iter()
                .map(|(id, _)| *id)
                .collect::<Vec<_>>(),
            vec![2]
        );
        assert!(
            health.down(Duration::from_secs(60)).is_empty(),
            "not refused for long yet"
        );
        // The peer comes back: one answered call clears it.
        let listener = TcpListener::bind(addr).await.unwrap();
        let raft_less = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let _ = read_frame(&mut s).await;
            let reply = serde_json::to_vec(&Response::Refused("test".into())).unwrap();
            write_frame(&mut s, &reply).await.unwrap();
        });
        let _ = client.hello(Duration::from_secs(2)).await;
        raft_less.await.unwrap();
        assert!(health.down(Duration::ZERO).is_empty());
    }

    #[tokio::test]
    async fn call_to_a_closed_port_says_the_peer_is_down() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let mut client = PeerClient::new(1, 2, addr.clone(), &Transport::plain());
        let err = client.hello(Duration::from_secs(2)).await.unwrap_err();
        assert!(
            matches!(err, TransportError::PeerDown { target: 2, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("unreachable"), "{err}");
        assert!(err.to_string().contains(&addr), "{err}");
    }

    #[tokio::test]
    async fn call_to_a_silent_peer_times_out_and_drops_the_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        // Accepts, reads, never answers.
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 1024];
            while s.read(&mut buf).await.unwrap_or(0) > 0 {}
        });
        let mut client = PeerClient::new(1, 2, addr, &Transport::plain());
        let err = client.hello(Duration::from_millis(200)).await.unwrap_err();
        assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
        assert!(client.conn.is_none());
        server.abort();
    }

    #[tokio::test]
    async fn oversized_frame_is_refused_by_the_reader() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let writer = tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(&(u32::MAX).to_be_bytes()).await.unwrap();
            s
        });
        let (mut s, _) = listener.accept().await.unwrap();
        let err = read_frame(&mut s).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("exceeds"), "{err}");
        drop(writer.await.unwrap());
    }

    #[tokio::test]
    async fn frames_round_trip() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let writer = tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            write_frame(&mut s, b"hello").await.unwrap();
            write_frame(&mut s, b"").await.unwrap();
        });
        let (mut s, _) = listener.accept().await.unwrap();
        assert_eq!(read_frame(&mut s).await.unwrap().unwrap(), b"hello");
        assert_eq!(read_frame(&mut s).await.unwrap().unwrap(), b"");
        writer.await.unwrap();
        assert_eq!(read_frame(&mut s).await.unwrap(), None);
    }
}
