//! A small client of spate's admin HTTP API (plain HTTP/1.1, one request per connection, or
//! HTTPS trusting the cluster's CA): the cluster view, adding and decommissioning nodes,
//! balancing, and topics.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::plan::{ActualTopic, NodeHealth, SpateView};

/// Longest one admin call may take (topic changes wait for the quorum, up to 30 s).
const CALL_TIMEOUT: Duration = Duration::from_secs(40);
/// Largest response body read (a large cluster view lists every partition).
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// A failed admin call.
#[derive(Debug, thiserror::Error)]
pub enum SpateError {
    /// Connecting, writing or reading failed.
    #[error("spate admin API at {addr}: {source}")]
    Io {
        /// The address called.
        addr: String,
        /// What failed.
        source: std::io::Error,
    },
    /// No answer in time.
    #[error("spate admin API at {0}: no answer within the time limit")]
    Timeout(String),
    /// The answer is not HTTP, or not the JSON expected.
    #[error("spate admin API at {addr}: malformed answer: {what}")]
    Malformed {
        /// The address called.
        addr: String,
        /// What was wrong.
        what: String,
    },
    /// The HTTPS client could not be set up, or the TLS exchange failed.
    #[error("spate admin API at {addr} over HTTPS: {what}")]
    Https {
        /// The address called.
        addr: String,
        /// What failed.
        what: String,
    },
    /// spate answered with an error status.
    #[error("spate refused {path} ({status}): {message}")]
    Status {
        /// The path called.
        path: String,
        /// HTTP status.
        status: u16,
        /// spate's error message.
        message: String,
    },
}

impl SpateError {
    /// HTTP status of a refusal, if it was one.
    pub fn status(&self) -> Option<u16> {
        match self {
            SpateError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// The admin API of one spate cluster.
#[derive(Clone)]
pub struct SpateClient {
    addr: String,
    token: Option<String>,
    transport: Transport,
}

/// How requests reach spate.
#[derive(Clone)]
enum Transport {
    /// One plain TCP connection per request.
    Plain,
    /// HTTPS through a kube HTTP client: it already carries rustls with ring, and a second
    /// TLS setup in this crate would mean a second copy of the TLS stack to keep in step.
    Https {
        /// The client, bound to the address.
        client: kube::Client,
        /// The PEM certificates trusted and the name checked, to reach another node alike.
        ca_pem: Vec<u8>,
        /// The name the certificate must carry.
        server_name: String,
    },
    /// HTTPS was wanted but could not be set up (no CA yet, say): every call says why, so
    /// the reconcile goes on and the status reports it.
    Unusable(String),
}

impl std::fmt::Debug for SpateClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token stays out of logs.
        let transport = match &self.transport {
            Transport::Plain => "http",
            Transport::Https { .. } => "https",
            Transport::Unusable(_) => "https (unusable)",
        };
        f.debug_struct("SpateClient")
            .field("addr", &self.addr)
            .field("transport", &transport)
            .finish_non_exhaustive()
    }
}

impl SpateClient {
    /// A client of the admin API at `addr` (host:port), presenting `token` on mutations.
    pub fn new(addr: impl Into<String>, token: Option<String>) -> Self {
        Self {
            addr: addr.into(),
            token,
            transport: Transport::Plain,
        }
    }

    /// An HTTPS client of the admin API at `addr` trusting only the PEM certificates in
    /// `ca_pem` and checking that the server's certificate names `server_name`.
    pub fn https(
        addr: impl Into<String>,
        token: Option<String>,
        ca_pem: &[u8],
        server_name: &str,
    ) -> Result<Self, SpateError> {
        let addr = addr.into();
        let fail = |what: String| SpateError::Https {
            addr: addr.clone(),
            what,
        };
        let roots = pem_certificates(ca_pem).map_err(|e| fail(e.to_string()))?;
        let url: axum::http::Uri = format!("https://{addr}")
            .parse()
            .map_err(|e| fail(format!("not an address: {e}")))?;
        let mut config = kube::Config::new(url);
        config.root_cert = Some(roots);
        config.tls_server_name = Some(server_name.to_owned());
        config.connect_timeout = Some(Duration::from_secs(10));
        // Retrying on 503 could send a mutation twice; the reconcile loop retries instead.
        config.default_retry = false;
        let client = kube::Client::try_from(config).map_err(|e| fail(error_chain(&e)))?;
        Ok(Self {
            addr,
            token,
            transport: Transport::Https {
                client,
                ca_pem: ca_pem.to_vec(),
                server_name: server_name.to_owned(),
            },
        })
    }

