//! Starting spate processes and talking to them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureProducer;
use rdkafka::TopicPartitionList;

/// A running spate broker, killed when dropped.
pub struct Spate {
    child: Option<Child>,
    /// host:port it listens on.
    pub addr: String,
    /// host:port of its HTTP listener.
    pub http: String,
    /// host:port of its separate HTTP ingest listener (`--ingest-listen`), if any.
    pub ingest: Option<String>,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    env: Vec<(String, String)>,
}

impl Spate {
    /// Starts a broker with a fresh data dir and these extra flags.
    pub fn start(extra: &[&str]) -> Self {
        Self::start_with_env(extra, &[])
    }

    /// Starts a broker with these extra flags and environment variables.
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (child, addr, http, ingest) = spawn(dir.path(), &extra, &env);
        Self {
            child: Some(child),
            addr,
            http,
            ingest,
            dir,
            extra,
            env,
        }
    }

    /// The broker's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// SIGKILL, no chance to flush anything.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then waits for the broker to shut down cleanly.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let _ = c.wait();
        }
    }

    /// Starts the broker again on the same data dir (on a new port), after a kill -9 unless
    /// it was already stopped.
    pub fn restart(&mut self) {
        self.kill9();
        let (child, addr, http, ingest) = spawn(self.dir.path(), &self.extra, &self.env);
        self.child = Some(child);
        self.addr = addr;
        self.http = http;
        self.ingest = ingest;
    }

    /// The broker's log output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("spate.log")).unwrap_or_default()
    }

    /// Waits (up to 10 s) for a log line containing `needle`: the broker logs a closed
    /// connection just after closing it, so the client can see the close first.
    pub fn wait_for_log(&self, needle: &str) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if self.log().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Spate {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!("---- spate log ----\n{}", self.log());
        }
    }
}

/// `n` distinct ports that are free now, taken below the kernel's ephemeral range: a port
/// released by a probe and bound a moment later by a broker could otherwise be taken in
/// between by any test's outgoing connection or `:0` listener.
pub fn free_ports(n: usize) -> Vec<u16> {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.max(10_001));
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ u64::from(std::process::id()) << 32;
    let mut ports = Vec::with_capacity(n);
    for _ in 0..100_000 {
        if ports.len() == n {
            break;
        }
        // xorshift: no rand dependency for a port pick.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let port = low + (seed % u64::from(high - low)) as u16;
        if handed_out.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.insert(port);
            ports.push(port);
        }
    }
    assert_eq!(ports.len(), n, "no {n} free ports below {high}");
    ports
}

fn spawn(
    dir: &Path,
    extra: &[String],
    env: &[(String, String)],
) -> (Child, String, String, Option<String>) {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("spate.log"))
        .expect("log file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir.join("data"))
        .args(extra)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("spawn spate");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("spate did not print its address within 60 s");
    let addr = line
        .strip_prefix("spate listening on ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| {
            let log = std::fs::read_to_string(dir.join("spate.log")).unwrap_or_default();
            panic!("spate exited or printed {line:?} instead of its address; its log:\n{log}")
        })
        .to_string();
    let http = line
        .split("http on ")
        .nth(1)
        .and_then(|rest| rest.split([',', ' ']).next())
        .unwrap_or_else(|| panic!("no http address in {line:?}"))
        .to_string();
    let ingest = line
        .split("ingest on ")
        .nth(1)
        .and_then(|rest| rest.split([',', ' ']).next())
        .map(|s| s.trim().to_string());
    (child, addr, http, ingest)
}

/// A plain HTTP/1.1 request to `addr`; returns status and body.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    try_http(addr, method, path, headers, body, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("http {method} {path} on {addr}: {e}"))
}

/// [`http`] that reports I/O errors instead of panicking, for nodes that may be unreachable;
/// `timeout` bounds the connect and each read.
pub fn try_http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    try_http_full(addr, method, path, headers, body, timeout)
        .map(|(status, _, body)| (status, body))
}

/// [`try_http`] that also returns the response's header lines.
pub fn try_http_full(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
    timeout: Duration,
) -> std::io::Result<(u16, String, String)> {
    let sock: std::net::SocketAddr = addr
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut s = TcpStream::connect_timeout(&sock, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes())?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    Ok((status, head.to_string(), body.to_string()))
}

