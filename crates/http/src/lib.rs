//! The HTTP listener: `/metrics` (OpenMetrics text), `/health`, `/ready`, and a JSON admin API
//! under `/admin`, and Elasticsearch-compatible `/{topics}/_search` and `_count` over
//! searchable topics, and HTTP ingest (`/topics/{topic}`, `/produce/...`, see [`ingest`]). Admin
//! mutations need `Authorization: Bearer <token>` when a token is
//! configured.

mod admin;
mod cluster_admin;
mod elastic;
pub mod ingest;
mod metrics;
pub mod peer;
mod search;
pub mod tls;

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

/// How HTTP clients authenticate (`--http-auth`, `--http-metrics-auth`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HttpAuth {
    /// Every call but `/health`, `/ready` (and `/metrics` unless `metrics` is set) needs HTTP
    /// Basic credentials of a SASL user, or the admin token; ACLs apply to the user.
    pub basic: bool,
    /// `/metrics` needs credentials too.
    pub metrics: bool,
}

/// What the HTTP side serves from; the broker arrives once recovery has finished.
pub struct HttpState {
    broker: OnceLock<Arc<Broker>>,
    ready: AtomicBool,
    token: Option<String>,
    auth: std::sync::OnceLock<HttpAuth>,
    effective_config: serde_json::Value,
    search: OnceLock<Arc<spate_search::SearchService>>,
    ingest: Arc<ingest::Ingest>,
    peer_tls: OnceLock<tls::PeerTls>,
    /// More metrics families for `/metrics`, from services outside this crate.
    extra_metrics: parking_lot::Mutex<Vec<MetricsSource>>,
    /// The schema registry HTTP ingest encodes schema'd records with, when one runs.
    record_schemas: OnceLock<Arc<dyn ingest::schemas::RecordSchemas>>,
    /// The schema registry's API and state, when one runs on this node.
    schema_registry: OnceLock<SchemaRegistry>,
}

/// The schema registry as this listener serves it: its API, reached by other nodes under
/// [`SCHEMA_REGISTRY_PATH`] (writes forwarded to the node leading `_schemas`), and its state
/// for `/admin`.
pub struct SchemaRegistry {
    /// The registry's routes, with its own authentication and ACL checks.
    pub api: Router,
    /// The registry's state as `/admin/broker` and `/admin/schema-registry` show it.
    pub status: Box<dyn Fn() -> serde_json::Value + Send + Sync>,
}

/// Where this listener serves the schema registry's API for other nodes (forwarded writes).
pub const SCHEMA_REGISTRY_PATH: &str = "/_spate/schema-registry";

/// Why HTTP Basic credentials were not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BasicRefusal {
    /// No HTTP Basic credentials, or unreadable ones.
    #[error("this call needs HTTP Basic credentials of a SASL user")]
    Missing,
    /// An unknown user or a wrong password (the same answer for both).
    #[error("invalid credentials")]
    Invalid,
}

/// The session of the SASL user whose HTTP Basic credentials `headers` carry, checked against
/// the broker's credential store (failures logged, at most once a second per address).
pub fn authenticate_basic(
    b: &Broker,
    headers: &axum::http::HeaderMap,
    peer: Option<std::net::IpAddr>,
) -> Result<spate_broker::security::Session, BasicRefusal> {
    use base64::Engine;
    let (user, password) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|v| {
            base64::engine::general_purpose::STANDARD
                .decode(v.trim())
                .ok()
        })
        .and_then(|raw| String::from_utf8(raw).ok())
        .and_then(|text| {
            text.split_once(':')
                .map(|(u, p)| (u.to_string(), p.to_string()))
        })
        .ok_or(BasicRefusal::Missing)?;
    if !b
        .credentials
        .check_password_cached(&user, password.as_bytes())
    {
        b.credentials
            .log_failure(peer, &user, "HTTP Basic", "invalid credentials");
        return Err(BasicRefusal::Invalid);
    }
    Ok(spate_broker::security::Session::new(
        spate_broker::security::SecurityProtocol::Plaintext,
        peer,
        Some(spate_auth::Principal::user(user)),
    ))
}

