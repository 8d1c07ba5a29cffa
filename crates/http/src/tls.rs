//! HTTPS (`--http-tls`): a listener that hands axum connections whose TLS handshake is done,
//! and the client side of node-to-node HTTPS.
//!
//! Handshakes run in their own tasks, bounded in number and time, so a client that opens a
//! connection and says nothing holds neither the accept loop nor other clients.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Longest a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; more connections wait in the kernel's backlog.
const MAX_HANDSHAKES: usize = 256;

/// Connections whose TLS handshake finished, for `axum::serve`.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl TlsListener {
    /// Accepts on `tcp` and completes each connection's handshake with `acceptor`.
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor) -> io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
        let accepting = tokio::spawn(async move {
            loop {
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    return;
                };
                let (stream, peer) = match tcp.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        // Out of descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "HTTPS accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "HTTPS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "HTTPS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self {
            ready,
            local,
            accepting,
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(x) => x,
            // The accept task ended (it only does when the runtime stops): nothing comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// How this node reaches other nodes' HTTP listeners: plain, or HTTPS trusting the CA.
#[derive(Clone, Default)]
pub struct PeerTls(pub Option<TlsConnector>);

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "PeerTls(https)"
        } else {
            "PeerTls(http)"
        })
    }
}
