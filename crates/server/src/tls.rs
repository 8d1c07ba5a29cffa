//! TLS for the Kafka listeners (rustls with ring, the binary's one crypto provider): the
//! server certificate is read from PEM files and reloaded when they change (checked every
//! few seconds, and on SIGHUP) without touching open connections; client certificates are
//! checked against `--ssl-ca` as `--ssl-client-auth` asks, and name the principal
//! `User:CN=<common name>`.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context as TaskContext, Poll};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use bytes::{Buf, BytesMut};
use parking_lot::{Mutex, RwLock};
use rustls::client::ResolvesClientCert;
use rustls::crypto::cipher::{
    InboundOpaqueMessage, MessageDecrypter, MessageEncrypter, OutboundChunks, OutboundPlainMessage,
};
use rustls::crypto::CryptoProvider;
use rustls::kernel::KernelConnection;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{
    ClientHello, ResolvesServerCert, ServerConnectionData, UnbufferedServerConnection,
    WebPkiClientVerifier,
};
use rustls::sign::CertifiedKey;
use rustls::unbuffered::{ConnectionState, EncodeError, EncodeTlsData, UnbufferedStatus};
use rustls::{
    ConnectionTrafficSecrets, ContentType, ProtocolVersion, RootCertStore, SupportedCipherSuite,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// How often the certificate files are checked for changes.
const RELOAD_CHECK: Duration = Duration::from_secs(5);

/// Whether an SSL listener asks clients for a certificate (`--ssl-client-auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// A certificate signed by `--ssl-ca` is required.
    Required,
    /// Asked for; a client without one connects as `User:ANONYMOUS`.
    Requested,
    /// Not asked for.
    None,
}

impl ClientAuth {
    /// Parses `required`, `requested` or `none`.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "required" => Ok(Self::Required),
            "requested" => Ok(Self::Requested),
            "none" => Ok(Self::None),
            other => bail!("--ssl-client-auth is required, requested or none, not '{other}'"),
        }
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The server certificate and key, reloaded when their files change.
#[derive(Debug)]
pub struct ServerCert {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<(Arc<CertifiedKey>, Option<SystemTime>)>,
}

fn modified(paths: &[&Path]) -> Option<SystemTime> {
    paths
        .iter()
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .max()
}

fn load_key(cert: &Path, key: &Path) -> anyhow::Result<Arc<CertifiedKey>> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading --ssl-cert {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("--ssl-cert {} is not PEM certificates", cert.display()))?;
    if chain.is_empty() {
        bail!("--ssl-cert {} holds no certificate", cert.display());
    }
    let der = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("--ssl-key {} holds no PEM private key", key.display()))?;
    let certified = CertifiedKey::from_der(chain, der, &provider()).with_context(|| {
        format!(
            "--ssl-key {} does not fit --ssl-cert {}",
            key.display(),
            cert.display()
        )
    })?;
    Ok(Arc::new(certified))
}

impl ServerCert {
    /// Loads the certificate chain and private key (PEM).
    pub fn load(cert: &Path, key: &Path) -> anyhow::Result<Arc<Self>> {
        let loaded = load_key(cert, key)?;
        Ok(Arc::new(Self {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: RwLock::new((loaded, modified(&[cert, key]))),
        }))
    }

    /// Reads the files again when they changed since the last load (`force`: whatever their
    /// time). A pair that does not load keeps the previous certificate, with an error logged.
    pub fn reload(&self, force: bool) {
        let stamp = modified(&[&self.cert, &self.key]);
        if !force && stamp == self.current.read().1 {
            return;
        }
        match load_key(&self.cert, &self.key) {
            Ok(k) => {
                *self.current.write() = (k, stamp);
                tracing::info!(cert = %self.cert.display(), "reloaded the TLS certificate");
            }
            Err(e) => {
                // Remember the stamp, so a half-written pair is retried once it changes again.
                self.current.write().1 = stamp;
                tracing::error!(error = %format!("{e:#}"), "the TLS certificate did not reload; the previous one stays");
            }
        }
    }

    /// Checks the files every few seconds and reloads on SIGHUP, until the process ends.
    pub fn watch(self: &Arc<Self>) {
        let me = self.clone();
        tokio::spawn(async move {
            #[cfg(unix)]
            let mut hup =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            loop {
                #[cfg(unix)]
                let forced = match hup.as_mut() {
                    Some(h) => tokio::select! {
                        _ = h.recv() => true,
                        _ = tokio::time::sleep(RELOAD_CHECK) => false,
                    },
                    None => {
                        tokio::time::sleep(RELOAD_CHECK).await;
                        false
                    }
                };
                #[cfg(not(unix))]
                let forced = {
                    tokio::time::sleep(RELOAD_CHECK).await;
                    false
                };
                let me = me.clone();
                let _ = tokio::task::spawn_blocking(move || me.reload(forced)).await;
            }
        });
    }
}

impl ResolvesServerCert for ServerCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().0.clone())
    }
}

/// The same certificate, presented by this node when it connects to another (inter-node
/// mutual TLS).
impl ResolvesClientCert for ServerCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The certificates of a PEM CA bundle.
fn roots(ca: &Path) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca)
        .with_context(|| format!("reading --ssl-ca {}", ca.display()))?
    {
        let c = c.with_context(|| format!("--ssl-ca {} is not PEM certificates", ca.display()))?;
        roots
            .add(c)
            .with_context(|| format!("--ssl-ca {}: a certificate is invalid", ca.display()))?;
    }
    if roots.is_empty() {
        bail!("--ssl-ca {} holds no certificate", ca.display());
    }
    Ok(roots)
}