/// Writes OpenMetrics families (without the final `# EOF`) at scrape time.
pub type MetricsSource = Box<dyn Fn() -> String + Send + Sync>;

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
            auth: std::sync::OnceLock::new(),
            effective_config,
            search: OnceLock::new(),
            ingest: ingest::Ingest::new(ingest),
            peer_tls: OnceLock::new(),
            extra_metrics: parking_lot::Mutex::new(Vec::new()),
            record_schemas: OnceLock::new(),
            schema_registry: OnceLock::new(),
        })
    }

    /// Sets the schema registry HTTP ingest encodes Avro, JSON Schema and Protobuf records
    /// with (once, when the registry starts; without it those formats are refused).
    pub fn set_record_schemas(&self, schemas: Arc<dyn ingest::schemas::RecordSchemas>) {
        let _ = self.record_schemas.set(schemas);
    }

    fn record_schemas(&self) -> Option<&Arc<dyn ingest::schemas::RecordSchemas>> {
        self.record_schemas.get()
    }

    /// Sets the schema registry this node runs (once, when it starts).
    pub fn set_schema_registry(&self, registry: SchemaRegistry) {
        let _ = self.schema_registry.set(registry);
    }

    /// The schema registry's state, or `{"enabled": false}` without one.
    pub(crate) fn schema_registry_status(&self) -> serde_json::Value {
        match self.schema_registry.get() {
            Some(r) => (r.status)(),
            None => json!({"enabled": false}),
        }
    }

    /// How HTTP clients authenticate.
    pub fn auth(&self) -> HttpAuth {
        self.auth.get().copied().unwrap_or_default()
    }

    /// Whether `headers` carry the admin token (`Authorization: Bearer ...`), a super user.
    pub fn is_admin_token(&self, headers: &axum::http::HeaderMap) -> bool {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        self.token.is_some() && bearer == self.token.as_deref()
    }

    /// Adds metrics families to `/metrics` (a service this crate does not know, such as the
    /// schema registry).
    pub fn add_metrics(&self, source: MetricsSource) {
        self.extra_metrics.lock().push(source);
    }

    /// Sets how HTTP clients authenticate (once, at start; without it: the admin token only).
    pub fn set_auth(&self, auth: HttpAuth) {
        let _ = self.auth.set(auth);
    }

    /// Sets how this node reaches other nodes' HTTP listeners (once, at start; without it:
    /// plain HTTP).
    pub fn set_peer_tls(&self, tls: tls::PeerTls) {
        let _ = self.peer_tls.set(tls);
    }

    /// How this node reaches other nodes' HTTP listeners.
    pub fn peer_tls(&self) -> &tls::PeerTls {
        static PLAIN: tls::PeerTls = tls::PeerTls(None);
        self.peer_tls.get().unwrap_or(&PLAIN)
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
        .merge(elastic::routes())
        .merge(ingest::routes())
        .route(
            &format!("{SCHEMA_REGISTRY_PATH}/{{*rest}}"),
            axum::routing::any(schema_registry_api),
        )
        .layer(middleware::from_fn(elastic::product_header))
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", "no such endpoint")
        })
        .with_state(state)
}

/// The schema registry's API under [`SCHEMA_REGISTRY_PATH`]: the request goes to the
/// registry's routes with the prefix taken off (the registry checks credentials and ACLs
/// itself).
async fn schema_registry_api(State(s): State<Arc<HttpState>>, mut req: Request) -> Response {
    use tower::ServiceExt;
    let Some(registry) = s.schema_registry.get() else {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            "no schema registry runs on this node",
        )
        .into_response();
    };
    let inner = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .strip_prefix(SCHEMA_REGISTRY_PATH)
        .unwrap_or("/")
        .to_string();
    match inner.parse() {
        Ok(uri) => *req.uri_mut() = uri,
        Err(_) => {
            return ApiError::new(StatusCode::BAD_REQUEST, "BAD_REQUEST", "unreadable path")
                .into_response()
        }
    }
    // Only the client's address goes on: this router's path parameters would be read by the
    // registry's own routes as theirs.
    let (mut parts, body) = req.into_parts();
    let client = parts
        .extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .cloned();
    parts.extensions = Default::default();
    if let Some(c) = client {
        parts.extensions.insert(c);
    }
    let req = Request::from_parts(parts, body);
    match registry.api.clone().oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

