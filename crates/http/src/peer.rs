//! Node-to-node HTTP: one HTTP/1.1 request per connection to another node's listener (search
//! fan-out), over HTTPS when the nodes serve it, bounded in time and in the size of the
//! answer.

use std::time::Duration;

use axum::body::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header;
use hyper_util::rt::TokioIo;
use thiserror::Error;

use crate::tls::PeerTls;
use tokio::net::TcpStream;

/// Largest answer read from another node.
const MAX_ANSWER_BYTES: usize = 256 << 20;

/// A failed node-to-node call.
#[derive(Debug, Error)]
pub enum PeerError {
    /// No connection, or it broke before an answer.
    #[error("node at {addr}: {reason}")]
    Unreachable {
        /// The node's address.
        addr: String,
        /// What failed.
        reason: String,
    },
    /// No answer within the time limit.
    #[error("node at {addr} did not answer within {ms} ms")]
    Timeout {
        /// The node's address.
        addr: String,
        /// The limit.
        ms: u64,
    },
}

/// An answer: HTTP status, content type and body.
#[derive(Debug)]
pub struct PeerAnswer {
    /// HTTP status.
    pub status: u16,
    /// Content type, when the answer has one.
    pub content_type: Option<header::HeaderValue>,
    /// Every header of the answer.
    pub headers: header::HeaderMap,
    /// Body.
    pub body: Bytes,
}

/// One request to another node: method, path (with its query), headers and body.
#[derive(Debug, Clone)]
pub struct PeerRequest {
    /// Method.
    pub method: hyper::Method,
    /// Path and query.
    pub path: String,
    /// Headers sent as they are (besides Host).
    pub headers: Vec<(header::HeaderName, header::HeaderValue)>,
    /// Body.
    pub body: Bytes,
}

/// POSTs a JSON body to `path` on the node at `addr` (over `tls` when it is HTTPS),
/// waiting at most `limit` in all.
pub async fn post_json(
    tls: &PeerTls,
    addr: &str,
    path: &str,
    body: Vec<u8>,
    token: Option<&str>,
    limit: Duration,
) -> Result<PeerAnswer, PeerError> {
    let mut headers = vec![(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    )];
    if let Some(t) = token {
        let bearer = header::HeaderValue::try_from(format!("Bearer {t}")).map_err(|e| {
            PeerError::Unreachable {
                addr: addr.to_owned(),
                reason: format!("the admin token cannot be a header: {e}"),
            }
        })?;
        headers.push((header::AUTHORIZATION, bearer));
    }
    let request = PeerRequest {
        method: hyper::Method::POST,
        path: path.to_owned(),
        headers,
        body: Bytes::from(body),
    };
    call(tls, addr, request, limit).await
}

/// Sends `request` to the node at `addr` (over `tls` when it is HTTPS), waiting at most
/// `limit` in all.
pub async fn call(
    tls: &PeerTls,
    addr: &str,
    request: PeerRequest,
    limit: Duration,
) -> Result<PeerAnswer, PeerError> {
    let unreachable = |reason: String| PeerError::Unreachable {
        addr: addr.to_owned(),
        reason,
    };
    let call = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        match &tls.0 {
            None => send_on(stream, addr, request).await,
            Some(connector) => {
                let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = rustls_pki_types::ServerName::try_from(host.to_owned())
                    .map_err(|e| unreachable(format!("'{host}' cannot be checked by TLS: {e}")))?;
                let stream = connector
                    .connect(name, stream)
                    .await
                    .map_err(|e| unreachable(format!("TLS: {e}")))?;
                send_on(stream, addr, request).await
            }
        }
    };
    match tokio::time::timeout(limit, call).await {
        Ok(r) => r,
        Err(_) => Err(PeerError::Timeout {
            addr: addr.to_owned(),
            ms: limit.as_millis() as u64,
        }),
    }
}

/// One request and its answer on an open connection.
async fn send_on<S>(stream: S, addr: &str, call: PeerRequest) -> Result<PeerAnswer, PeerError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let unreachable = |reason: String| PeerError::Unreachable {
        addr: addr.to_owned(),
        reason,
    };
    {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        tokio::spawn(async move {
            // Ends when the answer has been read and the sender dropped.
            let _ = connection.await;
        });
        let mut request = hyper::Request::builder()
            .method(call.method)
            .uri(call.path)
            .header(header::HOST, addr);
        for (name, value) in call.headers {
            request = request.header(name, value);
        }
        let request = request
            .body(Full::new(call.body))
            .map_err(|e| unreachable(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let status = response.status().as_u16();
        let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
        let headers = response.headers().clone();
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| unreachable(format!("reading the answer: {e}")))?
            .to_bytes();
        Ok(PeerAnswer {
            status,
            content_type,
            headers,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_post_reaches_an_axum_listener_and_returns_its_answer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let app = axum::Router::new().route(
            "/echo",
            axum::routing::post(
                |body: Bytes| async move { (axum::http::StatusCode::CREATED, body) },
            ),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        let answer = post_json(
            &PeerTls::default(),
            &addr,
            "/echo",
            b"{\"a\":1}".to_vec(),
            None,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(answer.status, 201);
        assert_eq!(&answer.body[..], b"{\"a\":1}");
    }

    #[tokio::test]
    async fn a_node_that_is_not_listening_is_unreachable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let e = post_json(
            &PeerTls::default(),
            &addr,
            "/x",
            Vec::new(),
            None,
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, PeerError::Unreachable { .. }), "{e}");
    }

    #[tokio::test]
    async fn a_node_that_never_answers_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        // Accepts and holds the connection without answering.
        let hold = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(s);
        });
        let e = post_json(
            &PeerTls::default(),
            &addr,
            "/x",
            Vec::new(),
            None,
            Duration::from_millis(200),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, PeerError::Timeout { .. }), "{e}");
        hold.abort();
    }
}
