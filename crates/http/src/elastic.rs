//! The Elasticsearch endpoints that tools call around `_search`: `GET /` (who answers, with a
//! version Grafana and the official clients accept), `GET /_cluster/health` (Grafana's data
//! source test), `_msearch` (NDJSON; every Grafana query goes through it), `_mapping` and
//! `_field_caps` (the fields query editors offer). Every answer of the search side carries
//! `X-Elastic-Product: Elasticsearch`, which the official clients check.
//!
//! The request shapes follow Grafana's Elasticsearch data source; the fixtures in
//! crates/search/tests/fixtures/grafana/ name the Grafana source each comes from.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde_json::{json, Value};
use spate_search::mapping::{field_caps, TopicMapping};
use spate_search::SearchError;

use crate::search::{search_value, Answer};
use crate::HttpState;

/// The Elasticsearch version spate reports: 8.x, so Grafana offers its current feature set
/// (it warns below 7.16 and hides what 8 removed).
pub const REPORTED_VERSION: &str = "8.15.0";

/// Routes of this module.
pub fn routes() -> Router<Arc<HttpState>> {
    Router::new()
        .route("/", get(root).head(root))
        .route("/_cluster/health", get(health))
        .route("/_cluster/health/{index}", get(health_of))
        .route("/_msearch", get(msearch_all).post(msearch_all))
        .route("/{index}/_msearch", get(msearch).post(msearch))
        .route("/_mapping", get(mapping_all))
        .route("/{index}/_mapping", get(mapping))
        .route("/_field_caps", get(field_caps_all).post(field_caps_all))
        .route(
            "/{index}/_field_caps",
            get(field_caps_of).post(field_caps_of),
        )
}

/// Paths of this module a client may POST without the admin token (they only read).
pub fn is_read_path(path: &str) -> bool {
    !path.starts_with("/admin/") && (path.ends_with("/_msearch") || path.ends_with("/_field_caps"))
}

/// Paths that only need an authenticated user, no ACL: they tell nothing about topics.
pub fn is_open_to_users(path: &str) -> bool {
    path == "/" || path == "/_cluster/health"
}

/// Adds `X-Elastic-Product: Elasticsearch` to answers of Elasticsearch-style paths.
pub async fn product_header(req: Request, next: Next) -> Response {
    let elastic = is_elastic_path(req.uri().path());
    let mut resp = next.run(req).await;
    if elastic {
        resp.headers_mut().insert(
            "x-elastic-product",
            HeaderValue::from_static("Elasticsearch"),
        );
    }
    resp
}

fn is_elastic_path(path: &str) -> bool {
    path == "/"
        || path.starts_with("/_cluster/")
        || ["_search", "_count", "_msearch", "_mapping", "_field_caps"]
            .iter()
            .any(|e| path.ends_with(&format!("/{e}")))
}

fn error(e: SearchError) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
    (status, Json(e.to_json())).into_response()
}

fn not_running() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"error": {"root_cause": [{"type": "unavailable", "reason": "search is not running yet"}], "type": "unavailable", "reason": "search is not running yet"}, "status": 503})),
    )
        .into_response()
}

async fn root(State(s): State<Arc<HttpState>>) -> Response {
    let (name, uuid) = match s.broker() {
        Ok(b) => (format!("spate-{}", b.config.node_id), b.cluster_id.clone()),
        Err(_) => ("spate".to_string(), String::new()),
    };
    Json(json!({
        "name": name,
        "cluster_name": "spate",
        "cluster_uuid": uuid,
        "version": {
            "number": REPORTED_VERSION,
            "build_flavor": "default",
            "build_type": "spate",
            "build_hash": env!("CARGO_PKG_VERSION"),
            "build_date": "2024-08-05T10:05:34.233336849Z",
            "build_snapshot": false,
            "lucene_version": "9.11.1",
            "minimum_wire_compatibility_version": "7.17.0",
            "minimum_index_compatibility_version": "7.0.0",
        },
        "tagline": "You Know, for Search",
    }))
    .into_response()
}

async fn health(State(s): State<Arc<HttpState>>) -> Response {
    cluster_health(&s, "_all")
}

async fn health_of(State(s): State<Arc<HttpState>>, Path(index): Path<String>) -> Response {
    cluster_health(&s, &index)
}

