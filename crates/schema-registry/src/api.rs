//! Confluent's Schema Registry REST API over a [`Registry`]: its paths, JSON bodies, error
//! bodies (`{"error_code": ..., "message": ...}`) and content types.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Extension, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;
use spate_auth::acl::Operation;

use crate::access::{self, Access, Caller, Guard};
use crate::error::RegistryError;
use crate::forward::{self, Forward, ForwardRequest, Route};
use crate::registry::{ConfigRequest, Registry, SchemaRequest};

/// The content type of every answer.
pub const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// Content types request bodies may have (or none).
const ACCEPTED: [&str; 4] = [
    "application/vnd.schemaregistry.v1+json",
    "application/vnd.schemaregistry+json",
    "application/json",
    "application/octet-stream",
];

type Reg = State<Arc<Registry>>;
type Params = Query<HashMap<String, String>>;

/// An error answer; the error code also travels in the response's extensions for metrics.
struct ApiError(RegistryError);

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        ApiError(e)
    }
}

/// The error code of an answer, for the metrics layer.
#[derive(Clone, Copy)]
struct ErrorCode(u32);

fn error_response(status: u16, code: u32, message: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = json_response(status, &json!({"error_code": code, "message": message}));
    r.extensions_mut().insert(ErrorCode(code));
    r
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error_response(
            self.0.http_status(),
            self.0.error_code(),
            self.0.to_string(),
        )
    }
}

fn json_response(status: StatusCode, v: &impl Serialize) -> Response {
    // Answers are plain data and always serialize.
    let body = serde_json::to_vec(v).unwrap_or_default();
    let mut r = (status, body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    r
}

fn ok(v: impl Serialize) -> Result<Response, ApiError> {
    Ok(json_response(StatusCode::OK, &v))
}

/// A boolean query parameter (`true`, any case); absent is false.
fn flag(q: &HashMap<String, String>, name: &str) -> bool {
    q.get(name).is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// A boolean query parameter that may be absent.
fn maybe_flag(q: &HashMap<String, String>, name: &str) -> Option<bool> {
    q.get(name).map(|v| v.eq_ignore_ascii_case("true"))
}

/// Reads a JSON body: the content type must be one the API takes, the size within the limit.
async fn body<T: DeserializeOwned>(
    reg: &Registry,
    headers: &HeaderMap,
    body: Body,
) -> Result<T, ApiError> {
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("");
        let media = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if !ACCEPTED.contains(&media.as_str()) {
            return Err(RegistryError::UnsupportedMediaType(ct.to_string()).into());
        }
    }
    let limit = reg.settings().max_body_bytes;
    // A declared length over the limit is refused before anything is read.
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(RegistryError::BodyTooLarge(limit).into());
    }
    let wait = reg.settings().body_timeout;
    let bytes = tokio::time::timeout(wait, axum::body::to_bytes(body, limit))
        .await
        .map_err(|_| RegistryError::BodyTimeout(wait.as_millis() as u64))?
        .map_err(|_| RegistryError::BodyTooLarge(limit))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        RegistryError::BadRequest(format!("the body is not the JSON expected: {e}")).into()
    })
}

fn schema_id(id: &str) -> Result<i32, ApiError> {
    id.parse::<i32>()
        .map_err(|_| RegistryError::NoSuchPath("HTTP 404 Not Found".into()).into())
}

/// What the API needs from outside the registry in a secured cluster; without them it is
/// open and a node that does not lead `_schemas` refuses writes (50003).
#[derive(Clone, Default)]
pub struct Hooks {
    /// Authentication and ACLs (`--http-auth basic`); `None`: open.
    pub access: Option<Arc<dyn Access>>,
    /// Sends writes on to the node leading `_schemas`; `None`: writes there are refused.
    pub forward: Option<Arc<dyn Forward>>,
}

/// The routes, at the root of the listener, open and without forwarding.
pub fn router(registry: Arc<Registry>) -> Router {
    router_with(registry, Hooks::default())
}