/// Mutual TLS between nodes: the connector presents `cert` and checks the peer's
/// certificate against `ca` and the address it was reached at; the acceptor requires a
/// client certificate signed by `ca`.
pub fn inter_node(
    cert: Arc<ServerCert>,
    ca: &Path,
) -> anyhow::Result<spate_cluster::transport::Transport> {
    let client = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots(ca)?)
        .with_client_cert_resolver(cert.clone());
    let acceptor = acceptor(cert, Some(ca), ClientAuth::Required)?;
    Ok(spate_cluster::transport::Transport::tls(
        TlsConnector::from(Arc::new(client)),
        acceptor,
    ))
}

/// A client configuration trusting `ca`, for HTTPS calls between nodes.
pub fn client_trusting(ca: &Path) -> anyhow::Result<rustls::ClientConfig> {
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots(ca)?)
        .with_no_client_auth())
}

/// An acceptor with `cert`, asking for client certificates as `auth` says (trusting `ca`).
pub fn acceptor(
    cert: Arc<ServerCert>,
    ca: Option<&Path>,
    auth: ClientAuth,
) -> anyhow::Result<TlsAcceptor> {
    let verifier = match auth {
        ClientAuth::None => WebPkiClientVerifier::no_client_auth(),
        ClientAuth::Required | ClientAuth::Requested => {
            let Some(ca) = ca else {
                bail!("--ssl-client-auth {auth:?} needs --ssl-ca (the CA client certificates are checked against)");
            };
            let builder =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider());
            let builder = if auth == ClientAuth::Requested {
                builder.allow_unauthenticated()
            } else {
                builder
            };
            builder
                .build()
                .context("building the client certificate verifier")?
        }
    };
    let mut config = rustls::ServerConfig::builder_with_provider(aes128_first())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(cert);
    // The server's order decides: AES-128-GCM before AES-256-GCM (Java and OpenSSL clients
    // list 256 first). Both are TLS 1.3's standard suites; 128 takes 10 AES rounds to 256's 14,
    // for the broker and for the client.
    config.ignore_client_order = true;
    // The Kafka listeners' connections seal and open records themselves after the handshake
    // (see `accept`), with the keys rustls hands over.
    config.enable_secret_extraction = true;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// ring's cipher suites, AES-128-GCM before AES-256-GCM for each protocol version and key
/// type, ChaCha20 after them.
fn aes128_first() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::cipher_suite::*;
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites = vec![
        TLS13_AES_128_GCM_SHA256,
        TLS13_AES_256_GCM_SHA384,
        TLS13_CHACHA20_POLY1305_SHA256,
        TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(p)
}

// The Kafka listeners' TLS connections. rustls does the handshake (its unbuffered API) and
// keeps the key schedule (its kernel API, meant for kTLS: a key update asks it for the next
// secret); the records themselves are sealed and opened here, with rustls's own AEAD code for
// the negotiated suite. Each direction has its own keys and socket half, so the connection's
// reader and writer never wait for each other; the reader opens records in place in a buffer
// filled by few large reads, and the writer seals a response's records and writes them with
// one vectored write.

/// The most one TLS record carries on the wire: a 5-byte header, 2^14 bytes of plaintext and up
/// to 2048 bytes of expansion (RFC 5246 6.2.3; TLS 1.3 allows 256).
const MAX_RECORD: usize = 5 + MAX_FRAGMENT + 2048;
/// The most plaintext one record carries.
const MAX_FRAGMENT: usize = 16 << 10;
/// What the reader asks the socket for at once (and keeps allocated per connection once used),
/// unless the frame under way needs more (see [`TlsReader::want`]).
const READ_AHEAD: usize = 64 << 10;
/// Bytes a record adds to its plaintext, at most, for the AEAD suites offered (header, TLS 1.2
/// explicit nonce, tag, TLS 1.3 inner content type), rounded up.
const RECORD_OVERHEAD: usize = 40;
/// Bytes a record adds to its plaintext, at least, for the AEAD suites offered: TLS 1.2
/// ChaCha20-Poly1305's header and tag (TLS 1.3 adds an inner content type, TLS 1.2 AES-GCM an
/// explicit nonce).
const MIN_RECORD_OVERHEAD: usize = 5 + 16;
/// The most plaintext one read is sized for (the connection asks for at most 256 KiB).
const MAX_READ_AHEAD: usize = 1 << 20;
/// Sealed bytes the writer holds before it writes them out.
const WRITE_AHEAD: usize = 256 << 10;
/// The most the handshake buffers from the client (rustls takes handshake messages of up to
/// 64 KiB).
const MAX_HANDSHAKE_BUFFER: usize = (64 << 10) + MAX_RECORD;
/// A KeyUpdate message asking nothing of the peer (RFC 8446 4.6.3).
const KEY_UPDATE_NOT_REQUESTED: [u8; 5] = [24, 0, 0, 1, 0];
/// KeyUpdates accepted in a row without application data between them.
const KEY_UPDATES_IN_A_ROW: u8 = 32;
/// A close_notify alert (level warning).
const CLOSE_NOTIFY: [u8; 2] = [1, 0];

