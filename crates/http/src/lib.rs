//! The HTTP listener: `/metrics` (OpenMetrics text), `/health`, `/ready`, and a JSON admin API
//! under `/admin`, and Elasticsearch-compatible `/{topics}/_search` and `_count` over
//! searchable topics, and HTTP ingest (`/topics/{topic}`, `/produce/...`, see [`ingest`]). Admin
//! mutations need `Authorization: Bearer <token>` when a token is
//! configured.

mod admin;
mod cluster_admin;
pub mod ingest;
mod metrics;
pub mod peer;
mod search;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use spate_broker::Broker;

/// What the HTTP side serves from; the broker arrives once recovery has finished.
pub struct HttpState {
    broker: OnceLock<Arc<Broker>>,
    ready: AtomicBool,
    token: Option<String>,
    effective_config: serde_json::Value,
    search: OnceLock<Arc<spate_search::SearchService>>,
    ingest: Arc<ingest::Ingest>,
}

impl HttpState {
    /// State for a broker still starting up.
    pub fn new(token: Option<String>, effective_config: serde_json::Value) -> Arc<Self> {
        Self::with_ingest(token, effective_config, ingest::IngestConfig::default())
    }

    /// State for a broker still starting up, with these HTTP ingest limits.
    pub fn with_ingest(
        token: Option<String>,
        effective_config: serde_json::Value,
        ingest: ingest::IngestConfig,
    ) -> Arc<Self> {
        Arc::new(Self {
            broker: OnceLock::new(),
            ready: AtomicBool::new(false),
            token,
            effective_config,
            search: OnceLock::new(),
            ingest: ingest::Ingest::new(ingest),
        })
    }

    /// HTTP ingest (for draining its queue at shutdown).
    pub fn ingest(&self) -> &Arc<ingest::Ingest> {
        &self.ingest
    }

    /// Hands over the search service; `/_search` answers from then on.
    pub fn set_search(&self, search: Arc<spate_search::SearchService>) {
        let _ = self.search.set(search);
    }

    /// The admin token, which node-to-node calls present too.
    fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    fn search(&self) -> Option<Arc<spate_search::SearchService>> {
        self.search.get().cloned()
    }

    /// Hands over the recovered broker; `/ready` turns true.
    pub fn set_ready(&self, broker: Arc<Broker>) {
        self.ingest.start(broker.clone());
        let _ = self.broker.set(broker);
        self.ready.store(true, Ordering::SeqCst);
    }

    fn broker(&self) -> Result<&Arc<Broker>, ApiError> {
        self.broker.get().ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "NOT_READY",
                "the broker is still recovering its logs",
            )
        })
    }
}

/// An error answered as `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: String,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status,
            code: code.into(),
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"error": {"code": self.code, "message": self.message}})),
        )
            .into_response()
    }
}

/// The routes, for serving or for tests.
pub fn router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics_text))
        .merge(admin::routes())
        .merge(cluster_admin::routes())
        .merge(search::routes())
        .merge(ingest::routes())
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", "no such endpoint")
        })
        .with_state(state)
}

/// Only the ingest routes and `/health`, for a separate `--ingest-listen` listener.
pub fn ingest_router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .merge(ingest::routes())
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", "no such endpoint")
        })
        .with_state(state)
}

/// Serves the ingest routes alone on `listener` until the process ends.
pub async fn serve_ingest(
    listener: tokio::net::TcpListener,
    state: Arc<HttpState>,
) -> std::io::Result<()> {
    axum::serve(listener, ingest_router(state)).await
}

/// Serves HTTP on `listener` until the process ends.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<HttpState>,
) -> std::io::Result<()> {
    axum::serve(listener, router(state)).await
}

async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

async fn ready(State(s): State<Arc<HttpState>>) -> Response {
    let cluster = s.broker.get().and_then(|b| b.cluster().cloned());
    if let (true, Some(cluster)) = (s.ready.load(Ordering::SeqCst), cluster) {
        // A cluster node is ready once it has joined, knows the controller and its replicas
        // have caught up.
        return match cluster.readiness() {
            Ok(()) => (StatusCode::OK, Json(json!({"ready": true}))).into_response(),
            Err(reason) => (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"ready": false, "reason": reason})),
            )
                .into_response(),
        };
    }
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, Json(json!({"ready": true}))).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"ready": false, "reason": "recovering logs"})),
        )
            .into_response()
    }
}

async fn metrics_text(State(s): State<Arc<HttpState>>) -> Response {
    let mut body = match s.broker.get() {
        Some(b) => {
            let mut text = metrics::render(b);
            text.push_str(&metrics::render_cluster(b).await);
            if let Some(search) = s.search() {
                text.push_str(&metrics::render_search(&search));
            }
            text.push_str(&ingest::render_metrics(&s.ingest));
            text
        }
        None => metrics::render_process_only(),
    };
    // The parts are written by prometheus-client each without the end marker; one ends all.
    body.push_str(spate_metrics::text::EOF);
    (
        [(header::CONTENT_TYPE, spate_metrics::text::CONTENT_TYPE)],
        body,
    )
        .into_response()
}

/// Mutating admin calls need the bearer token when one is configured.
async fn require_token(State(s): State<Arc<HttpState>>, req: Request, next: Next) -> Response {
    let mutating = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS)
        && !search::is_search_path(req.uri().path())
        && !ingest::is_ingest_path(req.uri().path());
    if let (true, Some(token)) = (mutating, &s.token) {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(token.as_str()) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "UNAUTHORIZED",
                "this call needs 'Authorization: Bearer <admin token>'",
            )
            .into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests;