/// The routes, at the root of the listener, with `hooks`: a request is counted (observe),
/// then its caller checked (guard), then a write off the leader forwarded (writes).
pub fn router_with(registry: Arc<Registry>, hooks: Hooks) -> Router {
    let hooks = Arc::new(hooks);
    Router::new()
        .route("/", get(root))
        .route("/subjects", get(subjects))
        .route("/subjects/{subject}", post(lookup).delete(delete_subject))
        .route("/subjects/{subject}/versions", get(versions).post(register))
        .route(
            "/subjects/{subject}/versions/{version}",
            get(version).delete(delete_version),
        )
        .route(
            "/subjects/{subject}/versions/{version}/schema",
            get(version_schema),
        )
        .route(
            "/subjects/{subject}/versions/{version}/referencedby",
            get(referenced_by),
        )
        .route("/schemas", get(schemas))
        .route("/schemas/types", get(types))
        .route("/schemas/ids/{id}", get(by_id))
        .route("/schemas/ids/{id}/schema", get(by_id_schema))
        .route("/schemas/ids/{id}/subjects", get(by_id_subjects))
        .route("/schemas/ids/{id}/versions", get(by_id_versions))
        .route(
            "/config",
            get(global_config)
                .put(set_global_config)
                .delete(delete_global_config),
        )
        .route(
            "/config/{subject}",
            get(subject_config)
                .put(set_subject_config)
                .delete(delete_subject_config),
        )
        .route("/mode", get(global_mode).put(set_global_mode))
        .route(
            "/mode/{subject}",
            get(subject_mode)
                .put(set_subject_mode)
                .delete(delete_subject_mode),
        )
        .route(
            "/compatibility/subjects/{subject}/versions/{version}",
            post(compatible_with_version),
        )
        .route(
            "/compatibility/subjects/{subject}/versions",
            post(compatible_with_subject),
        )
        .route("/contexts", get(contexts))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            (registry.clone(), hooks.clone()),
            writes,
        ))
        .layer(middleware::from_fn_with_state(hooks, guard))
        .layer(middleware::from_fn_with_state(registry.clone(), observe))
        .with_state(registry)
}

/// Serves the API on `listener` until the process ends, open and without forwarding.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
) -> std::io::Result<()> {
    serve_with(listener, registry, Hooks::default()).await
}

/// Serves the API with `hooks` on `listener` until the process ends.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    hooks: Hooks,
) -> std::io::Result<()> {
    let app =
        router_with(registry, hooks).into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, app).await
}

/// With security on: lets in callers with valid credentials (401 otherwise) that may do what
/// the request needs (403 otherwise); handlers that decide item by item get a [`Guard`].
async fn guard(State(hooks): State<Arc<Hooks>>, mut req: Request, next: Next) -> Response {
    let Some(access) = hooks.access.clone() else {
        return next.run(req).await;
    };
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let caller: Caller = match access.authenticate(req.headers(), peer) {
        Ok(c) => c,
        Err(why) => {
            let mut r = ApiError(RegistryError::Unauthorized(why)).into_response();
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"spate\""),
            );
            return r;
        }
    };
    let guard = Guard::new(access, caller);
    let need = access::need(req.method(), req.uri().path());
    if !guard.meets(&need) {
        return ApiError(RegistryError::Forbidden(guard.refusal(&need))).into_response();
    }
    req.extensions_mut().insert(guard);
    next.run(req).await
}