/// A TLS connection that finished its handshake: its two halves and who the client is.
pub struct Accepted {
    /// The plaintext the client sends.
    pub reader: TlsReader,
    /// Plaintext to the client.
    pub writer: TlsWriter,
    /// The first certificate the client showed, if it showed one.
    pub client_certificate: Option<CertificateDer<'static>>,
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Runs the server side of the TLS handshake on `tcp` with `config` (which must allow secret
/// extraction, as [`acceptor`]'s does), then hands the connection to its reader and writer.
pub async fn accept(config: Arc<rustls::ServerConfig>, mut tcp: TcpStream) -> io::Result<Accepted> {
    let mut conn = UnbufferedServerConnection::new(config).map_err(tls_error)?;
    let mut incoming = BytesMut::with_capacity(MAX_RECORD);
    // rustls is given whole records, one more each time it is blocked, so that it stops at the
    // client's last handshake record: what follows is the reader's.
    let mut fed = 0;
    let mut outgoing: Vec<u8> = Vec::new();
    // Application data rustls opened before the handshake was over (none is expected).
    let mut early = BytesMut::new();
    loop {
        let UnbufferedStatus { mut discard, state } =
            conn.process_tls_records(&mut incoming[..fed]);
        let state = match state {
            Ok(s) => s,
            Err(e) => {
                send_alert(&mut conn, &mut tcp).await;
                return Err(tls_error(e));
            }
        };
        let mut blocked = false;
        match state {
            ConnectionState::EncodeTlsData(mut s) => encode(&mut s, &mut outgoing)?,
            ConnectionState::TransmitTlsData(s) => {
                tcp.write_all(&outgoing).await?;
                outgoing.clear();
                s.done();
            }
            ConnectionState::BlockedHandshake | ConnectionState::WriteTraffic(_) => blocked = true,
            ConnectionState::ReadTraffic(mut r) => {
                while let Some(record) = r.next_record() {
                    let record = record.map_err(tls_error)?;
                    discard += record.discard;
                    early.extend_from_slice(record.payload);
                }
            }
            ConnectionState::PeerClosed | ConnectionState::Closed => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the client closed the connection during the TLS handshake",
                ))
            }
            _ => return Err(invalid("unexpected TLS handshake state")),
        }
        incoming.advance(discard);
        fed -= discard;
        if !blocked {
            continue;
        }
        if !conn.is_handshaking() {
            break;
        }
        // The next whole record.
        loop {
            if let Some(len) = record_len(&incoming[fed..])? {
                fed += len;
                break;
            }
            if incoming.len() >= MAX_HANDSHAKE_BUFFER {
                return Err(invalid("TLS handshake messages too large"));
            }
            incoming.reserve(MAX_RECORD);
            if tcp.read_buf(&mut incoming).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the client closed the connection during the TLS handshake",
                ));
            }
        }
    }
    let client_certificate = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.clone().into_owned());
    let (secrets, kernel) = conn.dangerous_into_kernel_connection().map_err(tls_error)?;
    let suite = kernel.negotiated_cipher_suite();
    let tls13 = kernel.protocol_version() == ProtocolVersion::TLSv1_3;
    let (rx_seq, rx) = secrets.rx;
    let (tx_seq, tx) = secrets.tx;
    let limit = match suite {
        SupportedCipherSuite::Tls12(s) => s.common.confidentiality_limit,
        SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
    };
    let keys = Arc::new(KeySchedule {
        kernel: Mutex::new(kernel),
        update_tx: AtomicBool::new(false),
    });
    let (rd, wr) = tcp.into_split();
    Ok(Accepted {
        reader: TlsReader {
            tcp: rd,
            buf: incoming,
            opened: 0,
            plain: 0..0,
            early,
            dec: decrypter(suite, rx)?,
            seq: rx_seq,
            tls13,
            keys: keys.clone(),
            key_updates_left: KEY_UPDATES_IN_A_ROW,
            closed: false,
            eof: false,
            error: None,
            want: 0,
            low_water: 0,
        },
        writer: TlsWriter {
            tcp: wr,
            enc: encrypter(suite, tx)?,
            seq: tx_seq,
            limit,
            tls13,
            keys,
            queue: VecDeque::new(),
            head: 0,
            queued: 0,
            closing: false,
        },
        client_certificate,
    })
}

/// The length of the TLS record at the front of `b` if all of it is there; an error if `b` does
/// not start with a TLS record header (a client speaking something else).
fn record_len(b: &[u8]) -> io::Result<Option<usize>> {
    let Some(header) = b.get(..5) else {
        // What is here must still be able to begin a record.
        return match b {
            [t, ..] if !(20..=23).contains(t) => Err(invalid("not a TLS record")),
            [_, v, ..] if *v != 3 => Err(invalid("not a TLS record")),
            _ => Ok(None),
        };
    };
    if !(20..=23).contains(&header[0]) || header[1] != 3 {
        return Err(invalid("not a TLS record"));
    }
    let len = u16::from_be_bytes([header[3], header[4]]) as usize;
    if len > MAX_RECORD - 5 {
        return Err(invalid("TLS record too long"));
    }
    Ok((b.len() >= 5 + len).then_some(5 + len))
}

/// Appends the handshake data `s` holds to `out`.
fn encode(s: &mut EncodeTlsData<'_, ServerConnectionData>, out: &mut Vec<u8>) -> io::Result<()> {
    let at = out.len();
    loop {
        match s.encode(&mut out[at..]) {
            Ok(n) => {
                out.truncate(at + n);
                return Ok(());
            }
            Err(EncodeError::InsufficientSize(e)) => out.resize(at + e.required_size, 0),
            Err(e) => return Err(invalid(&e.to_string())),
        }
    }
}

/// After a failed handshake: the alert rustls queued for the client, if any, best effort.
async fn send_alert(conn: &mut UnbufferedServerConnection, tcp: &mut TcpStream) {
    let mut out = Vec::new();
    if let Ok(ConnectionState::EncodeTlsData(mut s)) = conn.process_tls_records(&mut []).state {
        if encode(&mut s, &mut out).is_ok() {
            let _ = tcp.write_all(&out).await;
        }
    }
}

fn key_and_iv(
    secrets: ConnectionTrafficSecrets,
) -> io::Result<(
    rustls::crypto::cipher::AeadKey,
    rustls::crypto::cipher::Iv,
    bool,
)> {
    match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv }
        | ConnectionTrafficSecrets::Aes256Gcm { key, iv } => Ok((key, iv, false)),
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => Ok((key, iv, true)),
        _ => Err(invalid("unsupported TLS cipher")),
    }
}