    /// A client of the same kind (token, plain or HTTPS with the same trust) for another
    /// address: one node's own HTTP listener rather than the cluster's Service.
    pub fn at(&self, addr: impl Into<String>) -> Self {
        let addr = addr.into();
        match &self.transport {
            Transport::Https {
                ca_pem,
                server_name,
                ..
            } => match Self::https(addr.clone(), self.token.clone(), ca_pem, server_name) {
                Ok(c) => c,
                Err(e) => Self::unusable(addr, e.to_string()),
            },
            transport => Self {
                addr,
                token: self.token.clone(),
                transport: transport.clone(),
            },
        }
    }

    /// A client whose every call fails with `why` (HTTPS wanted, CA not available).
    pub fn unusable(addr: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            addr: addr.into(),
            token: None,
            transport: Transport::Unusable(why.into()),
        }
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), SpateError> {
        tokio::time::timeout(CALL_TIMEOUT, self.call_inner(method, path, body))
            .await
            .map_err(|_| SpateError::Timeout(self.addr.clone()))?
    }

    async fn call_inner(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), SpateError> {
        let (status, body) = match &self.transport {
            Transport::Plain => self.exchange_plain(method, path, body).await?,
            Transport::Https { client, .. } => {
                self.exchange_https(client, method, path, body).await?
            }
            Transport::Unusable(why) => {
                return Err(SpateError::Https {
                    addr: self.addr.clone(),
                    what: why.clone(),
                })
            }
        };
        let value = if body.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            serde_json::from_slice(&body).map_err(|e| SpateError::Malformed {
                addr: self.addr.clone(),
                what: format!("not JSON: {e}"),
            })?
        };
        if status >= 400 {
            let message = value
                .get("message")
                .or_else(|| value.get("error"))
                .map(|m| {
                    m.as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| m.to_string())
                })
                .unwrap_or_else(|| value.to_string());
            return Err(SpateError::Status {
                path: path.to_owned(),
                status,
                message,
            });
        }
        Ok((status, value))
    }

    /// One request over HTTPS: the status and the body.
    async fn exchange_https(
        &self,
        client: &kube::Client,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Vec<u8>), SpateError> {
        use axum::http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
        let fail = |what: String| SpateError::Https {
            addr: self.addr.clone(),
            what,
        };
        let mut req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header(ACCEPT, "application/json");
        if let Some(t) = &self.token {
            req = req.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        if body.is_some() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        let payload = body.map(|b| b.to_string()).unwrap_or_default();
        let req = req
            .body(kube::client::Body::from(payload.into_bytes()))
            .map_err(|e| fail(format!("building the request: {e}")))?;
        let res = client.send(req).await.map_err(|e| fail(error_chain(&e)))?;
        let status = res.status().as_u16();
        let too_large = res
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok())
            .is_some_and(|n| n > MAX_RESPONSE_BYTES);
        if too_large {
            return Err(SpateError::Malformed {
                addr: self.addr.clone(),
                what: format!("answer larger than {MAX_RESPONSE_BYTES} bytes"),
            });
        }
        let bytes = res
            .into_body()
            .collect_bytes()
            .await
            .map_err(|e| fail(error_chain(&e)))?;
        Ok((status, bytes.to_vec()))
    }

    /// One request over a plain TCP connection: the status and the (de-chunked) body.
    async fn exchange_plain(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Vec<u8>), SpateError> {
        let io = |source| SpateError::Io {
            addr: self.addr.clone(),
            source,
        };
        let malformed = |what: &str| SpateError::Malformed {
            addr: self.addr.clone(),
            what: what.to_owned(),
        };
        let mut s = TcpStream::connect(&self.addr).await.map_err(io)?;
        let payload = body.map(|b| b.to_string()).unwrap_or_default();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAccept: application/json\r\n",
            self.addr
        );
        if let Some(t) = &self.token {
            req.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        if body.is_some() {
            req.push_str("Content-Type: application/json\r\n");
        }
        req.push_str(&format!("Content-Length: {}\r\n\r\n", payload.len()));
        req.push_str(&payload);
        s.write_all(req.as_bytes()).await.map_err(io)?;
        let mut raw = Vec::new();
        (&mut s)
            .take(MAX_RESPONSE_BYTES as u64)
            .read_to_end(&mut raw)
            .await
            .map_err(io)?;
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| malformed("no end of headers"))?;
        let head =
            std::str::from_utf8(&raw[..split]).map_err(|_| malformed("headers not UTF-8"))?;
        let mut body = raw[split + 4..].to_vec();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| malformed("no status code"))?;
        if head.lines().any(|l| {
            l.to_ascii_lowercase().starts_with("transfer-encoding:")
                && l.to_ascii_lowercase().contains("chunked")
        }) {
            body = dechunk(&body).ok_or_else(|| malformed("bad chunked body"))?;
        }
        Ok((status, body))
    }

    /// `GET /admin/cluster`.
    pub async fn cluster(&self) -> Result<SpateView, SpateError> {
        let (_, v) = self.call("GET", "/admin/cluster", None).await?;
        SpateView::parse(&v).ok_or_else(|| SpateError::Malformed {
            addr: self.addr.clone(),
            what: "not a cluster view (standalone broker?)".into(),
        })
    }

    /// `GET /health` of the node this client talks to.
    pub async fn health(&self) -> Result<NodeHealth, SpateError> {
        let (_, v) = self.call("GET", "/health", None).await?;
        NodeHealth::parse(&v).ok_or_else(|| SpateError::Malformed {
            addr: self.addr.clone(),
            what: "not a /health answer".into(),
        })
    }

    /// Adds node `id` at inter-node address `addr` to the quorum.
    pub async fn add_node(&self, id: u64, addr: &str) -> Result<(), SpateError> {
        self.call(
            "POST",
            "/admin/cluster/nodes",
            Some(&json!({"node_id": id, "addr": addr})),
        )
        .await
        .map(drop)
    }

    /// Starts decommissioning node `id`.
    pub async fn decommission(&self, id: u64) -> Result<(), SpateError> {
        self.call(
            "POST",
            &format!("/admin/cluster/nodes/{id}/decommission"),
            None,
        )
        .await
        .map(drop)
    }

    /// Spreads replicas and preferred leaders over every node.
    pub async fn balance(&self) -> Result<(), SpateError> {
        self.call("POST", "/admin/cluster/balance", None)
            .await
            .map(drop)
    }

    /// A topic, or None when spate has no such topic.
    pub async fn topic(&self, name: &str) -> Result<Option<ActualTopic>, SpateError> {
        match self
            .call("GET", &format!("/admin/topics/{name}"), None)
            .await
        {
            Ok((_, v)) => ActualTopic::parse(&v)
                .map(Some)
                .ok_or_else(|| SpateError::Malformed {
                    addr: self.addr.clone(),
                    what: "not a topic".into(),
                }),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates a topic.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i32,
        configs: &BTreeMap<String, String>,
    ) -> Result<(), SpateError> {
        self.call(
            "POST",
            "/admin/topics",
            Some(&json!({"name": name, "partitions": partitions,
                "replication_factor": replication_factor, "configs": configs})),
        )
        .await
        .map(drop)
    }

    /// Grows a topic to `count` partitions.
    pub async fn add_partitions(&self, name: &str, count: i32) -> Result<(), SpateError> {
        self.call(
            "POST",
            &format!("/admin/topics/{name}/partitions"),
            Some(&json!({ "count": count })),
        )
        .await
        .map(drop)
    }

    /// Sets (Some) or resets (None) topic configs.
    pub async fn alter_configs(
        &self,
        name: &str,
        changes: &BTreeMap<String, Option<String>>,
    ) -> Result<(), SpateError> {
        self.call(
            "PATCH",
            &format!("/admin/topics/{name}/configs"),
            Some(&json!(changes)),
        )
        .await
        .map(drop)
    }

    /// Deletes a topic (absent is fine).
    pub async fn delete_topic(&self, name: &str) -> Result<(), SpateError> {
        match self
            .call("DELETE", &format!("/admin/topics/{name}"), None)
            .await
        {
            Err(e) if e.status() == Some(404) => Ok(()),
            r => r.map(drop),
        }
    }
}

