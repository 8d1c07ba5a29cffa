//! A Kafka client connection to another broker, for replica fetches, epoch lookups, forwarded
//! produces and transaction markers, and a pool of idle ones. They go to the broker's
//! inter-node address (after the Kafka preface, over the cluster's TLS when it has it), not
//! to a client listener: clients' listeners may ask for SASL or certificates, and this
//! traffic is the cluster's own.
//!
//! One request at a time: a follower's fetcher waits for each answer before it sends the
//! next request, so there is nothing to pipeline.

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Buf, Bytes};
use parking_lot::Mutex;
use spate_cluster::transport::{BoxedStream, Transport};
use spate_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use spate_protocol::{Decodable, Encodable, StrBytes};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// Largest response accepted from a peer: a fetch of `replica.fetch.response.max.bytes` plus
/// room for headers.
const MAX_RESPONSE_BYTES: usize = 128 << 20;

/// Why a call to a peer failed; the connection is dropped and made again.
#[derive(Debug, Error)]
pub enum PeerError {
    /// Connecting, writing or reading failed.
    #[error("talking to {addr}: {source}")]
    Io {
        /// The peer.
        addr: String,
        /// What failed.
        source: std::io::Error,
    },
    /// No answer within the deadline.
    #[error("{addr} did not answer within {0:?}", .timeout)]
    Timeout {
        /// The peer.
        addr: String,
        /// How long we waited.
        timeout: Duration,
    },
    /// The answer could not be read.
    #[error("bad response from {addr}: {reason}")]
    Protocol {
        /// The peer.
        addr: String,
        /// What was wrong.
        reason: String,
    },
}

/// Idle connections to other brokers by address, for requests sent to the same brokers again
/// and again (forwarded produces, transaction markers, KIP-890 verifications): a connection
/// per request cost a TCP handshake each time and left a socket in TIME_WAIT behind.
pub struct PeerPool {
    idle: Mutex<HashMap<String, Vec<PeerConnection>>>,
    client_id: String,
    per_peer: usize,
}

impl PeerPool {
    /// A pool whose connections carry `client_id` and which keeps at most `per_peer` idle
    /// connections to each address.
    pub fn new(client_id: &str, per_peer: usize) -> Self {
        Self {
            idle: Mutex::new(HashMap::new()),
            client_id: client_id.to_owned(),
            per_peer,
        }
    }

    /// An idle connection to `addr` that is still open, or a new one (connecting for at most
    /// `timeout`).
    pub async fn connection(
        &self,
        transport: &Transport,
        addr: &str,
        timeout: Duration,
    ) -> Result<PeerConnection, PeerError> {
        if let Some(c) = self.take(addr) {
            return Ok(c);
        }
        PeerConnection::connect(transport, addr, self.client_id.clone(), timeout).await
    }

    /// Keeps `conn` for the next request to its address. Only after a whole exchange: a call
    /// that timed out may still have its answer coming on that connection.
    pub fn put_back(&self, conn: PeerConnection) {
        let mut idle = self.idle.lock();
        let list = idle.entry(conn.addr.clone()).or_default();
        if list.len() < self.per_peer {
            list.push(conn);
        }
    }

    fn take(&self, addr: &str) -> Option<PeerConnection> {
        let mut idle = self.idle.lock();
        let list = idle.get_mut(addr)?;
        // A peer that restarted closed its end: such connections are dropped here.
        while let Some(mut c) = list.pop() {
            if c.is_open_and_idle() {
                return Some(c);
            }
        }
        None
    }
}

/// An open connection for Kafka requests to another broker's inter-node port.
pub struct PeerConnection {
    addr: String,
    stream: BoxedStream,
    /// Something arrived unasked, or the stream ended: never to be used again.
    broken: bool,
    client_id: StrBytes,
    correlation_id: i32,
}

impl PeerConnection {
    /// Connects to the inter-node address `addr` ("host:port") over `transport`.
    pub async fn connect(
        transport: &Transport,
        addr: &str,
        client_id: String,
        timeout: Duration,
    ) -> Result<Self, PeerError> {
        let stream = transport
            .connect_kafka(addr, timeout)
            .await
            .map_err(|source| match source.kind() {
                std::io::ErrorKind::TimedOut => PeerError::Timeout {
                    addr: addr.to_owned(),
                    timeout,
                },
                _ => PeerError::Io {
                    addr: addr.to_owned(),
                    source,
                },
            })?;
        Ok(Self {
            addr: addr.to_owned(),
            stream,
            broken: false,
            client_id: StrBytes::from_string(client_id),
            correlation_id: 0,
        })
    }