/// Green when every searchable partition can be answered, red when some cannot (an
/// unassigned shard, in Elasticsearch's words).
fn cluster_health(s: &HttpState, expr: &str) -> Response {
    let Some(service) = s.search() else {
        return not_running();
    };
    let (total, answered) = match service.coverage(expr) {
        Ok(x) => x,
        Err(e) => return error(e),
    };
    let nodes = s
        .broker()
        .ok()
        .and_then(|b| b.cluster().map(|c| c.image().live_brokers().count()))
        .unwrap_or(1);
    let status = if answered == total { "green" } else { "red" };
    let percent = if total == 0 {
        100.0
    } else {
        answered as f64 * 100.0 / total as f64
    };
    Json(json!({
        "cluster_name": "spate",
        "status": status,
        "timed_out": false,
        "number_of_nodes": nodes,
        "number_of_data_nodes": nodes,
        "active_primary_shards": answered,
        "active_shards": answered,
        "relocating_shards": 0,
        "initializing_shards": 0,
        "unassigned_shards": total - answered,
        "delayed_unassigned_shards": 0,
        "number_of_pending_tasks": 0,
        "number_of_in_flight_fetch": 0,
        "task_max_waiting_in_queue_millis": 0,
        "active_shards_percent_as_number": percent,
    }))
    .into_response()
}

async fn mapping_all(State(s): State<Arc<HttpState>>) -> Response {
    mappings(&s, "_all").await
}

async fn mapping(State(s): State<Arc<HttpState>>, Path(index): Path<String>) -> Response {
    mappings(&s, &index).await
}

async fn topic_mappings(
    s: &HttpState,
    expr: &str,
) -> Result<Vec<(String, TopicMapping)>, Box<Response>> {
    let Some(service) = s.search() else {
        return Err(Box::new(not_running()));
    };
    crate::search::topic_mappings(s, &service, expr)
        .await
        .map_err(|e| Box::new(error(e)))
}

async fn mappings(s: &HttpState, expr: &str) -> Response {
    match topic_mappings(s, expr).await {
        Ok(all) => {
            let body: serde_json::Map<String, Value> = all
                .into_iter()
                .map(|(topic, m)| (topic, json!({"mappings": m.to_es()})))
                .collect();
            Json(Value::Object(body)).into_response()
        }
        Err(r) => *r,
    }
}

async fn field_caps_all(
    State(s): State<Arc<HttpState>>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    caps(&s, "_all", &params, &body).await
}

async fn field_caps_of(
    State(s): State<Arc<HttpState>>,
    Path(index): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    caps(&s, &index, &params, &body).await
}

/// `fields` from the URL (`?fields=a,b*`) or the body (`{"fields": [...]}`); none means all.
async fn caps(
    s: &HttpState,
    expr: &str,
    params: &HashMap<String, String>,
    body: &Bytes,
) -> Response {
    let mut wanted: Vec<String> = params
        .get("fields")
        .map(|f| f.split(',').map(|x| x.trim().to_string()).collect())
        .unwrap_or_default();
    if !body.iter().all(u8::is_ascii_whitespace) {
        match serde_json::from_slice::<Value>(body) {
            Ok(v) => {
                if let Some(list) = v["fields"].as_array() {
                    wanted.extend(list.iter().filter_map(Value::as_str).map(str::to_string));
                }
            }
            Err(e) => {
                return error(SearchError::BadRequest {
                    kind: "x_content_parse_exception",
                    reason: format!("the request body is not valid JSON: {e}"),
                })
            }
        }
    }
    match topic_mappings(s, expr).await {
        Ok(all) => {
            let indices: Vec<&String> = all.iter().map(|(t, _)| t).collect();
            Json(json!({"indices": indices, "fields": field_caps(&all, &wanted)})).into_response()
        }
        Err(r) => *r,
    }
}

async fn msearch_all(
    State(s): State<Arc<HttpState>>,
    who: Option<Extension<crate::Caller>>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    run_msearch(s, None, params, &body, who.map(|w| w.0)).await
}

async fn msearch(
    State(s): State<Arc<HttpState>>,
    who: Option<Extension<crate::Caller>>,
    Path(index): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    run_msearch(s, Some(index), params, &body, who.map(|w| w.0)).await
}

/// One search of an `_msearch`: the topics it names and its body.
struct Item {
    index: String,
    preference: Option<String>,
    body: Bytes,
}

