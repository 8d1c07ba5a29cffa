//! Elasticsearch-compatible search endpoints over searchable topics: `/{topics}/_search`
//! and `/{topics}/_count` (GET with `?q=` or a body, POST with a body), where `{topics}` is a
//! name, a comma-separated list or a wildcard pattern; `/_search` searches every searchable
//! topic. Answers and errors have Elasticsearch's shape.
//!
//! In a cluster the node asked plans which node answers each partition (its leader, else
//! another in-sync replica), asks them in parallel over [`PARTIAL_PATH`], retries a
//! partition on its next replica when a node fails, and merges: every partition once. As
//! Elasticsearch's query and fetch phases, the nodes first answer only what the hits sort by;
//! the records of the final page alone are then read and rendered, each by the node that
//! found it ([`FETCH_PATH`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use spate_search::dsl::{Operator, Query as DslQuery};
use spate_search::request::{check_window, parse_sort, SearchRequest};
use spate_search::search::{self, Partial, PartialHit};
use spate_search::service::{PlannedPartition, Preference, Source};
use spate_search::{SearchError, SearchService};

use crate::{peer, HttpState};

pub fn routes() -> Router<Arc<HttpState>> {
    Router::new()
        .route("/_search", get(search_all).post(search_all))
        .route("/_count", get(count_all).post(count_all))
        .route("/{topics}/_search", get(search).post(search))
        .route("/{topics}/_count", get(count).post(count))
        .route(PARTIAL_PATH, post(partial_call))
        .route(FETCH_PATH, post(fetch_call))
        .route(MAPPING_PATH, post(mapping_call))
}

/// The node-to-node paths of a search (answered to other nodes only).
pub fn is_internal_path(path: &str) -> bool {
    path == PARTIAL_PATH || path == FETCH_PATH || path == MAPPING_PATH
}

/// True for paths a search client may POST to without the admin token (they read, like a
/// GET; the internal call answers what `_search` would).
pub fn is_search_path(path: &str) -> bool {
    // The admin API is never a search, whatever its last segment (a topic named `_search`).
    !path.starts_with("/admin/")
        && (path.ends_with("/_search") || path.ends_with("/_count") || is_internal_path(path))
}

fn error(e: SearchError) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
    (status, Json(e.to_json())).into_response()
}

fn service(s: &HttpState) -> Result<Arc<SearchService>, Box<Response>> {
    s.search().ok_or_else(|| {
        Box::new(
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({"error": {"type": "unavailable", "reason": "search is not running yet"}, "status": 503})),
            )
                .into_response(),
        )
    })
}

/// The request from the body, with URL parameters (`q`, `from`, `size`, `sort`, `df`,
/// `default_operator`) applied on top, as Elasticsearch does.
fn request(params: &HashMap<String, String>, body: &Bytes) -> Result<SearchRequest, SearchError> {
    let mut req = SearchService::parse_body(body)?;
    let usize_param = |k: &str| -> Result<Option<usize>, SearchError> {
        params
            .get(k)
            .map(|v| {
                v.trim().parse().map_err(|_| {
                    SearchError::illegal(format!("[{k}] must be a non-negative integer, got [{v}]"))
                })
            })
            .transpose()
    };
    if let Some(q) = params.get("q") {
        let operator = match params
            .get("default_operator")
            .map(|s| s.to_ascii_lowercase())
        {
            Some(op) if op == "and" => Operator::And,
            _ => Operator::Or,
        };
        req.query = DslQuery::QueryString {
            query: q.clone(),
            fields: params
                .get("df")
                .map(|f| vec![f.clone()])
                .unwrap_or_default(),
            operator,
        };
    }
    if let Some(n) = usize_param("from")? {
        req.from = n;
    }
    if let Some(n) = usize_param("size")? {
        req.size = n;
    }
    if let Some(s) = params.get("sort") {
        req.sort = parse_sort(&Value::from(s.as_str()))?;
    }
    check_window(&req)?;
    Ok(req)
}

/// What a search endpoint answers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    Hits,
    Count,
}