/// Sends a write that reached a node not leading `_schemas` on to the node that does, once,
/// and relays its answer.
async fn writes(
    State((reg, hooks)): State<(Arc<Registry>, Arc<Hooks>)>,
    req: Request,
    next: Next,
) -> Response {
    if !forward::is_write(req.method(), req.uri().path()) {
        return next.run(req).await;
    }
    let forwarded = req.headers().contains_key(forward::FORWARDED_HEADER);
    let node = match forward::route(reg.writer(), forwarded, hooks.forward.is_some()) {
        Route::Local => {
            let mut r = next.run(req).await;
            if forwarded && r.status().is_success() {
                r.headers_mut().insert(
                    forward::APPLIED_HEADER,
                    HeaderValue::from(reg.applied_offset()),
                );
            }
            return r;
        }
        Route::Refuse(why) => return ApiError(RegistryError::NotLeader(why)).into_response(),
        Route::Forward(node) => node,
    };
    let Some(forwarder) = hooks.forward.clone() else {
        return next.run(req).await;
    };
    match forward_write(&reg, forwarder.as_ref(), node, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// Reads the write's body within the registry's limits, sends it to `node` and turns its
/// answer into this node's.
async fn forward_write(
    reg: &Registry,
    forwarder: &dyn Forward,
    node: i32,
    req: Request,
) -> Result<Response, ApiError> {
    let (parts, raw) = req.into_parts();
    let limit = reg.settings().max_body_bytes;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(RegistryError::BodyTooLarge(limit).into());
    }
    let wait = reg.settings().body_timeout;
    let bytes = tokio::time::timeout(wait, axum::body::to_bytes(raw, limit))
        .await
        .map_err(|_| RegistryError::BodyTimeout(wait.as_millis() as u64))?
        .map_err(|_| RegistryError::BodyTooLarge(limit))?;
    let request = ForwardRequest {
        method: parts.method,
        path_and_query: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string()),
        content_type: parts.headers.get(header::CONTENT_TYPE).cloned(),
        authorization: parts.headers.get(header::AUTHORIZATION).cloned(),
        body: bytes,
    };
    reg.metrics.forwarded.inc();
    let answer = forwarder
        .forward(node, request, forward::FORWARD_TIMEOUT)
        .await
        .map_err(|why| {
            reg.metrics.forward_failures.inc();
            RegistryError::NotLeader(format!(
                "forwarding the write to node {node}, which leads the _schemas topic, failed: {why}"
            ))
        })?;
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
    // Read here as far as the leader had applied the write, so this client's next read on
    // this node sees it. The write is done either way: a slow copy only loses that.
    if let (true, Some(applied)) = (status.is_success(), answer.applied) {
        if let Err(e) = reg.await_applied(applied).await {
            tracing::warn!(node, applied, error = %e, "a forwarded schema registry write is not readable here yet");
        }
    }
    let mut r = (status, answer.body.clone()).into_response();
    if let Some(ct) = answer.content_type {
        r.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    // Counted by its code here too, so each node's error counters cover what it answered.
    if !status.is_success() {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&answer.body) {
            if let Some(code) = v["error_code"].as_u64().and_then(|c| u32::try_from(c).ok()) {
                r.extensions_mut().insert(ErrorCode(code));
            }
        }
    }
    Ok(r)
}

/// Counts requests, errors by code, and latency.
async fn observe(State(reg): Reg, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let response = next.run(req).await;
    reg.metrics.requests.inc();
    reg.metrics
        .latency_us
        .observe(started.elapsed().as_micros() as u64);
    if let Some(ErrorCode(code)) = response.extensions().get::<ErrorCode>() {
        reg.metrics.error(*code);
    }
    response
}

async fn not_found() -> Response {
    error_response(404, 404, "no such endpoint".into())
}

async fn method_not_allowed(method: Method) -> Response {
    error_response(405, 405, format!("method {method} is not allowed here"))
}

async fn root() -> Result<Response, ApiError> {
    ok(json!({}))
}

/// The guard of a request when security is on (handlers that decide item by item).
type MaybeGuard = Option<Extension<Guard>>;

/// Whether the caller may see `subject` (always, without security).
fn may_see(guard: &MaybeGuard, subject: &str) -> bool {
    guard
        .as_ref()
        .is_none_or(|Extension(g)| g.may(Operation::Describe, subject))
}