/// Splits the NDJSON body into (header, body) pairs. A header names its `index` as a string
/// or a list (Grafana sends both); without one the path's index, else every topic.
fn parse_msearch(body: &[u8], default_index: Option<&str>) -> Result<Vec<Item>, SearchError> {
    let lines: Vec<&[u8]> = body
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .collect();
    if lines.is_empty() {
        return Err(SearchError::illegal(
            "_msearch needs a body: a header line and a search line per search",
        ));
    }
    if !lines.len().is_multiple_of(2) {
        return Err(SearchError::illegal(format!(
            "_msearch needs a header line and a search line per search; the body has {} lines",
            lines.len()
        )));
    }
    lines
        .chunks(2)
        .enumerate()
        .map(|(i, pair)| {
            let header: Value = serde_json::from_slice(pair[0]).map_err(|e| {
                SearchError::parsing(format!("header line of search {i} is not JSON: {e}"))
            })?;
            if !header.is_object() {
                return Err(SearchError::parsing(format!(
                    "header line of search {i} must be an object"
                )));
            }
            let index = match &header["index"] {
                Value::String(s) => s.clone(),
                Value::Array(list) => list
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(","),
                Value::Null => default_index.unwrap_or("_all").to_string(),
                other => {
                    return Err(SearchError::parsing(format!(
                        "[index] of search {i} must be a string or a list, not {other}"
                    )))
                }
            };
            Ok(Item {
                index,
                preference: header["preference"].as_str().map(str::to_string),
                body: Bytes::copy_from_slice(pair[1]),
            })
        })
        .collect()
}

async fn run_msearch(
    s: Arc<HttpState>,
    index: Option<String>,
    params: HashMap<String, String>,
    body: &Bytes,
    who: Option<crate::Caller>,
) -> Response {
    let Some(service) = s.search() else {
        return not_running();
    };
    let started = Instant::now();
    let items = match parse_msearch(body, index.as_deref()) {
        Ok(items) => items,
        Err(e) => return error(e),
    };
    // Each search answers on its own, in order: one failing does not fail the others.
    let searches = items.into_iter().map(|item| {
        let s = s.clone();
        let service = service.clone();
        let who = who.clone();
        let mut p: HashMap<String, String> = HashMap::new();
        if let Some(pref) = item
            .preference
            .or_else(|| params.get("preference").cloned())
        {
            p.insert("preference".into(), pref);
        }
        async move {
            if let Some(refused) = who.as_ref().and_then(|c| c.refuses_read(&s, &item.index)) {
                return refused;
            }
            let one = Instant::now();
            let result = search_value(&s, &service, &item.index, p, &item.body, Answer::Hits).await;
            service.observe(one, result.is_err());
            match result {
                Ok(mut v) => {
                    v["took"] = Value::from(one.elapsed().as_millis() as u64);
                    v["status"] = Value::from(200);
                    v
                }
                Err(e) => e.to_json(),
            }
        }
    });
    let responses = futures::future::join_all(searches).await;
    Json(json!({
        "took": started.elapsed().as_millis() as u64,
        "responses": responses,
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grafana_msearch_bodies_split_into_searches() {
        let body = include_bytes!(
            "../../search/tests/fixtures/grafana/msearch_metrics_date_histogram_avg.ndjson"
        );
        let items = parse_msearch(body, None).unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].index, "logs");
        let terms = include_bytes!("../../search/tests/fixtures/grafana/msearch_terms.ndjson");
        assert_eq!(parse_msearch(terms, None).unwrap().len(), 2);
    }

    #[test]
    fn an_index_list_joins_and_a_missing_one_takes_the_paths() {
        let body = b"{\"index\":[\"a\",\"b\"]}\n{}\n{}\n{\"size\":0}\n";
        let items = parse_msearch(body, Some("logs-*")).unwrap();
        assert_eq!(items[0].index, "a,b");
        assert_eq!(items[1].index, "logs-*");
        assert_eq!(&items[1].body[..], b"{\"size\":0}");
    }

    #[test]
    fn odd_or_malformed_bodies_are_refused_with_the_reason() {
        let e = parse_msearch(b"{}\n", None).err().unwrap();
        assert!(e.to_string().contains("1 lines"), "{e}");
        let e = parse_msearch(b"[]\n{}\n", None).err().unwrap();
        assert!(e.to_string().contains("object"), "{e}");
        let e = parse_msearch(b"{\"index\":3}\n{}\n", None).err().unwrap();
        assert!(e.to_string().contains("string or a list"), "{e}");
        assert!(parse_msearch(b"", None).is_err());
    }
}