/// A librdkafka config pointed at `addr`, quiet and quick to give up.
pub fn client_config(addr: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", addr)
        .set("log_level", "3")
        .set("socket.timeout.ms", "10000")
        .set("message.timeout.ms", "20000");
    c
}

/// An idempotent, acks=all producer with the given extra settings.
pub fn producer(addr: &str, extra: &[(&str, &str)]) -> FutureProducer {
    let mut c = client_config(addr);
    c.set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    c.create().expect("producer")
}

/// A consumer with no group, assigned to `partitions` of `topic` from `offset`.
pub fn consumer(addr: &str, topic: &str, partitions: &[i32], offset: i64) -> BaseConsumer {
    let c: BaseConsumer = client_config(addr)
        .set("group.id", "e2e-unused")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "100")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for &p in partitions {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Offset(offset))
            .expect("assign");
    }
    c.assign(&tpl).expect("assign");
    c
}

/// An admin client.
pub fn admin(addr: &str) -> AdminClient<DefaultClientContext> {
    client_config(addr).create().expect("admin")
}

/// A raw Kafka protocol connection for requests no real client would send.
pub struct Raw {
    stream: TcpStream,
    next_id: i32,
}

impl Raw {
    /// Connects with a 20 s read timeout.
    pub fn connect(addr: &str) -> Self {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        Self { stream, next_id: 1 }
    }

    /// Sends bytes as they are.
    pub fn send_bytes(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    /// Frames and sends a request; returns its correlation id.
    pub fn send<T: Encodable>(&mut self, key: ApiKey, version: i16, body: &T) -> i32 {
        let id = self.next_id;
        self.next_id += 1;
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(id)
            .with_client_id(Some(StrBytes::from_static_str("e2e-raw")));
        let buf = spate_protocol::codec::encode_request(&header, body).expect("encode request");
        let mut framed = BytesMut::new();
        framed.put_i32(buf.len() as i32);
        framed.extend_from_slice(&buf);
        self.send_bytes(&framed);
        id
    }

    /// Reads one response frame; `None` when the broker closed the connection.
    pub fn recv_frame(&mut self) -> Option<Bytes> {
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).ok()?;
        let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
        self.stream.read_exact(&mut body).ok()?;
        Some(Bytes::from(body))
    }

    /// Reads and decodes one response.
    pub fn recv<T: Decodable>(&mut self, key: ApiKey, version: i16) -> (i32, T) {
        let mut frame = self.recv_frame().expect("response");
        let header = ResponseHeader::decode(&mut frame, key.response_header_version(version))
            .expect("response header");
        let body = T::decode(&mut frame, version).expect("response body");
        (header.correlation_id, body)
    }

    /// Sends a request and decodes its response.
    pub fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &Req,
    ) -> Resp {
        let id = self.send(key, version, req);
        let (got, resp) = self.recv(key, version);
        assert_eq!(got, id, "correlation id");
        resp
    }

    /// True when the broker has closed this connection.
    pub fn is_closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.stream.read(&mut b), Ok(0) | Err(_))
    }
}

/// Sets (or with an empty value deletes) a dynamic config with IncrementalAlterConfigs.
pub fn alter_config(
    raw: &mut Raw,
    resource_type: i8,
    name: &str,
    key: &str,
    value: &str,
) -> (i16, String) {
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    use kafka_protocol::messages::{
        IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
    };
    let mut cfg = AlterableConfig::default();
    cfg.name = StrBytes::from_string(key.to_owned());
    if value.is_empty() {
        cfg.config_operation = 1;
    } else {
        cfg.value = Some(StrBytes::from_string(value.to_owned()));
    }
    let mut res = AlterConfigsResource::default();
    res.resource_type = resource_type;
    res.resource_name = StrBytes::from_string(name.to_owned());
    res.configs = vec![cfg];
    let mut req = IncrementalAlterConfigsRequest::default();
    req.resources = vec![res];
    let resp: IncrementalAlterConfigsResponse = raw.call(ApiKey::IncrementalAlterConfigs, 1, &req);
    let r = &resp.responses[0];
    (
        r.error_code,
        r.error_message
            .as_ref()
            .map(|m| m.to_string())
            .unwrap_or_default(),
    )
}

/// Reads an i16 error code right after a correlation id (the bare error answer).
pub fn bare_error(frame: &mut Bytes) -> (i32, i16) {
    (frame.get_i32(), frame.get_i16())
}