/// The internal call a node makes to search some of another node's partitions.
#[derive(Serialize, Deserialize)]
struct PartialCall {
    /// Partitions to search, as `[topic, partition]`.
    partitions: Vec<(String, i32)>,
    /// The client's URL parameters.
    params: HashMap<String, String>,
    /// The client's body, as sent.
    body: String,
    /// `_count` rather than `_search`.
    count: bool,
    /// The caller fetches the final page's records afterwards ([`FETCH_PATH`]): answer hits
    /// unrendered. Callers from before the fetch phase leave it out and get them rendered.
    #[serde(default)]
    fetch_later: bool,
}

/// The internal call a node makes to have another render the hits of the final page it found.
#[derive(Serialize, Deserialize)]
struct FetchCall {
    /// The client's URL parameters.
    params: HashMap<String, String>,
    /// The client's body, as sent.
    body: String,
    /// The hits to render.
    hits: Vec<PartialHit>,
}

/// What a node answers to a [`PartialCall`].
#[derive(Serialize, Deserialize)]
struct PartialAnswer {
    partial: Partial,
    /// Partitions named in the call that this node has no index for.
    missing: Vec<(String, i32)>,
}

/// A partition no node could answer, as Elasticsearch lists shard failures.
struct Failure {
    topic: String,
    partition: i32,
    node: Option<i32>,
    reason: String,
}

/// A partition still to be answered: the source to try next, and why the last one failed.
struct Attempt {
    partition: PlannedPartition,
    next: usize,
    last: Option<(Option<i32>, String)>,
}

/// What a search gathered: answers (with who gave each), and partitions no source could
/// answer.
struct Gathered {
    partials: Vec<Partial>,
    sources: Vec<Source>,
    failures: Vec<Failure>,
}

/// Asks `source` for `partitions`; `Err` carries the partitions to try elsewhere and why.
async fn ask(
    s: &HttpState,
    service: &SearchService,
    source: &Source,
    partitions: Vec<(String, i32)>,
    call: &PartialCall,
    req: &SearchRequest,
) -> Result<PartialAnswer, SearchError> {
    match source {
        Source::Local => {
            let (partial, missing) = service
                .partial(partitions, req.clone(), call.count, !call.fetch_later)
                .await?;
            Ok(PartialAnswer { partial, missing })
        }
        Source::Node { addr, .. } => {
            let call = PartialCall {
                partitions,
                params: call.params.clone(),
                body: call.body.clone(),
                count: call.count,
                fetch_later: call.fetch_later,
            };
            call_node(s, service, addr, PARTIAL_PATH, &call).await
        }
    }
}

/// Posts `call` to another node's internal search `path` and reads its JSON answer; an
/// answer other than 200 is that node's error.
async fn call_node<C: Serialize, A: serde::de::DeserializeOwned>(
    s: &HttpState,
    service: &SearchService,
    addr: &str,
    path: &str,
    call: &C,
) -> Result<A, SearchError> {
    let body = serde_json::to_vec(call).map_err(|e| SearchError::Index {
        reason: e.to_string(),
    })?;
    // A node needs up to its own time limit after waiting for a slot up to its queue limit;
    // allow for the trip on top.
    let limit = service.queue_timeout() + service.query_timeout() + Duration::from_secs(2);
    let answer = peer::post_json(s.peer_tls(), addr, path, body, s.token(), limit)
        .await
        .map_err(|e| SearchError::Index {
            reason: e.to_string(),
        })?;
    if answer.status != 200 {
        return Err(remote_error(answer.status, &answer.body));
    }
    serde_json::from_slice(&answer.body).map_err(|e| SearchError::Index {
        reason: format!("node at {addr} answered something unreadable: {e}"),
    })
}