/// Only the ingest routes and `/health`, for a separate `--ingest-listen` listener.
pub fn ingest_router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .merge(ingest::routes())
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", "no such endpoint")
        })
        .with_state(state)
}

/// Serves the ingest routes alone on `listener` until the process ends.
pub async fn serve_ingest(
    listener: tokio::net::TcpListener,
    state: Arc<HttpState>,
    https: Option<tokio_rustls::TlsAcceptor>,
) -> std::io::Result<()> {
    serve_router(listener, ingest_router(state), https).await
}

/// Serves `app` on `listener`, over TLS when `https` is given (also the schema registry's
/// listener, so that every HTTP port of a node speaks the same protocol).
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    app: Router,
    https: Option<tokio_rustls::TlsAcceptor>,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    match https {
        None => axum::serve(listener, app).await,
        // `tap_io` only to get axum's client address for any listener whose address is a
        // SocketAddr.
        Some(acceptor) => {
            let tls = tls::TlsListener::new(listener, acceptor)?.tap_io(|_| {});
            axum::serve(tls, app).await
        }
    }
}

/// Serves HTTP on `listener` until the process ends.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<HttpState>,
    https: Option<tokio_rustls::TlsAcceptor>,
) -> std::io::Result<()> {
    serve_router(listener, router(state), https).await
}

/// Always 200 while the process serves (a liveness probe); the body tells a full disk.
async fn health(State(s): State<Arc<HttpState>>) -> Json<serde_json::Value> {
    let Some(b) = s.broker.get() else {
        return Json(json!({"status": "ok"}));
    };
    let d = &b.disk;
    let full = d.is_full();
    Json(json!({
        "status": if full { "disk_full" } else { "ok" },
        "disk": {
            "dir": d.dir().display().to_string(),
            "full": full,
            "free_bytes": d.free_bytes(),
            "total_bytes": d.total_bytes(),
            "threshold_bytes": d.threshold_bytes(),
            "reason": full.then(|| d.refusal()),
        },
    }))
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
            for source in s.extra_metrics.lock().iter() {
                text.push_str(&source());
            }
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

/// Mutating admin calls need the bearer token when one is configured; with `--http-auth
/// basic` every call but the probes needs a user (or the token), and ACLs apply.
/// The SASL user an HTTP Basic request authenticated as, for handlers that check ACLs per
/// item (an `_msearch` names its topics in its body).
#[derive(Clone)]
pub(crate) struct Caller(Arc<spate_broker::security::Session>);

impl Caller {
    /// The error answer of a search of `expr` this caller may not read, if it may not: Read
    /// on each named topic, or Describe on the cluster for wildcards and `_all` (as `/_search`).
    pub(crate) fn refuses_read(&self, s: &HttpState, expr: &str) -> Option<serde_json::Value> {
        use spate_auth::acl::{Operation, ResourceType, CLUSTER_NAME};
        let b = s.broker().ok()?;
        let names: Vec<&str> = expr.split(',').map(str::trim).collect();
        let allowed = names.iter().all(|n| {
            if *n == "_all" || n.contains('*') {
                b.authorizer.allows(
                    Some(&self.0),
                    Operation::Describe,
                    ResourceType::Cluster,
                    CLUSTER_NAME,
                )
            } else {
                b.authorizer
                    .allows(Some(&self.0), Operation::Read, ResourceType::Topic, n)
            }
        });
        (!allowed).then(|| {
            let reason = format!("{} may not read [{expr}]", self.0.principal());
            serde_json::json!({
                "error": {"root_cause": [{"type": "security_exception", "reason": reason}],
                          "type": "security_exception", "reason": reason},
                "status": 403,
            })
        })
    }
}

async fn require_token(State(s): State<Arc<HttpState>>, mut req: Request, next: Next) -> Response {
    let auth = s.auth();
    let path = req.uri().path();
    // The schema registry's API checks its callers itself, as on its own listener.
    if path
        .strip_prefix(SCHEMA_REGISTRY_PATH)
        .is_some_and(|rest| rest.starts_with('/'))
    {
        return next.run(req).await;
    }
    let open = path == "/health" || path == "/ready" || (path == "/metrics" && !auth.metrics);
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let token_ok = s.token.is_some() && bearer == s.token.as_deref();
    if auth.basic && !open && !token_ok {
        // The admin token is a super user; anyone else shows a SASL user's password.
        match basic_user(&s, &req) {
            Err(refused) => return *refused,
            Ok(Some(session)) => {
                req.extensions_mut().insert(Caller(Arc::new(session)));
            }
            Ok(None) => {}
        }
        return next.run(req).await;
    }
    let mutating = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS)
        && !search::is_search_path(req.uri().path())
        && !elastic::is_read_path(req.uri().path())
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

fn unauthorized(why: &str) -> Response {
    let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", why).into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Basic realm=\"spate\""),
    );
    r
}

