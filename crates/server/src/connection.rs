//! One client connection: frames in, responses out in request order.
//!
//! The reader hands each frame to the broker at once, so appends happen in the order the
//! client sent them; responses that must wait (fsync, long-poll) run as tasks, and the writer
//! sends every response in request order, as the protocol requires. Before reading a frame's
//! body the reader takes that many bytes from the broker's memory budget; when the budget is
//! spent it stops reading (the client feels TCP back-pressure and sees throttle_time_ms).
//! While a large frame is under way the socket's low-water mark asks for the rest of it, so a
//! frame that comes in many pieces (a TLS client writes a record of at most 16 KiB at a time)
//! wakes the reader once or twice instead of once a piece.

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use spate_broker::quotas::Mute;
use spate_broker::security::Session;
use spate_broker::{Broker, Permit, Reply, RequestContext};
use spate_protocol::frame::{peek_frame_len, take_frame, FrameError};
use spate_protocol::header::RawPrefix;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A connection's read half, told how many more bytes the frame being read still needs, so
/// that it need not be woken for every piece of it (the socket's low-water mark, SO_RCVLOWAT).
pub trait FrameHint {
    /// At least `bytes` more bytes must arrive before the frame is whole (0: no frame under
    /// way, wake for anything).
    fn expect(&mut self, _bytes: usize) {}
}

impl<T> FrameHint for tokio::io::ReadHalf<T> {}

impl FrameHint for tokio::net::tcp::OwnedReadHalf {
    fn expect(&mut self, bytes: usize) {
        set_low_water(self.as_ref(), bytes);
    }
}

/// Sets `socket`'s receive low-water mark: readiness is reported once `bytes` are queued
/// (also when the receive buffer fills, or on FIN/error).
pub fn set_low_water(socket: &tokio::net::TcpStream, bytes: usize) {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let value: libc::c_int = bytes.clamp(1, libc::c_int::MAX as usize) as libc::c_int;
        // SAFETY: the descriptor is the open socket `socket` borrows; the value is a live
        // c_int and the length passed is its size. A failure leaves the mark as it was.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    #[cfg(not(unix))]
    let _ = (socket, bytes);
}

/// Below this many bytes still to come, a frame is read as it arrives.
const LOW_WATER_FROM: usize = 32 << 10;
/// The highest low-water mark asked for.
const LOW_WATER_MAX: usize = 256 << 10;

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
    /// The TLS handshake failed or took too long.
    #[error("TLS: {0}")]
    Tls(String),
    /// TLS and SASL were not done within --connections-auth-timeout-ms.
    #[error("not authenticated in time")]
    AuthTimeout,
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

/// Serves one connection (its read and write halves: a TCP stream's, or a TLS stream's)
/// until the peer closes it or it misbehaves. Until `auth_deadline` passes the connection
/// must have authenticated (SASL listeners), or it is closed.
pub async fn serve<R, W>(
    broker: Arc<Broker>,
    mut rd: R,
    wr: W,
    peer_socket: std::net::SocketAddr,
    session: Arc<Session>,
    mut auth_deadline: Option<tokio::time::Instant>,
) -> Result<(), ConnectionError>
where
    R: AsyncRead + FrameHint + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    // Kafka reports client hosts as "/address".
    let peer = format!("/{}", peer_socket.ip());
    // Slow requests' exemplars name the connection with its port.
    let peer_addr = peer_socket.to_string();
    let max_frame = broker.config.max_frame_bytes;
    let (tx, rx) = mpsc::channel::<Outgoing>(MAX_IN_FLIGHT);
    let writer = tokio::spawn(write_responses(broker.clone(), wr, rx, peer_addr.clone()));
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut permit: Option<Permit> = None;
    let mut throttle_ms = 0i32;
    let mute = Mute::new();
    let mut low_water = 0;
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
                if session.expects_raw_token() {
                    // After a v0 SaslHandshake the next frame is a bare SASL token, answered
                    // with a bare token; a failed exchange just closes (raw framing has no
                    // error field).
                    let b = broker.clone();
                    let s = session.clone();
                    let answer = tokio::task::spawn_blocking(move || {
                        spate_broker::handlers::sasl::raw_token(&b, &s, &frame)
                    })
                    .await
                    .ok()
                    .flatten();
                    let Some(token) = answer else {
                        return Ok(());
                    };
                    let mut out = BytesMut::with_capacity(token.len() + 4);
                    out.extend_from_slice(&(token.len() as u32).to_be_bytes());
                    out.extend_from_slice(&token);
                    let raw = Outgoing {
                        body: Body::Now(out.freeze()),
                        api_key: -1,
                        correlation_id: -1,
                        started,
                        _request_memory: permit.take(),
                    };
                    if tx.send(raw).await.is_err() {
                        return Ok(());
                    }
                    continue;
                }
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
                    session: Some(&session),
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
                    // Most answers are ready at once (an acks=1 produce has appended already):
                    // taken now, they cost no task of their own, nor the wake-up of an idle
                    // worker that spawning one brings. A future that is not ready registers
                    // its task's waker again when the spawned task polls it.
                    Reply::Later(mut f) => match futures::FutureExt::now_or_never(&mut f) {
                        Some(bytes) => Body::Now(bytes),
                        None => Body::Later(tokio::spawn(f)),
                    },
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
                if session.should_close() {
                    // A failed authentication: the answer goes out, then the connection ends.
                    return Ok(());
                }
                continue;
            }
            // Make room for the whole next frame at once when its size is known.
            let want = next.map_or(READ_CHUNK, |n| (n + 4).saturating_sub(buf.len()));
            buf.reserve(want.max(READ_CHUNK));
            // The deadline holds until the first authentication (a re-authentication later
            // is bounded by the session's expiry instead).
            if auth_deadline.is_some() && session.is_authenticated() {
                auth_deadline = None;
            }
            // A large frame under way: wake when the rest of it (or a good part) is here.
            let rest = next.map_or(0, |n| (n + 4).saturating_sub(buf.len()));
            let mark = if rest >= LOW_WATER_FROM {
                rest.min(LOW_WATER_MAX)
            } else {
                0
            };
            if mark != low_water {
                rd.expect(mark);
                low_water = mark;
            }
            let read = match auth_deadline {
                Some(at) => match tokio::time::timeout_at(at, rd.read_buf(&mut buf)).await {
                    Ok(r) => r?,
                    Err(_) => return Err(ConnectionError::AuthTimeout),
                },
                None => rd.read_buf(&mut buf).await?,
            };
            if read == 0 {
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

async fn write_responses<W: AsyncWrite + Unpin>(
    broker: Arc<Broker>,
    wr: W,
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
    wr.flush().await?;
    // TLS: send close_notify; TCP: FIN.
    wr.into_inner().shutdown().await
}