/// The error another node answered, kept as the client's error when it is about the request.
fn remote_error(status: u16, body: &[u8]) -> SearchError {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let reason = v["error"]["reason"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    if status == 400 {
        SearchError::illegal(reason)
    } else {
        SearchError::Index {
            reason: format!("another node answered {status}: {reason}"),
        }
    }
}

/// Runs a search over every planned partition, each on the first source that answers, and
/// merges. Partitions no source could answer are listed as shard failures.
async fn gather(
    s: &HttpState,
    service: &SearchService,
    plan: Vec<PlannedPartition>,
    call: &PartialCall,
    req: &SearchRequest,
) -> Result<Gathered, SearchError> {
    let mut gathered = Gathered {
        partials: Vec::new(),
        sources: Vec::new(),
        failures: Vec::new(),
    };
    let mut pending: Vec<Attempt> = plan
        .into_iter()
        .map(|partition| Attempt {
            partition,
            next: 0,
            last: None,
        })
        .collect();
    while !pending.is_empty() {
        let mut by_source: Vec<(Source, Vec<Attempt>)> = Vec::new();
        for a in pending.drain(..) {
            let Some(source) = a.partition.sources.get(a.next).cloned() else {
                let p = a.partition;
                let (node, reason) = a.last.unwrap_or((
                    None,
                    "no live replica of this partition has a search index".to_owned(),
                ));
                gathered.failures.push(Failure {
                    topic: p.topic,
                    partition: p.partition,
                    node,
                    reason,
                });
                continue;
            };
            match by_source.iter_mut().find(|(s, _)| *s == source) {
                Some((_, v)) => v.push(a),
                None => by_source.push((source, vec![a])),
            }
        }
        let calls = by_source.into_iter().map(|(source, parts)| async move {
            let names = parts
                .iter()
                .map(|a| (a.partition.topic.clone(), a.partition.partition))
                .collect();
            let result = ask(s, service, &source, names, call, req).await;
            (source, parts, result)
        });
        for (source, parts, result) in futures::future::join_all(calls).await {
            let node = match &source {
                Source::Local => None,
                Source::Node { id, .. } => Some(*id),
            };
            match result {
                Ok(mut answer) => {
                    let at = gathered.partials.len();
                    for h in &mut answer.partial.hits {
                        h.answer = at;
                    }
                    gathered.partials.push(answer.partial);
                    gathered.sources.push(source.clone());
                    for a in parts {
                        let p = &a.partition;
                        if answer
                            .missing
                            .iter()
                            .any(|(t, n)| *t == p.topic && *n == p.partition)
                        {
                            pending.push(Attempt {
                                next: a.next + 1,
                                last: Some((node, "the node has no index for it (yet)".into())),
                                partition: a.partition,
                            });
                        }
                    }
                }
                // A bad request is the client's to see, whichever node noticed it.
                Err(e @ (SearchError::BadRequest { .. } | SearchError::Timeout(_))) => {
                    return Err(e)
                }
                Err(e) => {
                    tracing::debug!(?source, error = %e, "a search source failed; trying the next");
                    let why = e.to_string();
                    pending.extend(parts.into_iter().map(|a| Attempt {
                        next: a.next + 1,
                        last: Some((node, why.clone())),
                        partition: a.partition,
                    }));
                }
            }
        }
    }
    Ok(gathered)
}

async fn run(
    s: Arc<HttpState>,
    topics: &str,
    params: HashMap<String, String>,
    body: Bytes,
    answer: Answer,
) -> Response {
    let service = match service(&s) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let started = Instant::now();
    let result = search_value(&s, &service, topics, params, &body, answer).await;
    service.observe(started, result.is_err());
    match result {
        Ok(mut v) => {
            if answer == Answer::Hits {
                v["took"] = Value::from(started.elapsed().as_millis() as u64);
            }
            Json(v).into_response()
        }
        Err(e) => error(e),
    }
}

/// Runs one search (or count) over the topics `topics` names, on whichever nodes answer
/// each partition, and merges: the answer's JSON (without `took`).
pub(crate) async fn search_value(
    s: &HttpState,
    service: &SearchService,
    topics: &str,
    params: HashMap<String, String>,
    body: &Bytes,
    answer: Answer,
) -> Result<Value, SearchError> {
    let req = request(&params, body)?;
    let preference = Preference::parse(params.get("preference").map(String::as_str));
    let plan = service.plan(topics, preference)?;
    let shards = plan.len();
    let call = PartialCall {
        partitions: Vec::new(),
        params,
        body: String::from_utf8_lossy(body).into_owned(),
        count: answer == Answer::Count,
        fetch_later: answer == Answer::Hits,
    };
    let gathered = gather(s, service, plan, &call, &req).await?;
    let failed = gathered.failures.len();
    if shards > 0 && failed == shards {
        let reasons: Vec<String> = gathered
            .failures
            .iter()
            .map(|f| format!("{}[{}]: {}", f.topic, f.partition, f.reason))
            .collect();
        return Err(SearchError::Unavailable(reasons.join("; ")));
    }
    let skipped: usize = gathered.partials.iter().map(|p| p.skipped).sum();
    let shard_info = json!({
        "total": shards,
        "successful": shards - failed,
        "skipped": skipped,
        "failed": failed,
        "failures": gathered.failures.iter().map(|f| json!({
            "index": f.topic,
            "shard": f.partition,
            "node": f.node.map(|n| n.to_string()),
            "reason": {"type": "search_phase_execution_exception", "reason": f.reason},
        })).collect::<Vec<_>>(),
    });
    let mut v = match answer {
        Answer::Count => json!({
            "count": gathered.partials.iter().map(|p| p.total).sum::<usize>(),
        }),
        Answer::Hits => {
            let mut merged = search::merge_page(gathered.partials, &req)?;
            fetch(s, service, &gathered.sources, &call, &req, &mut merged.page).await?;
            search::answer(merged, &req)
        }
    };
    if failed == 0 {
        // Elasticsearch lists failures only when there are some.
        v["_shards"] =
            json!({"total": shards, "successful": shards, "skipped": skipped, "failed": 0});
    } else {
        v["_shards"] = shard_info;
    }
    Ok(v)
}

/// The fetch phase: each hit of the final `page` is rendered by the source that found it
/// (this node, or another over [`FETCH_PATH`]). A node that fails now leaves its hits with
/// only their ids and sort values, as Elasticsearch answers hits whose fetch failed.
async fn fetch(
    s: &HttpState,
    service: &SearchService,
    sources: &[Source],
    call: &PartialCall,
    req: &SearchRequest,
    page: &mut [PartialHit],
) -> Result<(), SearchError> {
    let mut by_answer: Vec<(usize, Vec<usize>)> = Vec::new();
    for (i, h) in page.iter().enumerate() {
        match by_answer.iter_mut().find(|(a, _)| *a == h.answer) {
            Some((_, v)) => v.push(i),
            None => by_answer.push((h.answer, vec![i])),
        }
    }
    let calls = by_answer.into_iter().map(|(answer, at)| {
        let hits: Vec<PartialHit> = at.iter().map(|i| page[*i].clone()).collect();
        async move {
            let rendered = match sources.get(answer) {
                Some(Source::Local) => service.render(hits, req.clone()).await,
                Some(Source::Node { addr, .. }) => fetch_from(s, service, addr, call, hits).await,
                None => Err(SearchError::Index {
                    reason: "a hit of no answer".into(),
                }),
            };
            (at, rendered)
        }
    });
    for (at, rendered) in futures::future::join_all(calls).await {
        match rendered {
            Ok(hits) if hits.len() == at.len() => {
                for (i, h) in at.into_iter().zip(hits) {
                    page[i].hit = h.hit;
                }
            }
            Ok(_) => tracing::warn!("a node rendered another number of hits than asked"),
            Err(e @ SearchError::Timeout(_)) => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "rendering hits failed; they are answered without their records")
            }
        }
    }
    Ok(())
}

