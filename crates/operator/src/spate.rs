//! A small client of spate's admin HTTP API (plain HTTP/1.1, one request per connection):
//! the cluster view, adding and decommissioning nodes, balancing, and topics.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::plan::{ActualTopic, SpateView};

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
#[derive(Debug, Clone)]
pub struct SpateClient {
    addr: String,
    token: Option<String>,
}

impl SpateClient {
    /// A client of the admin API at `addr` (host:port), presenting `token` on mutations.
    pub fn new(addr: impl Into<String>, token: Option<String>) -> Self {
        Self {
            addr: addr.into(),
            token,
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
        let value = if body.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            serde_json::from_slice(&body).map_err(|e| malformed(&format!("not JSON: {e}")))?
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

    /// `GET /admin/cluster`.
    pub async fn cluster(&self) -> Result<SpateView, SpateError> {
        let (_, v) = self.call("GET", "/admin/cluster", None).await?;
        SpateView::parse(&v).ok_or_else(|| SpateError::Malformed {
            addr: self.addr.clone(),
            what: "not a cluster view (standalone broker?)".into(),
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

    #[test]
    fn dechunk_joins_chunks_and_stops_at_the_last() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"),
            Some(b"abcde".to_vec())
        );
        assert_eq!(dechunk(b"5\r\nab"), None);
    }
}
