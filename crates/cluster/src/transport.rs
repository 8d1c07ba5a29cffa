//! How nodes connect to each other: plain TCP, or mutual TLS (`--cluster-tls`), for every
//! inter-node connection: the quorum's RPCs and the Kafka requests brokers send each other
//! (replica fetches, epoch lookups, forwarded produces, transaction markers), which travel
//! on the same port after a short preface (see [`KAFKA_PREFACE`]).
//!
//! The TLS configurations are built by the binary (which owns certificate loading and
//! reloading); this module only applies them, so one crypto provider serves the process.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// What a Kafka connection between nodes sends first: a Raft frame can never be empty, so
/// an empty length followed by these four bytes cannot be mistaken for one.
pub const KAFKA_PREFACE: [u8; 8] = [0, 0, 0, 0, b'K', b'A', b'F', b'K'];

/// Longest a TLS handshake between nodes may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A byte stream between two nodes (plain or TLS).
pub trait NodeStream: AsyncRead + AsyncWrite + Unpin + Send + Sync {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync> NodeStream for T {}

/// A boxed inter-node stream.
pub type BoxedStream = Box<dyn NodeStream>;

/// Takes inter-node connections that opened with [`KAFKA_PREFACE`] (the broker serves them
/// as requests from another node).
#[derive(Clone)]
pub struct KafkaHandoff(Arc<dyn Fn(BoxedStream, SocketAddr) + Send + Sync>);

impl KafkaHandoff {
    /// A handoff calling `f` with each connection (after the preface) and its peer address.
    pub fn new(f: impl Fn(BoxedStream, SocketAddr) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    pub(crate) fn take(&self, stream: BoxedStream, peer: SocketAddr) {
        (self.0)(stream, peer)
    }
}

impl fmt::Debug for KafkaHandoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KafkaHandoff")
    }
}

/// Plain TCP, or TLS with a certificate on both ends.
#[derive(Clone, Default)]
pub struct Transport {
    tls: Option<(TlsConnector, TlsAcceptor)>,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.tls.is_some() {
            "Transport(tls)"
        } else {
            "Transport(plain)"
        })
    }
}

impl Transport {
    /// Plain TCP (the default).
    pub fn plain() -> Self {
        Self::default()
    }

    /// TLS: `connector` presents this node's certificate and checks the peer's against the
    /// cluster CA and its address; `acceptor` requires a client certificate from that CA.
    pub fn tls(connector: TlsConnector, acceptor: TlsAcceptor) -> Self {
        Self {
            tls: Some((connector, acceptor)),
        }
    }

    /// Whether connections are encrypted.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Connects to `addr` ("host:port"), within `timeout` for TCP and the TLS handshake.
    pub async fn connect(&self, addr: &str, timeout: Duration) -> io::Result<BoxedStream> {
        let tcp = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(r) => r?,
            Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
        };
        tcp.set_nodelay(true)?;
        let Some((connector, _)) = &self.tls else {
            return Ok(Box::new(tcp));
        };
        let host = host_of(addr);
        let name = ServerName::try_from(host.to_owned()).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("'{host}' is not a host name TLS can check: {e}"),
            )
        })?;
        match tokio::time::timeout(timeout, connector.connect(name, tcp)).await {
            Ok(Ok(s)) => Ok(Box::new(s)),
            Ok(Err(e)) => Err(tls_error(addr, e)),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "TLS handshake timed out",
            )),
        }
    }

    /// Connects to `addr` for Kafka requests: the preface is sent, then the stream carries
    /// Kafka frames.
    pub async fn connect_kafka(&self, addr: &str, timeout: Duration) -> io::Result<BoxedStream> {
        let mut s = self.connect(addr, timeout).await?;
        s.write_all(&KAFKA_PREFACE).await?;
        Ok(s)
    }

    /// Completes an accepted connection (the TLS handshake, when TLS is on).
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<BoxedStream> {
        tcp.set_nodelay(true)?;
        let Some((_, acceptor)) = &self.tls else {
            return Ok(Box::new(tcp));
        };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
            Ok(Ok(s)) => Ok(Box::new(s)),
            Ok(Err(e)) => Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("TLS handshake refused: {e}"),
            )),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "TLS handshake timed out",
            )),
        }
    }
}

/// Reads the rest of a preface whose first four (zero) bytes were read: whether it is
/// [`KAFKA_PREFACE`].
pub(crate) async fn rest_is_kafka_preface(stream: &mut BoxedStream) -> io::Result<bool> {
    let mut rest = [0u8; 4];
    stream.read_exact(&mut rest).await?;
    Ok(rest == KAFKA_PREFACE[4..])
}

/// The host part of "host:port" (an IPv6 address without its brackets).
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

fn tls_error(addr: &str, e: io::Error) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("TLS handshake with {addr} failed: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_of_an_address_is_what_tls_checks() {
        assert_eq!(host_of("spate-0.spate:9093"), "spate-0.spate");
        assert_eq!(host_of("127.0.0.1:9093"), "127.0.0.1");
        assert_eq!(host_of("[::1]:9093"), "::1");
    }

    #[test]
    fn the_kafka_preface_is_no_raft_frame() {
        // A Raft frame's length is that of a JSON body, never zero.
        assert_eq!(
            u32::from_be_bytes(KAFKA_PREFACE[..4].try_into().unwrap()),
            0
        );
    }
}
