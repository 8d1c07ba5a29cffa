//! One client connection: frames in, responses out in request order.
//!
//! The reader hands each frame to the broker at once, so appends happen in the order the
//! client sent them; responses that must wait (fsync, long-poll) run as tasks, and the writer
//! sends every response in request order, as the protocol requires. Before reading a frame's
//! body the reader takes that many bytes from the broker's memory budget; when the budget is
//! spent it stops reading (the client feels TCP back-pressure and sees throttle_time_ms).

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use spate_broker::quotas::Mute;
use spate_broker::{Broker, Permit, Reply, RequestContext};
use spate_protocol::frame::{peek_frame_len, take_frame, FrameError};
use spate_protocol::header::RawPrefix;
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

enum Body {
    Now(Bytes),
    Later(JoinHandle<Bytes>),
    /// A fetch: its frame and the memory its records already hold.
    Held(JoinHandle<(Bytes, Option<Permit>)>),
}

/// A response on its way out, with what it holds from the memory budget.
struct Outgoing {
    body: Body,
    api_key: i16,
    correlation_id: i32,
    started: Instant,
    _request_memory: Option<Permit>,
}

/// Serves one connection until the peer closes it or it misbehaves.
pub async fn serve(broker: Arc<Broker>, stream: TcpStream) -> Result<(), ConnectionError> {
    stream.set_nodelay(true)?;
    // Kafka reports client hosts as "/address".
    let peer = stream
        .peer_addr()
        .map(|a| format!("/{}", a.ip()))
        .unwrap_or_default();
    // Slow requests' exemplars name the connection with its port.
    let peer_addr = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let max_frame = broker.config.max_frame_bytes;
    let (mut rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::channel::<Outgoing>(MAX_IN_FLIGHT);
    let writer = tokio::spawn(write_responses(broker.clone(), wr, rx, peer_addr.clone()));
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut permit: Option<Permit> = None;
    let mut throttle_ms = 0i32;
    let mute = Mute::new();
    let result = async {
        loop {
            // Every frame takes its size from the budget before it is handled (and, when it is
            // not all here yet, before the rest of it is read).
            let next = peek_frame_len(&buf, max_frame)?;
            if let (Some(n), None) = (next, &permit) {
                let (p, waited) = broker.budget.acquire(n + 4).await;
                permit = Some(p);
                throttle_ms = waited.as_millis().min(i32::MAX as u128) as i32;
            }
            if let Some(frame) = take_frame(&mut buf, max_frame)? {
                let started = Instant::now();
                let (api_key, correlation_id) = RawPrefix::peek(&frame)
                    .map(|p| (p.api_key, p.correlation_id))
                    .unwrap_or((-1, -1));
                // A client over its quota is read no further until its throttle time has
                // passed (KIP-219: the response already told it how long).
                if let Some(until) = mute.until() {
                    tokio::time::sleep_until(until.into()).await;
                }
                let rc = RequestContext {
                    peer: &peer,
                    throttle_ms: std::mem::take(&mut throttle_ms),
                    mute: Some(&mute),
                };
                let body = match broker.handle(frame, rc)? {
                    Reply::None => {
                        broker.metrics.request_from(
                            api_key,
                            started.elapsed().as_micros() as u64,
                            &peer_addr,
                            correlation_id,
                        );
                        permit = None;
                        continue;
                    }
                    Reply::Now(b) => Body::Now(b),
                    Reply::Later(f) => Body::Later(tokio::spawn(f)),
                    // Read nothing more until it is done: later requests may depend on it.
                    Reply::Serial(f) => Body::Now(f.await),
                    Reply::Held { memory, start } => {
                        let (memory, waited) = match memory {
                            Some(n) => {
                                // The fetch frame is decoded: its own memory goes back first,
                                // so the fetch waits only for others' memory.
                                permit = None;
                                let (p, waited) = broker.budget.acquire(n).await;
                                (Some(p), waited)
                            }
                            None => (None, std::time::Duration::ZERO),
                        };
                        let waited_ms = waited.as_millis().min(i32::MAX as u128) as i32;
                        Body::Held(tokio::spawn(start(memory, waited_ms)))
                    }
                };
                let out = Outgoing {
                    body,
                    api_key,
                    correlation_id,
                    started,
                    _request_memory: permit.take(),
                };
                if tx.send(out).await.is_err() {
                    // The writer failed; its error is reported below.
                    return Ok(());
                }
                continue;
            }
            // Make room for the whole next frame at once when its size is known.
            let want = next.map_or(READ_CHUNK, |n| (n + 4).saturating_sub(buf.len()));
            buf.reserve(want.max(READ_CHUNK));
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
    broker: Arc<Broker>,
    wr: tokio::net::tcp::OwnedWriteHalf,
    mut rx: mpsc::Receiver<Outgoing>,
    peer: String,
) -> std::io::Result<()> {
    let mut wr = BufWriter::with_capacity(broker.config.write_buffer_bytes, wr);
    while let Some(out) = rx.recv().await {
        // A handler that panicked leaves the stream unable to answer in order.
        let failed = |e: tokio::task::JoinError| {
            std::io::Error::other(format!("request handler failed: {e}"))
        };
        let (bytes, held) = match out.body {
            Body::Now(b) => (b, None),
            Body::Later(h) => (h.await.map_err(failed)?, None),
            Body::Held(h) => h.await.map_err(failed)?,
        };
        broker.metrics.request_from(
            out.api_key,
            out.started.elapsed().as_micros() as u64,
            &peer,
            out.correlation_id,
        );
        // Responses count against the budget until written, so big fetch responses slow
        // down reading new requests instead of growing memory. A fetch took its memory before
        // reading; it now holds exactly its frame.
        let _response_memory = match held {
            Some(mut p) => {
                p.resize(bytes.len());
                p
            }
            None => broker.budget.charge(bytes.len()),
        };
        wr.write_all(&bytes).await?;
        if rx.is_empty() {
            wr.flush().await?;
        }
    }
    wr.flush().await
}