/// Asks the node at `addr` to render `hits` (its own partitions').
async fn fetch_from(
    s: &HttpState,
    service: &SearchService,
    addr: &str,
    call: &PartialCall,
    hits: Vec<PartialHit>,
) -> Result<Vec<PartialHit>, SearchError> {
    let call = FetchCall {
        params: call.params.clone(),
        body: call.body.clone(),
        hits,
    };
    call_node(s, service, addr, FETCH_PATH, &call).await
}

/// Another node's [`FetchCall`]: renders the hits of this node's partitions.
async fn fetch_call(State(s): State<Arc<HttpState>>, body: Bytes) -> Response {
    let service = match service(&s) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let call: FetchCall = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => return error(SearchError::parsing(format!("not a fetch call: {e}"))),
    };
    let req = match request(&call.params, &Bytes::from(call.body.into_bytes())) {
        Ok(r) => r,
        Err(e) => return error(e),
    };
    match service.render(call.hits, req).await {
        Ok(hits) => Json(hits).into_response(),
        Err(e) => error(e),
    }
}

/// Where a node asks another to search some of its partitions.
pub const PARTIAL_PATH: &str = "/_internal/search/partial";
/// Where a node asks another to render the hits of a final page that it found.
pub const FETCH_PATH: &str = "/_internal/search/fetch";
/// Where a node asks another for the fields its partitions mapped from the documents.
pub const MAPPING_PATH: &str = "/_internal/search/mapping";