/// Refuses an id unless the caller may see a subject that uses it (deleted uses count, as
/// a deserializer still reads records written with them).
fn check_id(reg: &Registry, guard: &MaybeGuard, id: i32) -> Result<(), ApiError> {
    let Some(Extension(g)) = guard else {
        return Ok(());
    };
    let uses = reg.versions_of_id(id, true)?;
    if uses.iter().any(|u| g.may(Operation::Describe, &u.subject)) {
        return Ok(());
    }
    Err(RegistryError::Forbidden(format!(
        "{} may not describe a topic of any subject using schema {id}",
        g.caller().name()
    ))
    .into())
}

/// Refuses a schema whose references name a subject the caller may not describe: its
/// request would build on, or probe, a schema the caller cannot read.
fn check_references(guard: &MaybeGuard, req: &SchemaRequest) -> Result<(), ApiError> {
    let Some(Extension(g)) = guard else {
        return Ok(());
    };
    let refs = req.references.iter().flatten();
    match refs
        .map(|r| access::Need::Subject(Operation::Describe, r.subject.clone()))
        .find(|n| !g.meets(n))
    {
        None => Ok(()),
        Some(need) => Err(RegistryError::Forbidden(g.refusal(&need)).into()),
    }
}

async fn subjects(
    State(reg): Reg,
    guard: MaybeGuard,
    Query(q): Params,
) -> Result<Response, ApiError> {
    let mut all = reg.subjects(
        flag(&q, "deleted"),
        q.get("subjectPrefix").map(String::as_str),
    );
    all.retain(|s| may_see(&guard, s));
    ok(all)
}

async fn lookup(
    State(reg): Reg,
    guard: MaybeGuard,
    Path(subject): Path<String>,
    Query(q): Params,
    headers: HeaderMap,
    raw: Body,
) -> Result<Response, ApiError> {
    let req: SchemaRequest = body(&reg, &headers, raw).await?;
    check_references(&guard, &req)?;
    let mut a = reg.lookup(
        &subject,
        &req,
        maybe_flag(&q, "normalize"),
        flag(&q, "deleted"),
    )?;
    if serialized(&q) {
        a.schema = reg.serialized(a.schema_type.as_deref(), a.schema, &a.references)?;
    }
    ok(a)
}

async fn delete_subject(
    State(reg): Reg,
    Path(subject): Path<String>,
    Query(q): Params,
) -> Result<Response, ApiError> {
    ok(reg.delete_subject(&subject, flag(&q, "permanent")).await?)
}

async fn versions(
    State(reg): Reg,
    Path(subject): Path<String>,
    Query(q): Params,
) -> Result<Response, ApiError> {
    ok(reg.versions(&subject, flag(&q, "deleted"))?)
}

async fn register(
    State(reg): Reg,
    guard: MaybeGuard,
    Path(subject): Path<String>,
    Query(q): Params,
    headers: HeaderMap,
    raw: Body,
) -> Result<Response, ApiError> {
    let req: SchemaRequest = body(&reg, &headers, raw).await?;
    check_references(&guard, &req)?;
    let id = reg
        .register(&subject, req, maybe_flag(&q, "normalize"))
        .await?;
    ok(json!({ "id": id }))
}

async fn version(
    State(reg): Reg,
    Path((subject, version)): Path<(String, String)>,
    Query(q): Params,
) -> Result<Response, ApiError> {
    let mut a = reg.version(&subject, &version, flag(&q, "deleted"))?;
    if serialized(&q) {
        a.schema = reg.serialized(a.schema_type.as_deref(), a.schema, &a.references)?;
    }
    ok(a)
}

async fn delete_version(
    State(reg): Reg,
    Path((subject, version)): Path<(String, String)>,
    Query(q): Params,
) -> Result<Response, ApiError> {
    ok(reg
        .delete_version(&subject, &version, flag(&q, "permanent"))
        .await?)
}

/// The schema text itself, as the body.
fn raw_schema(text: String) -> Result<Response, ApiError> {
    let mut r = (StatusCode::OK, text).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    Ok(r)
}