/// Checks a request's HTTP Basic credentials against the SASL credential store, then the
/// ACL its route needs (`Ok` to serve it, with the user's session when ACLs are on).
fn basic_user(
    s: &HttpState,
    req: &Request,
) -> Result<Option<spate_broker::security::Session>, Box<Response>> {
    let b = s.broker().map_err(|e| Box::new(e.into_response()))?;
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let session = authenticate_basic(b, req.headers(), peer)
        .map_err(|e| Box::new(unauthorized(&e.to_string())))?;
    if !b.authorizer.enabled() {
        return Ok(None);
    }
    let (op, rt, names) = http_acl(req);
    for name in names {
        if !b.authorizer.allows(Some(&session), op, rt, &name) {
            return Err(Box::new(
                ApiError::new(
                    StatusCode::FORBIDDEN,
                    "AUTHORIZATION_FAILED",
                    format!("{} may not {op:?} {rt:?} {name}", session.principal()),
                )
                .into_response(),
            ));
        }
    }
    Ok(Some(session))
}

/// What a route needs, in ACL terms: ingest writes its topic, search reads its topics, the
/// admin API describes (GET) or alters (anything else) the cluster, /metrics describes it.
fn http_acl(
    req: &Request,
) -> (
    spate_auth::acl::Operation,
    spate_auth::acl::ResourceType,
    Vec<String>,
) {
    use spate_auth::acl::{Operation, ResourceType, CLUSTER_NAME};
    let path = req.uri().path();
    let cluster = |op| (op, ResourceType::Cluster, vec![CLUSTER_NAME.to_string()]);
    // Any authenticated user: they say nothing about topics. An `_msearch` names its topics
    // in its body and is checked search by search (see `Caller`).
    if elastic::is_open_to_users(path) || path == "/_msearch" {
        return (Operation::Describe, ResourceType::Cluster, Vec::new());
    }
    // Node to node: they read any topic's records, as the nodes themselves may.
    if search::is_internal_path(path) {
        return cluster(Operation::ClusterAction);
    }
    if ingest::is_ingest_path(path) {
        let from_path = path
            .strip_prefix("/topics/")
            .or_else(|| path.strip_prefix("/produce/"))
            .and_then(|rest| rest.split('/').next())
            .filter(|t| !t.is_empty())
            .map(str::to_string);
        let from_query = req.uri().query().and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix("topic="))
                .map(str::to_string)
        });
        return match from_path.or(from_query) {
            Some(t) => (Operation::Write, ResourceType::Topic, vec![t]),
            // Records that name their own topics: only a user allowed to alter the cluster.
            None => cluster(Operation::Alter),
        };
    }
    // Searches and what describes a topic's fields read the topics their path names.
    let reads = search::is_search_path(path)
        || (!path.starts_with("/admin/")
            && ["/_msearch", "/_mapping", "/_field_caps"]
                .iter()
                .any(|e| path.ends_with(e)));
    if reads {
        let index = path.trim_start_matches('/').split('/').next().unwrap_or("");
        if index.starts_with('_') || index.is_empty() {
            return cluster(Operation::Describe);
        }
        return (
            Operation::Read,
            ResourceType::Topic,
            index.split(',').map(str::to_string).collect(),
        );
    }
    match *req.method() {
        Method::GET | Method::HEAD | Method::OPTIONS => cluster(Operation::Describe),
        _ => cluster(Operation::Alter),
    }
}

#[cfg(test)]
mod tests;
