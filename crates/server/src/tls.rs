//! TLS for the Kafka listeners (rustls with ring, the binary's one crypto provider): the
//! server certificate is read from PEM files and reloaded when they change (checked every
//! few seconds, and on SIGHUP) without touching open connections; client certificates are
//! checked against `--ssl-ca` as `--ssl-client-auth` asks, and name the principal
//! `User:CN=<common name>`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use parking_lot::RwLock;
use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;
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
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(cert);
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The principal of a client certificate: `CN=<common name>` of its subject.
pub fn certificate_principal(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?;
    Some(format!("CN={cn}"))
}