fn decrypter(
    suite: SupportedCipherSuite,
    secrets: ConnectionTrafficSecrets,
) -> io::Result<Box<dyn MessageDecrypter>> {
    let (key, iv, chacha) = key_and_iv(secrets)?;
    Ok(match suite {
        SupportedCipherSuite::Tls13(s) => s.aead_alg.decrypter(key, iv),
        // TLS 1.2's AES-GCM takes the 4-byte implicit part of the nonce; the other 8 bytes
        // travel in each record.
        SupportedCipherSuite::Tls12(s) if !chacha => s.aead_alg.decrypter(key, &iv.as_ref()[..4]),
        SupportedCipherSuite::Tls12(s) => s.aead_alg.decrypter(key, iv.as_ref()),
    })
}

fn encrypter(
    suite: SupportedCipherSuite,
    secrets: ConnectionTrafficSecrets,
) -> io::Result<Box<dyn MessageEncrypter>> {
    let (key, iv, chacha) = key_and_iv(secrets)?;
    Ok(match suite {
        SupportedCipherSuite::Tls13(s) => s.aead_alg.encrypter(key, iv),
        SupportedCipherSuite::Tls12(s) if !chacha => {
            s.aead_alg
                .encrypter(key, &iv.as_ref()[..4], &iv.as_ref()[4..])
        }
        SupportedCipherSuite::Tls12(s) => s.aead_alg.encrypter(key, iv.as_ref(), &[]),
    })
}

/// What the two halves share: rustls's key schedule, and whether the writer owes the client a
/// KeyUpdate of its own.
struct KeySchedule {
    kernel: Mutex<KernelConnection<ServerConnectionData>>,
    update_tx: AtomicBool,
}

/// The reading half of a TLS connection: opens records in place and hands out their plaintext.
pub struct TlsReader {
    tcp: OwnedReadHalf,
    /// From the socket: `opened` bytes of records already opened, then records not yet opened.
    buf: BytesMut,
    opened: usize,
    /// Plaintext not handed out yet, within the opened records.
    plain: Range<usize>,
    early: BytesMut,
    dec: Box<dyn MessageDecrypter>,
    seq: u64,
    tls13: bool,
    keys: Arc<KeySchedule>,
    /// KeyUpdates the client may still send before more application data (as rustls and
    /// BoringSSL count them).
    key_updates_left: u8,
    /// The client sent close_notify.
    closed: bool,
    eof: bool,
    /// A socket error held back while plaintext was being handed out.
    error: Option<io::Error>,
    /// Plaintext bytes the frame under way still needs (from [`FrameHint::expect`]): the
    /// buffer is made big enough for their records, so they come in one read rather than one
    /// read per [`READ_AHEAD`] bytes (a system call each).
    ///
    /// [`FrameHint::expect`]: crate::connection::FrameHint::expect
    want: usize,
    /// The socket's low-water mark as last set (0: none set yet).
    low_water: usize,
}

/// The bytes on the wire of `plain` bytes of application data, at most.
fn sealed_len(plain: usize) -> usize {
    plain + (plain / MAX_FRAGMENT + 1) * RECORD_OVERHEAD
}

/// The bytes on the wire of `plain` bytes of application data, at least: however the client
/// cuts them into records, each carries at most [`MAX_FRAGMENT`] of them and adds at least
/// [`MIN_RECORD_OVERHEAD`].
fn sealed_len_at_least(plain: usize) -> usize {
    plain + plain.div_ceil(MAX_FRAGMENT) * MIN_RECORD_OVERHEAD
}

impl TlsReader {
    /// Opens the `len`-byte record at the front of the unopened bytes.
    fn open(&mut self, len: usize) -> io::Result<()> {
        let start = self.opened;
        let base = self.buf.as_ptr() as usize;
        let (header, body) = self.buf[start..start + len].split_at_mut(5);
        let typ = ContentType::from(header[0]);
        if self.tls13 && typ != ContentType::ApplicationData {
            return Err(invalid("unexpected TLS record type"));
        }
        let version = ProtocolVersion::from(u16::from_be_bytes([header[1], header[2]]));
        if self.seq == u64::MAX {
            return Err(invalid("TLS record sequence exhausted"));
        }
        let msg = self
            .dec
            .decrypt(InboundOpaqueMessage::new(typ, version, body), self.seq)
            .map_err(tls_error)?;
        self.seq += 1;
        if msg.payload.len() > MAX_FRAGMENT {
            return Err(invalid("TLS record overflow"));
        }
        let at = msg.payload.as_ptr() as usize - base;
        let range = at..at + msg.payload.len();
        let typ = msg.typ;
        // What a control record says, copied out of the buffer.
        let control: Option<[u8; 5]> = match typ {
            ContentType::ApplicationData => None,
            _ if msg.payload.len() <= 5 => {
                let mut c = [0xff; 5];
                c[..msg.payload.len()].copy_from_slice(msg.payload);
                Some(c)
            }
            _ => return Err(invalid("unexpected TLS message")),
        };
        let control_len = range.len();
        self.opened += len;
        match (typ, control) {
            (ContentType::ApplicationData, _) => {
                self.plain = range;
                self.key_updates_left = KEY_UPDATES_IN_A_ROW;
            }
            (ContentType::Alert, Some(c)) if control_len == 2 => match (c[0], c[1]) {
                (_, 0) => self.closed = true,
                // user_canceled (TLS 1.3 and 1.2), any warning (TLS 1.2): nothing to do.
                (1, 90) => {}
                (1, _) if !self.tls13 => {}
                (_, d) => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        format!("the client sent TLS alert {d}"),
                    ))
                }
            },
            // TLS 1.3 post-handshake: only a KeyUpdate comes from a client.
            (ContentType::Handshake, Some([24, 0, 0, 1, request @ (0 | 1)]))
                if self.tls13 && control_len == 5 =>
            {
                self.key_updates_left = self
                    .key_updates_left
                    .checked_sub(1)
                    .ok_or_else(|| invalid("too many TLS key updates"))?;
                let mut kernel = self.keys.kernel.lock();
                let (seq, secrets) = kernel.update_rx_secret().map_err(tls_error)?;
                self.dec = decrypter(kernel.negotiated_cipher_suite(), secrets)?;
                self.seq = seq;
                if request == 1 {
                    self.keys.update_tx.store(true, Ordering::Release);
                }
            }
            _ => return Err(invalid("unexpected TLS message")),
        }
        Ok(())
    }
}