async fn version_schema(
    State(reg): Reg,
    Path((subject, version)): Path<(String, String)>,
    Query(q): Params,
) -> Result<Response, ApiError> {
    let a = reg.version(&subject, &version, flag(&q, "deleted"))?;
    if serialized(&q) {
        return raw_schema(reg.serialized(a.schema_type.as_deref(), a.schema, &a.references)?);
    }
    raw_schema(a.schema)
}

async fn referenced_by(
    State(reg): Reg,
    Path((subject, version)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    ok(reg.referenced_by(&subject, &version)?)
}

async fn schemas(
    State(reg): Reg,
    guard: MaybeGuard,
    Query(q): Params,
) -> Result<Response, ApiError> {
    let mut all = reg.all_versions(
        flag(&q, "deleted"),
        flag(&q, "latestOnly"),
        q.get("subjectPrefix").map(String::as_str),
    );
    all.retain(|a| may_see(&guard, &a.subject));
    ok(all)
}

async fn types() -> Result<Response, ApiError> {
    // Confluent's order.
    ok(["JSON", "PROTOBUF", "AVRO"])
}

/// Whether the client asked for `format=serialized` (a Protobuf schema as its base64
/// `FileDescriptorProto`, what Confluent's Protobuf deserializers ask for).
fn serialized(q: &HashMap<String, String>) -> bool {
    q.get("format").is_some_and(|f| f == "serialized")
}

async fn by_id(
    State(reg): Reg,
    guard: MaybeGuard,
    Path(id): Path<String>,
    Query(q): Params,
) -> Result<Response, ApiError> {
    check_id(&reg, &guard, schema_id(&id)?)?;
    let mut a = reg.schema_by_id(schema_id(&id)?)?;
    if serialized(&q) {
        a.schema = reg.serialized(a.schema_type.as_deref(), a.schema, &a.references)?;
    }
    ok(a)
}

async fn by_id_schema(
    State(reg): Reg,
    guard: MaybeGuard,
    Path(id): Path<String>,
    Query(q): Params,
) -> Result<Response, ApiError> {
    check_id(&reg, &guard, schema_id(&id)?)?;
    let a = reg.schema_by_id(schema_id(&id)?)?;
    if serialized(&q) {
        return raw_schema(reg.serialized(a.schema_type.as_deref(), a.schema, &a.references)?);
    }
    raw_schema(a.schema)
}

async fn by_id_subjects(
    State(reg): Reg,
    guard: MaybeGuard,
    Path(id): Path<String>,
    Query(q): Params,
) -> Result<Response, ApiError> {
    check_id(&reg, &guard, schema_id(&id)?)?;
    let uses = reg.versions_of_id(schema_id(&id)?, flag(&q, "deleted"))?;
    let mut subjects: Vec<String> = uses
        .into_iter()
        .map(|u| u.subject)
        .filter(|s| may_see(&guard, s))
        .collect();
    subjects.dedup();
    ok(subjects)
}

async fn by_id_versions(
    State(reg): Reg,
    guard: MaybeGuard,
    Path(id): Path<String>,
    Query(q): Params,
) -> Result<Response, ApiError> {
    check_id(&reg, &guard, schema_id(&id)?)?;
    let mut uses = reg.versions_of_id(schema_id(&id)?, flag(&q, "deleted"))?;
    uses.retain(|u| may_see(&guard, &u.subject));
    ok(uses)
}

async fn global_config(State(reg): Reg) -> Result<Response, ApiError> {
    ok(reg.config(None, true)?)
}

async fn set_global_config(
    State(reg): Reg,
    headers: HeaderMap,
    raw: Body,
) -> Result<Response, ApiError> {
    let req: ConfigRequest = body(&reg, &headers, raw).await?;
    ok(reg.set_config(None, req).await?)
}

async fn delete_global_config(State(reg): Reg) -> Result<Response, ApiError> {
    ok(reg.delete_config(None).await?)
}

async fn subject_config(
    State(reg): Reg,
    Path(subject): Path<String>,
    Query(q): Params,
) -> Result<Response, ApiError> {
    ok(reg.config(Some(&subject), flag(&q, "defaultToGlobal"))?)
}

async fn set_subject_config(
    State(reg): Reg,
    Path(subject): Path<String>,
    headers: HeaderMap,
    raw: Body,
) -> Result<Response, ApiError> {
    let req: ConfigRequest = body(&reg, &headers, raw).await?;
    ok(reg.set_config(Some(&subject), req).await?)
}

async fn delete_subject_config(
    State(reg): Reg,
    Path(subject): Path<String>,
) -> Result<Response, ApiError> {
    ok(reg.delete_config(Some(&subject)).await?)
}

/// A mode change as clients send it.
#[derive(serde::Deserialize)]
struct ModeRequest {
    mode: String,
}

fn mode_answer(m: crate::store::Mode) -> Result<Response, ApiError> {
    ok(json!({ "mode": m.name() }))
}

async fn global_mode(State(reg): Reg) -> Result<Response, ApiError> {
    mode_answer(reg.mode(None, true)?)
}

async fn set_global_mode(
    State(reg): Reg,
    Query(q): Params,
    headers: HeaderMap,
    raw: Body,
) -> Result<Response, ApiError> {
    let req: ModeRequest = body(&reg, &headers, raw).await?;
    mode_answer(reg.set_mode(None, &req.mode, flag(&q, "force")).await?)
}

async fn subject_mode(
    State(reg): Reg,
    Path(subject): Path<String>,
    Query(q): Params,
) -> Result<Response, ApiError> {
    mode_answer(reg.mode(Some(&subject), flag(&q, "defaultToGlobal"))?)
}

async fn set_subject_mode(
    State(reg): Reg,
    Path(subject): Path<String>,
    Query(q): Params,
    headers: HeaderMap,
    raw: Body,
) -> Result<Response, ApiError> {
    let req: ModeRequest = body(&reg, &headers, raw).await?;
    mode_answer(
        reg.set_mode(Some(&subject), &req.mode, flag(&q, "force"))
            .await?,
    )
}

async fn delete_subject_mode(
    State(reg): Reg,
    Path(subject): Path<String>,
) -> Result<Response, ApiError> {
    mode_answer(reg.delete_mode(&subject).await?)
}

fn compatibility_answer(
    ok_: bool,
    messages: Vec<String>,
    verbose: bool,
) -> Result<Response, ApiError> {
    if verbose {
        ok(json!({ "is_compatible": ok_, "messages": messages }))
    } else {
        ok(json!({ "is_compatible": ok_ }))
    }
}

async fn compatible_with_version(
    State(reg): Reg,
    guard: MaybeGuard,
    Path((subject, version)): Path<(String, String)>,
    Query(q): Params,
    headers: HeaderMap,
    raw: Body,
) -> Result<Response, ApiError> {
    let req: SchemaRequest = body(&reg, &headers, raw).await?;
    check_references(&guard, &req)?;
    let (is, msgs) =
        reg.check_compatibility(&subject, Some(&version), &req, maybe_flag(&q, "normalize"))?;
    compatibility_answer(is, msgs, flag(&q, "verbose"))
}

async fn compatible_with_subject(
    State(reg): Reg,
    guard: MaybeGuard,
    Path(subject): Path<String>,
    Query(q): Params,
    headers: HeaderMap,
    raw: Body,
) -> Result<Response, ApiError> {
    let req: SchemaRequest = body(&reg, &headers, raw).await?;
    check_references(&guard, &req)?;
    let (is, msgs) = reg.check_compatibility(&subject, None, &req, maybe_flag(&q, "normalize"))?;
    compatibility_answer(is, msgs, flag(&q, "verbose"))
}

async fn contexts() -> Result<Response, ApiError> {
    // One context, the default: subjects are not qualified by contexts yet.
    ok(["."])
}