/// A CA bundle that is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PemError {
    /// No `CERTIFICATE` block.
    #[error("the CA bundle holds no PEM certificate")]
    NoCertificate,
    /// A block without its END line.
    #[error("the CA bundle has a certificate without its END line")]
    Unterminated,
    /// A block whose body is not base64.
    #[error("the CA bundle has a certificate that is not base64: {0}")]
    NotBase64(String),
}

/// The DER certificates of a PEM bundle (other blocks, such as keys, are skipped).
pub fn pem_certificates(pem: &[u8]) -> Result<Vec<Vec<u8>>, PemError> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let text = String::from_utf8_lossy(pem);
    let mut out = Vec::new();
    let mut rest = text.as_ref();
    while let Some(start) = rest.find(BEGIN) {
        let after = &rest[start + BEGIN.len()..];
        let end = after.find(END).ok_or(PemError::Unterminated)?;
        let b64: String = after[..end]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        // k8s-openapi's ByteString is base64 in JSON: its decoder, rather than another crate.
        let der: k8s_openapi::ByteString = serde_json::from_value(Value::String(b64))
            .map_err(|e| PemError::NotBase64(e.to_string()))?;
        out.push(der.0);
        rest = &after[end + END.len()..];
    }
    if out.is_empty() {
        return Err(PemError::NoCertificate);
    }
    Ok(out)
}