impl crate::connection::FrameHint for TlsReader {
    fn expect(&mut self, bytes: usize) {
        // The plaintext still to come arrives in records of at least this many bytes, less the
        // unopened ones buffered here. A mark of only the plaintext would wake the reader a few
        // hundred bytes short of a large frame, for a second read (and wake-up) per frame.
        let plain_here = self.early.len() + self.plain.len();
        let unopened = self.buf.len() - self.opened;
        let mark = sealed_len_at_least(bytes.saturating_sub(plain_here)).saturating_sub(unopened);
        // Never 0 here: the socket treats 0 as 1 anyway, and 0 means "not set yet".
        let mark = mark.max(1);
        if mark != self.low_water {
            crate::connection::set_low_water(self.tcp.as_ref(), mark);
            self.low_water = mark;
        }
        self.want = bytes;
    }
}

impl AsyncRead for TlsReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if !this.early.is_empty() {
            let n = out.remaining().min(this.early.len());
            out.put_slice(&this.early[..n]);
            this.early.advance(n);
            return Poll::Ready(Ok(()));
        }
        let before = out.filled().len();
        loop {
            if !this.plain.is_empty() {
                let n = out.remaining().min(this.plain.len());
                out.put_slice(&this.buf[this.plain.start..this.plain.start + n]);
                this.plain.start += n;
                if out.remaining() == 0 {
                    return Poll::Ready(Ok(()));
                }
            }
            if this.opened > 0 {
                this.buf.advance(this.opened);
                this.opened = 0;
                this.plain = 0..0;
            }
            let gave = out.filled().len() > before;
            if this.closed {
                // After close_notify nothing more is read: the end of the stream.
                return Poll::Ready(Ok(()));
            }
            if let Some(len) = record_len(&this.buf[this.opened..])? {
                this.open(len)?;
                continue;
            }
            if let Some(e) = this.error.take() {
                return Poll::Ready(Err(e));
            }
            if this.eof {
                return Poll::Ready(if gave || this.buf.is_empty() {
                    Ok(())
                } else {
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the client closed the connection mid TLS record",
                    ))
                });
            }
            let ahead = READ_AHEAD
                .max(MAX_RECORD)
                .max(sealed_len(this.want.min(MAX_READ_AHEAD)));
            if this.buf.capacity() - this.buf.len() < MAX_RECORD || this.buf.capacity() < ahead {
                // With nothing opened left in it, this reuses the buffer from its start.
                this.buf.reserve(ahead.saturating_sub(this.buf.len()));
            }
            let read = std::pin::pin!(this.tcp.read_buf(&mut this.buf));
            match std::future::Future::poll(read, cx) {
                Poll::Pending if gave => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => this.eof = true,
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) if gave => {
                    this.error = Some(e);
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// The writing half of a TLS connection: seals plaintext into records, and writes them out
/// once [`WRITE_AHEAD`] bytes wait or on flush.
pub struct TlsWriter {
    tcp: OwnedWriteHalf,
    enc: Box<dyn MessageEncrypter>,
    seq: u64,
    /// Records one key may seal (the suite's confidentiality limit).
    limit: u64,
    tls13: bool,
    keys: Arc<KeySchedule>,
    /// Sealed records not written yet; `head` bytes of the first are written.
    queue: VecDeque<Vec<u8>>,
    head: usize,
    queued: usize,
    closing: bool,
}

impl TlsWriter {
    fn seal(&mut self, typ: ContentType, payload: &[u8]) -> io::Result<()> {
        let msg = OutboundPlainMessage {
            typ,
            version: ProtocolVersion::TLSv1_2,
            payload: OutboundChunks::Single(payload),
        };
        let record = self.enc.encrypt(msg, self.seq).map_err(tls_error)?.encode();
        self.seq += 1;
        self.queued += record.len();
        self.queue.push_back(record);
        Ok(())
    }

    /// Before sealing application data: a KeyUpdate the client asked for, or one because this
    /// key sealed nearly as many records as it may (TLS 1.2 has no key update: the connection
    /// ends there instead).
    fn update_keys_if_due(&mut self) -> io::Result<()> {
        let worn = self.seq.saturating_add(1) >= self.limit;
        if !worn && !self.keys.update_tx.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        if !self.tls13 {
            return Err(invalid("TLS 1.2 key used up"));
        }
        self.seal(ContentType::Handshake, &KEY_UPDATE_NOT_REQUESTED)?;
        let mut kernel = self.keys.kernel.lock();
        let (seq, secrets) = kernel.update_tx_secret().map_err(tls_error)?;
        self.enc = encrypter(kernel.negotiated_cipher_suite(), secrets)?;
        self.seq = seq;
        Ok(())
    }

    /// Writes out every sealed record.
    fn poll_send(&mut self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        while self.queued > 0 {
            let mut slices = [IoSlice::new(&[]); 64];
            let mut n = 0;
            for (i, record) in self.queue.iter().take(slices.len()).enumerate() {
                slices[i] = IoSlice::new(if i == 0 { &record[self.head..] } else { record });
                n = i + 1;
            }
            let mut written =
                ready!(Pin::new(&mut self.tcp).poll_write_vectored(cx, &slices[..n]))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.queued -= written;
            while written > 0 {
                let left = self.queue[0].len() - self.head;
                if written >= left {
                    written -= left;
                    self.queue.pop_front();
                    self.head = 0;
                } else {
                    self.head += written;
                    written = 0;
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TlsWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if this.closing {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if this.queued >= WRITE_AHEAD {
            ready!(this.poll_send(cx))?;
        }
        let mut taken = 0;
        while taken < buf.len() && this.queued < WRITE_AHEAD {
            this.update_keys_if_due()?;
            let n = (buf.len() - taken).min(MAX_FRAGMENT);
            this.seal(ContentType::ApplicationData, &buf[taken..taken + n])?;
            taken += n;
        }
        Poll::Ready(Ok(taken))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.closing {
            this.closing = true;
            this.seal(ContentType::Alert, &CLOSE_NOTIFY)?;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

/// The principal of a client certificate: `CN=<common name>` of its subject.
pub fn certificate_principal(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?;
    Some(format!("CN={cn}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::ring::cipher_suite as suites;
    use rustls::pki_types::ServerName;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    // A throw-away CA (P-256, valid until 2126), a server certificate for localhost and
    // 127.0.0.1, and a client certificate for CN=alice.
    const CA: &str = "\
-----BEGIN CERTIFICATE-----\n\
MIIBljCCAT2gAwIBAgIUQ+QPFugIfhVHr+KsGh27xL6KPYkwCgYIKoZIzj0EAwIw\n\
GDEWMBQGA1UEAwwNc3BhdGUgdGVzdCBDQTAgFw0yNjExMjgwMzUyNDRaGA8yMTI2\n\
MTEwNDAzNTI0NFowGDEWMBQGA1UEAwwNc3BhdGUgdGVzdCBDQTBZMBMGByqGSM49\n\
AgEGCCqGSM49AwEHA0IABOMonCl5BD4HiqDHJWD7XgeqJeGYhsfe9mXtAjGjtkG6\n\
KKXCmZO7XRDA4Sot79slp2i56sbzeAy0rQwBtm+5cjCjYzBhMB0GA1UdDgQWBBQf\n\
VE4EtLjYLH0Q+PZMw2vfCOPXrDAfBgNVHSMEGDAWgBQfVE4EtLjYLH0Q+PZMw2vf\n\
COPXrDAPBgNVHRMBAf8EBTADAQH/MA4GA1UdDwEB/wQEAwIBBjAKBggqhkjOPQQD\n\
AgNHADBEAiAU0rPsnGu53R5LIqNFcNJTVgguJd9lHHqDtOzWN/KEuwIgLFb9wp5r\n\
Q5EszyDzQbrdQg+fOVOu9+2eBCWh+mTbQrY=\n\
-----END CERTIFICATE-----\n\
";
    const SERVER_CERT: &str = "\
-----BEGIN CERTIFICATE-----\n\
MIIBvzCCAWagAwIBAgIUOfj5/IX5R5VmuR6h50Fy6gmb6Z8wCgYIKoZIzj0EAwIw\n\
GDEWMBQGA1UEAwwNc3BhdGUgdGVzdCBDQTAgFw0yNjExMjgwMzUyNDRaGA8yMTI2\n\
MTEwNDAzNTI0NFowFDESMBAGA1UEAwwJbG9jYWxob3N0MFkwEwYHKoZIzj0CAQYI\n\
KoZIzj0DAQcDQgAEWaFfvjV4piecxX2/zuWgyrMYURNA9A+zPVlVPggfml+O78Fe\n\
UzIWybaUymwmjLm0pujlqQSqWLjdsBVCrp9alqOBjzCBjDAJBgNVHRMEAjAAMA4G\n\
A1UdDwEB/wQEAwIHgDATBgNVHSUEDDAKBggrBgEFBQcDATAaBgNVHREEEzARhwR/\n\
AAABgglsb2NhbGhvc3QwHQYDVR0OBBYEFBZTKOQoZD6dk1y4dE1mIydGng36MB8G\n\
A1UdIwQYMBaAFB9UTgS0uNgsfRD49kzDa98I49esMAoGCCqGSM49BAMCA0cAMEQC\n\
IE8pLtyxI0Q6RdrsdrgJJXlNdoYe3EFsSnc4RRQ8m5FvAiAKTAVK+lwsn7B/2nVH\n\
rpvjmPtaWvXyz1ExeZypKiIfiQ==\n\
-----END CERTIFICATE-----\n\
";
    const SERVER_KEY: &str = "\
-----BEGIN PRIVATE KEY-----\n\
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgJGgX2Olg8MwIGakQ\n\
VpIneWVIRUEVC9LV167hMkHXWkOhRANCAARZoV++NXimJ5zFfb/O5aDKsxhRE0D0\n\
D7M9WVU+CB+aX47vwV5TMhbJtpTKbCaMubSm6OWpBKpYuN2wFUKun1qW\n\
-----END PRIVATE KEY-----\n\
";
    const CLIENT_CERT: &str = "\
-----BEGIN CERTIFICATE-----\n\
MIIBnjCCAUSgAwIBAgIUOfj5/IX5R5VmuR6h50Fy6gmb6aAwCgYIKoZIzj0EAwIw\n\
GDEWMBQGA1UEAwwNc3BhdGUgdGVzdCBDQTAgFw0yNjExMjgwMzUyNDRaGA8yMTI2\n\
MTEwNDAzNTI0NFowEDEOMAwGA1UEAwwFYWxpY2UwWTATBgcqhkjOPQIBBggqhkjO\n\
PQMBBwNCAASS8PAjxjzZPHxF5ZKACgbWGCaSWMHVeeAc/rgVXlM2ATu53RbYI4Bt\n\
jKt+JzNqEaH+95BprasqqC6ApNBZ/pk0o3IwcDAJBgNVHRMEAjAAMA4GA1UdDwEB\n\
/wQEAwIHgDATBgNVHSUEDDAKBggrBgEFBQcDAjAdBgNVHQ4EFgQUT4pyui9f6f6h\n\
+7s31kq9lnjll/AwHwYDVR0jBBgwFoAUH1ROBLS42Cx9EPj2TMNr3wjj16wwCgYI\n\
KoZIzj0EAwIDSAAwRQIhAIELj5wXdUEfg4X4GwGbZktsWGEQGsU1ejTASVFddkQF\n\
AiAWebi8E63RNIO8lKwj2Zi4Sb8W5ojY7elmuChi4RKi1Q==\n\
-----END CERTIFICATE-----\n\
";
    const CLIENT_KEY: &str = "\
-----BEGIN PRIVATE KEY-----\n\
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgeMBXuiLNxLGB0ATu\n\
Z1FN7R0Clwm+7MZsHRrc3pCNkrWhRANCAASS8PAjxjzZPHxF5ZKACgbWGCaSWMHV\n\
eeAc/rgVXlM2ATu53RbYI4BtjKt+JzNqEaH+95BprasqqC6ApNBZ/pk0\n\
-----END PRIVATE KEY-----\n\
";
    struct Fixture {
        _dir: tempfile::TempDir,
        ca: PathBuf,
        cert: Arc<ServerCert>,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let path = |n: &str| dir.path().join(n);
        std::fs::write(path("ca.pem"), CA).unwrap();
        std::fs::write(path("server.pem"), SERVER_CERT).unwrap();
        std::fs::write(path("server.key"), SERVER_KEY).unwrap();
        let cert = ServerCert::load(&path("server.pem"), &path("server.key")).unwrap();
        Fixture {
            ca: path("ca.pem"),
            cert,
            _dir: dir,
        }
    }

    fn client(
        f: &Fixture,
        versions: &[&'static rustls::SupportedProtocolVersion],
        suite: Option<SupportedCipherSuite>,
        with_cert: bool,
    ) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(client_config(f, versions, suite, with_cert))
    }

    fn client_config(
        f: &Fixture,
        versions: &[&'static rustls::SupportedProtocolVersion],
        suite: Option<SupportedCipherSuite>,
        with_cert: bool,
    ) -> Arc<rustls::ClientConfig> {
        let mut p = rustls::crypto::ring::default_provider();
        if let Some(s) = suite {
            p.cipher_suites = vec![s];
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(p))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots(&f.ca).unwrap());
        let config = if with_cert {
            let chain = vec![CertificateDer::from_pem_slice(CLIENT_CERT.as_bytes()).unwrap()];
            let key = PrivateKeyDer::from_pem_slice(CLIENT_KEY.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        } else {
            builder.with_no_client_auth()
        };
        Arc::new(config)
    }

    /// A server that accepts one connection with [`accept`] and echoes what it reads, flushing
    /// after each read, until the client closes; it answers the principal of the client's
    /// certificate.
    async fn echo(acceptor: TlsAcceptor) -> (u16, tokio::task::JoinHandle<io::Result<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await?;
            let mut tls = accept(acceptor.config().clone(), tcp).await?;
            let principal = tls
                .client_certificate
                .as_ref()
                .and_then(|c| certificate_principal(c))
                .unwrap_or_default();
            let mut buf = vec![0; 100_000];
            loop {
                let n = tls.reader.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                tls.writer.write_all(&buf[..n]).await?;
                tls.writer.flush().await?;
            }
            tls.writer.shutdown().await?;
            Ok(principal)
        });
        (port, server)
    }

    async fn connect(
        connector: &tokio_rustls::TlsConnector,
        port: u16,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
        connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
    }

    fn pattern(len: usize, seed: usize) -> Vec<u8> {
        (0..len).map(|i| ((i * 31 + seed) % 251) as u8).collect()
    }

    /// Writes `data` and reads it back at the same time.
    async fn round_trip(tls: &mut tokio_rustls::client::TlsStream<TcpStream>, data: &[u8]) {
        let (mut rd, mut wr) = tokio::io::split(tls);
        let mut back = vec![0; data.len()];
        let (w, r) = tokio::join!(
            async {
                wr.write_all(data).await?;
                wr.flush().await
            },
            rd.read_exact(&mut back)
        );
        w.unwrap();
        r.unwrap();
        assert!(back == data, "{} bytes came back changed", data.len());
    }

    /// Closes the client side with close_notify, then expects the server's close_notify.
    async fn close(mut tls: tokio_rustls::client::TlsStream<TcpStream>) {
        tls.shutdown().await.unwrap();
        let mut rest = Vec::new();
        // rustls reports an end without close_notify as an error.
        tls.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    #[tokio::test]
    async fn every_suite_of_both_versions_carries_data_both_ways() {
        let f = fixture();
        for (version, suite) in every_suite() {
            let acceptor = acceptor(f.cert.clone(), None, ClientAuth::None).unwrap();
            let (port, server) = echo(acceptor).await;
            let connector = client(&f, &[version], Some(suite), false);
            let mut tls = connect(&connector, port).await.unwrap();
            assert_eq!(tls.get_ref().1.negotiated_cipher_suite(), Some(suite));
            for (i, len) in [1, 100, 16_384, 16_385, 70_000, 1 << 20]
                .into_iter()
                .enumerate()
            {
                round_trip(&mut tls, &pattern(len, i)).await;
            }
            close(tls).await;
            assert_eq!(server.await.unwrap().unwrap(), "");
        }
    }

    /// The suites offered, each with the version it belongs to.
    fn every_suite() -> [(
        &'static rustls::SupportedProtocolVersion,
        SupportedCipherSuite,
    ); 6] {
        [
            (&rustls::version::TLS13, suites::TLS13_AES_128_GCM_SHA256),
            (&rustls::version::TLS13, suites::TLS13_AES_256_GCM_SHA384),
            (
                &rustls::version::TLS13,
                suites::TLS13_CHACHA20_POLY1305_SHA256,
            ),
            (
                &rustls::version::TLS12,
                suites::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            ),
            (
                &rustls::version::TLS12,
                suites::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            ),
            (
                &rustls::version::TLS12,
                suites::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            ),
        ]
    }

    #[test]
    fn a_frame_on_the_wire_is_never_shorter_than_the_low_water_mark_asks() {
        // A mark above what the client really sends would leave the frame's last bytes
        // waiting in the socket until the client sends something else.
        let f = fixture();
        let server_config = acceptor(f.cert.clone(), None, ClientAuth::None)
            .unwrap()
            .config()
            .clone();
        for (version, suite) in every_suite() {
            let mut client = rustls::ClientConnection::new(
                client_config(&f, &[version], Some(suite), false),
                ServerName::try_from("localhost").unwrap(),
            )
            .unwrap();
            client.set_buffer_limit(None);
            let mut server = rustls::ServerConnection::new(server_config.clone()).unwrap();
            while client.is_handshaking() || server.is_handshaking() {
                let mut wire = Vec::new();
                while client.wants_write() {
                    client.write_tls(&mut wire).unwrap();
                }
                let mut rd = &wire[..];
                while !rd.is_empty() {
                    server.read_tls(&mut rd).unwrap();
                    server.process_new_packets().unwrap();
                }
                wire.clear();
                while server.wants_write() {
                    server.write_tls(&mut wire).unwrap();
                }
                let mut rd = &wire[..];
                while !rd.is_empty() {
                    client.read_tls(&mut rd).unwrap();
                    client.process_new_packets().unwrap();
                }
            }
            // TLS 1.3 tickets and the like, sent after the handshake, are not the frame's.
            let mut wire = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut wire).unwrap();
            }
            for len in [1, 100, 16_384, 16_385, 70_000, 256 << 10] {
                io::Write::write_all(&mut client.writer(), &pattern(len, len)).unwrap();
                let mut wire = Vec::new();
                while client.wants_write() {
                    client.write_tls(&mut wire).unwrap();
                }
                assert!(
                    sealed_len_at_least(len) <= wire.len() && wire.len() <= sealed_len(len),
                    "{suite:?}: {len} bytes took {} on the wire, bounds {}..={}",
                    wire.len(),
                    sealed_len_at_least(len),
                    sealed_len(len)
                );
            }
        }
    }

    #[tokio::test]
    async fn aes_128_is_chosen_over_the_256_a_client_lists_first() {
        let f = fixture();
        let acceptor = acceptor(f.cert.clone(), None, ClientAuth::None).unwrap();
        let (port, server) = echo(acceptor).await;
        let connector = client(&f, &[&rustls::version::TLS13], None, false);
        let mut tls = connect(&connector, port).await.unwrap();
        assert_eq!(
            tls.get_ref().1.negotiated_cipher_suite(),
            Some(suites::TLS13_AES_128_GCM_SHA256)
        );
        round_trip(&mut tls, b"hello").await;
        close(tls).await;
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn key_updates_from_the_client_renew_the_keys_of_both_directions() {
        let f = fixture();
        let acceptor = acceptor(f.cert.clone(), None, ClientAuth::None).unwrap();
        let (port, server) = echo(acceptor).await;
        let connector = client(&f, &[&rustls::version::TLS13], None, false);
        let mut tls = connect(&connector, port).await.unwrap();
        // More than the 32 allowed in a row: application data in between resets the count.
        for i in 0..40 {
            round_trip(&mut tls, &pattern(20_000 + i, i)).await;
            // Asks the server to update its keys too: its next record must use new ones.
            tls.get_mut().1.refresh_traffic_keys().unwrap();
        }
        round_trip(&mut tls, b"after the last update").await;
        close(tls).await;
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_client_certificate_names_the_principal_and_a_missing_one_fails_the_handshake() {
        let f = fixture();
        let required = || acceptor(f.cert.clone(), Some(&f.ca), ClientAuth::Required).unwrap();
        let (port, server) = echo(required()).await;
        let mut tls = connect(&client(&f, &[&rustls::version::TLS13], None, true), port)
            .await
            .unwrap();
        round_trip(&mut tls, b"who am I").await;
        close(tls).await;
        assert_eq!(server.await.unwrap().unwrap(), "CN=alice");

        let (port, server) = echo(required()).await;
        let anonymous = client(&f, &[&rustls::version::TLS13], None, false);
        // TLS 1.3 finishes the client's side first: the refusal comes as an alert after it.
        let refused = match connect(&anonymous, port).await {
            Err(e) => e,
            Ok(mut tls) => {
                let _ = tls.write_all(b"hello").await;
                let _ = tls.flush().await;
                let mut b = [0; 16];
                tls.read(&mut b).await.unwrap_err()
            }
        };
        assert!(
            refused.to_string().contains("CertificateRequired"),
            "{refused}"
        );
        let e = server.await.unwrap().unwrap_err();
        assert!(e.to_string().contains("certificate"), "{e}");
    }

    #[tokio::test]
    async fn plaintext_on_a_tls_port_is_refused_without_waiting() {
        let f = fixture();
        let acceptor = acceptor(f.cert.clone(), None, ClientAuth::None).unwrap();
        let (port, server) = echo(acceptor).await;
        let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        // A Kafka ApiVersions request: length, api key 18, version 3, correlation id, client id.
        tcp.write_all(&[0, 0, 0, 10, 0, 18, 0, 3, 0, 0, 0, 1, 0, 0])
            .await
            .unwrap();
        let e = tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the handshake waited")
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("not a TLS record"), "{e}");
    }
}
