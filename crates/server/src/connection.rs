//! One client connection: frames in, responses out in request order.
//!
//! The reader hands each frame to the broker at once, so appends happen in the order the
//! client sent them; responses that must wait (fsync, long-poll) run as tasks, and the writer
//! sends every response in request order, as the protocol requires.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use spate_broker::{Broker, Reply};
use spate_protocol::frame::{peek_frame_len, take_frame, FrameError};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Requests a connection may have in flight before the broker stops reading from it.
const MAX_IN_FLIGHT: usize = 64;
const READ_CHUNK: usize = 64 * 1024;

/// Why a connection was closed by the broker.
#[derive(Debug, Error)]
pub enum ConnectionError {
    /// Socket failure.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The length prefix was unacceptable.
    #[error("bad frame: {0}")]
    Frame(#[from] FrameError),
    /// The request could not be parsed.
    #[error("malformed request: {0}")]
    Request(#[from] spate_broker::RequestError),
    /// The peer closed in the middle of a frame.
    #[error("peer closed mid-frame with {0} bytes buffered")]
    Truncated(usize),
}

enum Outgoing {
    Now(Bytes),
    Later(JoinHandle<Bytes>),
}

/// Serves one connection until the peer closes it or it misbehaves.
pub async fn serve(broker: Arc<Broker>, stream: TcpStream) -> Result<(), ConnectionError> {
    stream.set_nodelay(true)?;
    // Kafka reports client hosts as "/address".
    let peer = stream
        .peer_addr()
        .map(|a| format!("/{}", a.ip()))
        .unwrap_or_default();
    let max_frame = broker.config.max_frame_bytes;
    let (mut rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::channel::<Outgoing>(MAX_IN_FLIGHT);
    let writer = tokio::spawn(write_responses(wr, rx));
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let result = async {
        loop {
            while let Some(frame) = take_frame(&mut buf, max_frame)? {
                let out = match broker.handle(frame, &peer)? {
                    Reply::None => continue,
                    Reply::Now(b) => Outgoing::Now(b),
                    Reply::Later(f) => Outgoing::Later(tokio::spawn(f)),
                };
                if tx.send(out).await.is_err() {
                    // The writer failed; its error is reported below.
                    return Ok(());
                }
            }
            // Make room for the whole next frame at once when its size is known.
            let want = peek_frame_len(&buf, max_frame)?
                .map_or(READ_CHUNK, |n| (n + 4).saturating_sub(buf.len()))
                .max(READ_CHUNK);
            buf.reserve(want);
            if rd.read_buf(&mut buf).await? == 0 {
                return if buf.is_empty() {
                    Ok(())
                } else {
                    Err(ConnectionError::Truncated(buf.len()))
                };
            }
        }
    }
    .await;
    drop(tx);
    let written = writer.await.unwrap_or(Ok(()));
    result?;
    written.map_err(ConnectionError::Io)
}

async fn write_responses(
    wr: tokio::net::tcp::OwnedWriteHalf,
    mut rx: mpsc::Receiver<Outgoing>,
) -> std::io::Result<()> {
    let mut wr = BufWriter::with_capacity(64 * 1024, wr);
    while let Some(out) = rx.recv().await {
        let bytes = match out {
            Outgoing::Now(b) => b,
            Outgoing::Later(h) => match h.await {
                Ok(b) => b,
                Err(e) => {
                    // A handler panicked: the stream can no longer be answered in order.
                    return Err(std::io::Error::other(format!(
                        "request handler failed: {e}"
                    )));
                }
            },
        };
        wr.write_all(&bytes).await?;
        if rx.is_empty() {
            wr.flush().await?;
        }
    }
    wr.flush().await
}