/// An error and its causes on one line (a TLS failure is a few causes deep in kube's errors).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// Decodes a chunked transfer-encoded body.
fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&b[..eol]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        b = &b[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};

    /// A scratch directory removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "spate-operator-{tag}-{}-{:?}",
                std::process::id(),
                std::time::SystemTime::now()
            ));
            std::fs::create_dir_all(&dir).expect("scratch dir");
            Self(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Kills the server on drop, so a failed assertion leaves no process behind.
    struct Server(Child);

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn openssl(dir: &Path, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn have_openssl() -> bool {
        Command::new("openssl")
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// A CA `{name}.crt`/`{name}.key` in `dir`.
    fn make_ca(dir: &Path, name: &str) {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "1",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign",
            ],
        );
    }

    /// An HTTPS server (openssl's test server) whose certificate `ca` signed for
    /// `demo.ns.svc`, answering `GET /admin/echo` with a JSON body.
    fn https_server(dir: &Path, ca: &str) -> (Server, String) {
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-subj",
                "/CN=demo.ns.svc",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
            ],
        );
        std::fs::write(
            dir.join("ext.cnf"),
            "subjectAltName=DNS:demo.ns.svc\nextendedKeyUsage=serverAuth\n",
        )
        .expect("ext");
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                &format!("{ca}.crt"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-days",
                "1",
                "-extfile",
                "ext.cnf",
                "-out",
                "server.crt",
            ],
        );
        // `-HTTP` serves files from the working directory, each a whole HTTP response.
        let body = r#"{"ok":true}"#;
        std::fs::create_dir_all(dir.join("admin")).expect("admin dir");
        std::fs::write(
            dir.join("admin/echo"),
            format!(
                "HTTP/1.0 200 ok\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            ),
        )
        .expect("page");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let child = Command::new("openssl")
            .args([
                "s_server",
                "-quiet",
                "-HTTP",
                "-accept",
                &format!("127.0.0.1:{port}"),
                "-cert",
                "server.crt",
                "-key",
                "server.key",
            ])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("s_server");
        let server = Server(child);
        let addr = format!("127.0.0.1:{port}");
        for _ in 0..100 {
            if std::net::TcpStream::connect(&addr).is_ok() {
                return (server, addr);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("openssl s_server did not listen on {addr}");
    }

    #[tokio::test]
    async fn https_calls_trust_the_ca_they_are_given_and_check_the_service_name() {
        if !have_openssl() {
            eprintln!("skipped: no openssl binary to run a test HTTPS server");
            return;
        }
        let dir = Scratch::new("https-ok");
        make_ca(&dir.0, "ca");
        let (_server, addr) = https_server(&dir.0, "ca");
        let ca = std::fs::read(dir.0.join("ca.crt")).expect("ca");
        // The address is an IP: the certificate is checked against the Service name given.
        let client =
            SpateClient::https(&addr, Some("t".into()), &ca, "demo.ns.svc").expect("client");
        let (status, v) = client.call("GET", "/admin/echo", None).await.expect("call");
        assert_eq!(status, 200);
        assert_eq!(v, json!({"ok": true}));
    }

    #[tokio::test]
    async fn https_calls_refuse_a_server_another_ca_signed() {
        if !have_openssl() {
            eprintln!("skipped: no openssl binary to run a test HTTPS server");
            return;
        }
        let dir = Scratch::new("https-bad");
        make_ca(&dir.0, "ca");
        make_ca(&dir.0, "other");
        let (_server, addr) = https_server(&dir.0, "ca");
        let other = std::fs::read(dir.0.join("other.crt")).expect("ca");
        let client = SpateClient::https(&addr, None, &other, "demo.ns.svc").expect("client");
        let err = client
            .call("GET", "/admin/echo", None)
            .await
            .expect_err("an unknown issuer must be refused");
        assert!(matches!(err, SpateError::Https { .. }), "{err}");
        // A right CA but a name the certificate does not carry is refused too.
        let ca = std::fs::read(dir.0.join("ca.crt")).expect("ca");
        let client = SpateClient::https(&addr, None, &ca, "other.ns.svc").expect("client");
        let err = client
            .call("GET", "/admin/echo", None)
            .await
            .expect_err("a wrong name must be refused");
        assert!(matches!(err, SpateError::Https { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_client_moved_to_a_node_reads_its_health_there() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listen");
        let node = listener.local_addr().expect("addr").to_string();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = vec![0u8; 4096];
            let n = s.read(&mut buf).await.expect("read");
            let asked = String::from_utf8_lossy(&buf[..n]).to_string();
            let body =
                r#"{"status":"disk_full","disk":{"full":true,"reason":"below the watermark"}}"#;
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            s.write_all(answer.as_bytes()).await.expect("write");
            asked
        });
        // The cluster's client points at the Service; the moved one at the node.
        let admin = SpateClient::new("demo.ns.svc:9644", Some("t".into()));
        let h = admin.at(&node).health().await.expect("health");
        assert!(h.disk_full);
        assert_eq!(h.reason.as_deref(), Some("below the watermark"));
        let asked = server.await.expect("server");
        assert!(asked.starts_with("GET /health HTTP/1.1"), "{asked}");
    }

    #[tokio::test]
    async fn an_unusable_https_client_says_why_on_every_call() {
        let c = SpateClient::unusable("demo.ns.svc:9644", "Secret demo-tls has no ca.crt");
        let err = c.cluster().await.expect_err("unusable");
        assert!(
            err.to_string().contains("Secret demo-tls has no ca.crt"),
            "{err}"
        );
    }

    #[test]
    fn pem_certificates_decodes_every_certificate_block_and_refuses_none() {
        // "hello" and "world" in base64, in certificate blocks around a key block.
        let pem = b"-----BEGIN CERTIFICATE-----\naGVs\nbG8=\n-----END CERTIFICATE-----\n\
            -----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n\
            -----BEGIN CERTIFICATE-----\nd29ybGQ=\n-----END CERTIFICATE-----\n";
        assert_eq!(
            pem_certificates(pem),
            Ok(vec![b"hello".to_vec(), b"world".to_vec()])
        );
        assert_eq!(pem_certificates(b"no pem"), Err(PemError::NoCertificate));
        assert_eq!(
            pem_certificates(b"-----BEGIN CERTIFICATE-----\naGVs"),
            Err(PemError::Unterminated)
        );
        assert!(matches!(
            pem_certificates(b"-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----"),
            Err(PemError::NotBase64(_))
        ));
    }

    #[test]
    fn dechunk_joins_chunks_and_stops_at_the_last() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"),
            Some(b"abcde".to_vec())
        );
        assert_eq!(dechunk(b"5\r\nab"), None);
    }
}