/// The topics whose mappings a node asks another for.
#[derive(Serialize, Deserialize)]
struct MappingCall {
    /// A topic expression, as in `/{topics}/_mapping`.
    topics: String,
}

/// The mappings of the topics `expr` names, as `_mapping` and `_field_caps` answer them: in
/// a cluster every node maps only the partitions it holds, so the other live nodes' are
/// merged in (a node that does not answer leaves out only fields no one else mapped).
pub(crate) async fn topic_mappings(
    s: &HttpState,
    service: &SearchService,
    expr: &str,
) -> Result<Vec<(String, spate_search::mapping::TopicMapping)>, SearchError> {
    let mut all = service.mappings(expr)?;
    let peers = service.peers();
    if peers.is_empty() {
        return Ok(all);
    }
    let call = MappingCall {
        topics: expr.to_string(),
    };
    let call = &call;
    let asks = peers.iter().map(|addr| async move {
        let answer: Result<HashMap<String, std::collections::BTreeMap<String, String>>, _> =
            call_node(s, service, addr, MAPPING_PATH, &call).await;
        (addr, answer)
    });
    for (addr, answer) in futures::future::join_all(asks).await {
        let stored = match answer {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(%addr, error = %e, "a node did not answer its mapping");
                continue;
            }
        };
        for (topic, m) in &mut all {
            if let Some(theirs) = stored.get(topic.as_str()) {
                m.merge(&spate_search::mapping::TopicMapping::from_stored(theirs));
            }
        }
    }
    Ok(all)
}

/// Another node's [`MappingCall`]: this node's own mappings, never asking further.
async fn mapping_call(State(s): State<Arc<HttpState>>, body: Bytes) -> Response {
    let service = match service(&s) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let call: MappingCall = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => return error(SearchError::parsing(format!("not a mapping call: {e}"))),
    };
    match service.mappings(&call.topics) {
        Ok(all) => {
            let stored: HashMap<String, std::collections::BTreeMap<String, String>> = all
                .into_iter()
                .map(|(topic, m)| (topic, m.to_stored()))
                .collect();
            Json(stored).into_response()
        }
        Err(e) => error(e),
    }
}

/// Another node's [`PartialCall`]: searches the partitions named, never forwards further.
async fn partial_call(State(s): State<Arc<HttpState>>, body: Bytes) -> Response {
    let service = match service(&s) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let call: PartialCall = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return error(SearchError::parsing(format!(
                "not a partial search call: {e}"
            )))
        }
    };
    let req = match request(&call.params, &Bytes::from(call.body.into_bytes())) {
        Ok(r) => r,
        Err(e) => return error(e),
    };
    let render = !call.fetch_later;
    match service
        .partial(call.partitions, req, call.count, render)
        .await
    {
        Ok((partial, missing)) => Json(PartialAnswer { partial, missing }).into_response(),
        Err(e) => error(e),
    }
}

async fn search(
    State(s): State<Arc<HttpState>>,
    Path(topics): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    run(s, &topics, params, body, Answer::Hits).await
}

async fn search_all(
    State(s): State<Arc<HttpState>>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    run(s, "_all", params, body, Answer::Hits).await
}

async fn count(
    State(s): State<Arc<HttpState>>,
    Path(topics): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    run(s, &topics, params, body, Answer::Count).await
}

async fn count_all(
    State(s): State<Arc<HttpState>>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    run(s, "_all", params, body, Answer::Count).await
}