    /// The address this connection goes to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether the connection can carry another request: the peer has not closed it and no
    /// unread bytes wait on it (a connection kept idle for reuse checks this first).
    pub fn is_open_and_idle(&mut self) -> bool {
        // A read that must not complete: pending means open and idle. Anything read makes the
        // connection unusable anyway (an answer nobody asked for, or the end of the stream).
        // Under TLS this also takes in records meant for the TLS layer (session tickets).
        if self.broken {
            return false;
        }
        let mut probe = [0u8; 1];
        let mut buf = tokio::io::ReadBuf::new(&mut probe);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let idle = std::pin::Pin::new(&mut self.stream)
            .poll_read(&mut cx, &mut buf)
            .is_pending();
        self.broken = !idle;
        idle
    }

    /// Sends one request and waits (at most `timeout`) for its response.
    pub async fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, PeerError> {
        let client_id = self.client_id.clone();
        self.exchange(client_id, key, version, request, timeout)
            .await
    }

    /// [`PeerConnection::call`] on behalf of another client: the request carries `client_id`,
    /// which the peer's quotas count it against.
    pub async fn call_as<Req: Encodable, Resp: Decodable>(
        &mut self,
        client_id: &str,
        key: ApiKey,
        version: i16,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, PeerError> {
        let client_id = StrBytes::from_string(client_id.to_owned());
        self.exchange(client_id, key, version, request, timeout)
            .await
    }

    async fn exchange<Req: Encodable, Resp: Decodable>(
        &mut self,
        client_id: StrBytes,
        key: ApiKey,
        version: i16,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, PeerError> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(client_id));
        let body = spate_protocol::codec::encode_request(&header, request)
            .map_err(|e| self.protocol(e.to_string()))?;
        let exchange = async {
            let len = u32::try_from(body.len()).map_err(|_| self.protocol("request too large"))?;
            let mut frame = Vec::with_capacity(body.len() + 4);
            frame.extend_from_slice(&len.to_be_bytes());
            frame.extend_from_slice(&body);
            self.stream
                .write_all(&frame)
                .await
                .map_err(|e| self.io(e))?;
            let len = self.stream.read_u32().await.map_err(|e| self.io(e))? as usize;
            if len > MAX_RESPONSE_BYTES {
                return Err(self.protocol(format!("response of {len} bytes")));
            }
            let mut buf = vec![0u8; len];
            self.stream
                .read_exact(&mut buf)
                .await
                .map_err(|e| self.io(e))?;
            Ok(Bytes::from(buf))
        };
        let mut frame = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| PeerError::Timeout {
                addr: self.addr.clone(),
                timeout,
            })??;
        let header = ResponseHeader::decode(&mut frame, key.response_header_version(version))
            .map_err(|e| self.protocol(e.to_string()))?;
        if header.correlation_id != self.correlation_id {
            return Err(self.protocol(format!(
                "correlation id {} answers request {}",
                header.correlation_id, self.correlation_id
            )));
        }
        let resp = Resp::decode(&mut frame, version).map_err(|e| self.protocol(e.to_string()))?;
        if frame.has_remaining() {
            tracing::debug!(peer = %self.addr, bytes = frame.remaining(), "ignoring trailing bytes in a peer response");
        }
        Ok(resp)
    }

    fn io(&self, source: std::io::Error) -> PeerError {
        PeerError::Io {
            addr: self.addr.clone(),
            source,
        }
    }

    fn protocol(&self, reason: impl Into<String>) -> PeerError {
        PeerError::Protocol {
            addr: self.addr.clone(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_is_idle_until_its_peer_closes_it_or_sends_unasked_bytes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let timeout = Duration::from_secs(5);

        let plain = Transport::plain();
        let mut conn = PeerConnection::connect(&plain, &addr, "t".into(), timeout)
            .await
            .expect("connect");
        let (mut server, _) = listener.accept().await.expect("accept");
        let mut preface = [0u8; 8];
        server.read_exact(&mut preface).await.expect("preface");
        assert_eq!(preface, spate_cluster::transport::KAFKA_PREFACE);
        assert!(conn.is_open_and_idle(), "a fresh connection is reusable");
        server.write_all(&[0]).await.expect("write");
        let deadline = tokio::time::Instant::now() + timeout;
        while conn.is_open_and_idle() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!conn.is_open_and_idle(), "unread bytes make it unusable");

        let mut conn = PeerConnection::connect(&plain, &addr, "t".into(), timeout)
            .await
            .expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        assert!(conn.is_open_and_idle());
        drop(server);
        let deadline = tokio::time::Instant::now() + timeout;
        while conn.is_open_and_idle() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            !conn.is_open_and_idle(),
            "a connection its peer closed is not reused"
        );
    }
}
